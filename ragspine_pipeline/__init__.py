"""RAGSpine engine: chunking, versioned chunk store, BM25 + dense retrieval, cited snippets.

The engine is plain Python + numpy and never imports Dagster, so notebooks, the CLI and
other orchestrators can use it directly.
"""

__version__ = "0.1.0"
