"""Where a shard reads its part of the dense vectors (it holds only its own rows).

Why a separate record: the shard actor is created with it (a plain, picklable value that
travels to whichever node runs the shard) and reads its rows there, so no vector matrix
passes through the front or the object store.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from ..retrieval.vector.published import open_vectors
from ..warehouse.common import EMBEDDINGS
from ..warehouse.embeddings_step import vector_file
from ..warehouse.served_refresh import aligned_rows
from ..warehouse.versioned import VersionedTables


@dataclass(frozen=True)
class VectorSource:
    """Where a shard reads its part of the dense vectors.

    ``npy``: unit vectors of the whole corpus in position order (mapped; the shard copies
    its rows). ``warehouse``/``library``/``version``: the published embeddings version: its
    vector file (``retrieval/vector/published``, mapped: the shard reads only its own rows'
    pages) when the file's rows at the shard's positions are its chunks, else the table,
    rows matched by chunk id (the newest row of an id wins, as in ``load_snapshot_index``).
    Either way the same unit float32 bits.
    """

    npy: str | None = None
    warehouse: str | None = None
    library: str | None = None
    version: str | None = None

    def rows(self, positions: np.ndarray, chunk_ids: Sequence[str]) -> np.ndarray:
        if self.npy is not None:
            return np.asarray(np.load(self.npy, mmap_mode="r")[positions], dtype=np.float32)
        wh = VersionedTables(Path(str(self.warehouse)))
        mapped = self._mapped(wh, positions, chunk_ids)
        if mapped is not None:
            return mapped
        table = aligned_rows(wh.read(EMBEDDINGS, str(self.library), "vectors", self.version),
                         pa.array(list(chunk_ids), pa.string()), f"shard vectors of {self.library}")
        vec = table.column("vector").combine_chunks()
        dim = len(vec[0]) if len(vec) else 0
        flat = vec.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
        mat = flat.reshape(len(vec), dim)
        norms = np.linalg.norm(mat, axis=1, keepdims=True)  # as HybridRetriever.preload_vectors
        return (mat / np.where(norms == 0, 1, norms)).astype(np.float32)

    def _mapped(self, wh: VersionedTables, positions: np.ndarray, chunk_ids: Sequence[str]) -> np.ndarray | None:
        """The shard's rows from the version's vector file, or None (no file, or its rows at
        ``positions`` are not these chunks: the corpus it was written for is not this one)."""
        path = vector_file(wh.get(EMBEDDINGS, str(self.library), self.version).path)
        if path is None:
            return None
        pv = open_vectors(path)
        pos = np.asarray(positions, np.int64)
        if len(pos) and (int(pos.min()) < 0 or int(pos.max()) >= len(pv)):
            return None
        if pv.ids_at(pos) != list(chunk_ids):
            return None
        return pv.unit_rows(pos)


__all__ = ["VectorSource"]
