"""The numba kernels of ``kernels.loader`` (see its docstring for what each one does).

Split by route: shared heap/selection helpers (``kernels.selection``), the unfiltered route
(``kernels.plain_unfiltered``) and the filtered route (``kernels.plain_filtered``). They are
module-level functions because numba caches compiled machine code on disk
(``cache=True``) only for those, so the kernels compile once per machine, not on every
process start. Importing this module needs numba; nothing is compiled until a kernel is
first called. This module keeps every name importable from its old path.
"""

from .plain_filtered import search_filtered
from .plain_unfiltered import _BLOCK, _exhaustive, _unique_terms, search_batch, search_one
from .selection import (
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

__all__ = [
    "_BLOCK", "_SLACK", "_distinct", "_drain", "_exhaustive", "_gallop",
    "_kth_score", "_prune", "_push", "_sift_down", "_take_top", "_unique_terms", "_worse",
    "search_batch", "search_filtered", "search_one",
]
