"""The lexical channel, in sub-packages named for what they hold (docs/layers/lexical.md,
"Where the code is"):

- ``analysis``: the analyzer and tokenizer, Unicode script classes, stop words, the glossary
  query rewriter;
- ``index``: ``BM25Index`` and ``PackedBM25Index``, the memory-mapped opener, filters,
  top-k selection and the readable reference formula (``index.reference``);
- ``kernels``: the compiled numba kernels and their loader;
- ``format``: the published file's layout and checks, its memory mapping, raw postings;
- ``refresh``: publishing, the streaming build, incremental merge, segments and stacks.

``retrieval`` is the spec's door (one import for the default loop: ``BM25Index``,
``HybridRetriever``, ``rrf_fuse``, ...); ``predicates`` is the old path of the filter
predicates. The hybrid retriever and rank fusion live in ``retrieval.hybrid``.
"""

from .kernels.kernel_cache import ensure_fresh

# Before any kernel is loaded from numba's cache: drop cached kernels older than the sources.
ensure_fresh()
