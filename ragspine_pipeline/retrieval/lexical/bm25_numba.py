"""The numba kernels of ``bm25_kernel`` (see its docstring for what each one does).

Split by route: shared heap/selection helpers (``bm25_numba_select``), the unfiltered route
(``bm25_numba_unfiltered``) and the filtered route (``bm25_numba_filtered``). They are
module-level functions because numba caches compiled machine code on disk
(``cache=True``) only for those, so the kernels compile once per machine, not on every
process start. Importing this module needs numba; nothing is compiled until a kernel is
first called. This module keeps every name importable from its old path.
"""

from .bm25_numba_filtered import search_filtered
from .bm25_numba_select import (
    _SLACK,
    _distinct,
    _drain,
    _gallop,
    _kth_score,
    _prune,
    _push,
    _sift_down,
    _take_top,
    _worse,
)
from .bm25_numba_unfiltered import _BLOCK, _exhaustive, _unique_terms, search_batch, search_one

__all__ = [
    "_BLOCK", "_SLACK", "_distinct", "_drain", "_exhaustive", "_gallop",
    "_kth_score", "_prune", "_push", "_sift_down", "_take_top", "_unique_terms", "_worse",
    "search_batch", "search_filtered", "search_one",
]
