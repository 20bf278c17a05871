"""The compiled (numba) BM25 kernels, their loader (``loader``) and numba's start-up and on-disk cache upkeep. Nothing here imports the index classes: the kernels take arrays."""
