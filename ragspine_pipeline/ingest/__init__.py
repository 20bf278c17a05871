"""Ingest: file parsers and the document reader (below both ``corpus`` and ``warehouse``).

Both the engine-only path (``corpus.load_library``) and the pipeline's ``raw_documents``
step read files through this package, so there is one implementation of parsing,
metadata and label resolution, and neither of those packages imports the other.
"""

from .documents import CorpusError, Document, DocumentError, read_document
from .parsers import SUFFIXES, ParsedFile, ParseError, parse_file, parse_source

__all__ = ["SUFFIXES", "CorpusError", "Document", "DocumentError", "ParseError", "ParsedFile", "parse_file",
           "parse_source", "read_document"]
