"""The streaming build's vocabulary: term -> id in order of first appearance (#27 item 3).

Why a module of its own: the ids of an Arrow batch's tokens are found two ways, and both
must number new terms identically (first seen first, across batches of either kind):

* compiled (numba): one pass over the tokens' UTF-8 bytes through an open-addressing table
  (``refresh.stream_kernels.encode``), no lock held, so it runs beside the thread that turns
  the next batch into Arrow. Measured at 1M synthetic documents it is ~3x faster than
* Arrow (no numba): ``dictionary_encode`` of the batch, the batch's distinct terms looked up
  in C against the known terms (``pyarrow.compute.index_in``), then one gather.

Python token lists that Arrow cannot hold (lone surrogates) add their terms to the dict
directly; both lookups take in the dict's newer terms (as surrogatepass bytes, which no
valid UTF-8 token matches) before their next batch.
"""

from __future__ import annotations

import itertools
from itertools import islice
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def string_buffers(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(UTF-8 bytes, offsets [len + 1]) of a string or large_string array, zero-copy."""
    _validity, offs_buf, data_buf = values.buffers()
    dtype = np.int64 if pa.types.is_large_string(values.type) or pa.types.is_large_binary(values.type) else np.int32
    offs = np.frombuffer(offs_buf, dtype)[values.offset:values.offset + len(values) + 1]
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return data, offs


class TermIds(dict[str, int]):
    """term -> id in first-seen order, and the same terms as the lookups' structures.

    ``_known`` (Arrow binary array) serves ``lookup``; ``_table``/``_hash``/``_bytes``/
    ``_boffs`` (the compiled table: slots, per-term hash, bytes, byte offsets) serve
    ``encode``; each catches up with the dict's newer terms when next used.
    """

    def __init__(self) -> None:
        super().__init__()
        self._known = pa.array([], pa.binary())
        self._table = np.full(1 << 12, -1, np.int32)
        self._hash = np.zeros(1 << 11, np.uint64)
        self._bytes = np.zeros(1 << 16, np.uint8)
        self._boffs = np.zeros((1 << 11) + 1, np.int64)
        self._n = 0  # terms in the compiled table

    def lookup(self, dictionary: pa.Array) -> np.ndarray:
        """Term ids (int32) of an Arrow batch's distinct terms, in its order of first
        appearance; new terms get the next ids in that order."""
        if len(self._known) < len(self):  # terms added since by other batches
            extra = [t.encode("utf-8", "surrogatepass") for t in islice(self, len(self._known), None)]
            self._known = pa.concat_arrays([self._known, pa.array(extra, pa.binary())])
        as_bytes = dictionary.cast(pa.binary())
        lut = pc.index_in(as_bytes, value_set=self._known).fill_null(-1).to_numpy().astype(np.int32)
        new = np.flatnonzero(lut < 0)
        if len(new):
            base = len(self)
            take = pa.array(new)
            self.update(zip(dictionary.take(take).to_pylist(), range(base, base + len(new)), strict=True))
            lut[new] = np.arange(base, base + len(new), dtype=np.int32)
            self._known = pa.concat_arrays([self._known, as_bytes.take(take)])
        return lut

    def binary(self) -> pa.Array:
        """Every term by id as UTF-8 (surrogatepass) bytes, an Arrow binary array: the
        compiled table's bytes without a copy when it holds every term, else ``_known``
        caught up (what the build sorts the terms with, ``format.raw_order``)."""
        n = len(self)
        if n and self._n == n:
            return pa.LargeBinaryArray.from_buffers(pa.large_binary(), n, [
                None, pa.py_buffer(self._boffs[:n + 1]), pa.py_buffer(self._bytes[:int(self._boffs[n])])])
        if len(self._known) < n:
            extra = [t.encode("utf-8", "surrogatepass") for t in islice(self, len(self._known), None)]
            self._known = pa.concat_arrays([self._known, pa.array(extra, pa.binary())])
        return self._known

    def encode(self, values: pa.Array, kernels: dict[str, Any]) -> np.ndarray:
        """Term id (int32) of every token of a string array, new terms numbered in order of
        first appearance: compiled when ``kernels`` has ``encode``, else through Arrow."""
        if kernels.get("encode") is None:
            enc = values.dictionary_encode()
            return self.lookup(enc.dictionary)[enc.indices.to_numpy()]
        if self._n < len(self):  # terms added since by Python batches
            extra = [t.encode("utf-8", "surrogatepass") for t in islice(self, self._n, None)]
            self._insert(pa.array(extra, pa.binary()), kernels)
        base = self._n
        ids = self._insert(values, kernels)
        if self._n > base:
            raw = self._bytes[self._boffs[base]:self._boffs[self._n]].tobytes()
            cuts = (self._boffs[base:self._n + 1] - self._boffs[base]).tolist()
            self.update(zip((raw[a:b].decode("utf-8") for a, b in itertools.pairwise(cuts)),
                            range(base, self._n), strict=True))
        return ids

    def _insert(self, values: pa.Array, kernels: dict[str, Any]) -> np.ndarray:
        """Ids of ``values`` through the compiled table, growing it as the kernel asks."""
        n_tok = len(values)
        out = np.empty(n_tok, np.int32)
        if not n_tok:
            return out
        data, offs = string_buffers(values)
        i = 0
        while True:
            i, self._n = kernels["encode"](data, offs, i, n_tok, self._table, self._hash, self._bytes, self._boffs,
                                           self._n, out)
            if i >= n_tok:
                return out
            self._grow(int(offs[i + 1] - offs[i]), kernels)

    def _grow(self, need_bytes: int, kernels: dict[str, Any]) -> None:
        """Room for one more term of ``need_bytes`` bytes (each array doubled as needed)."""
        n = self._n
        if n + 2 > len(self._boffs):
            self._hash = np.concatenate([self._hash, np.zeros(len(self._hash), np.uint64)])
            self._boffs = np.concatenate([self._boffs, np.zeros(len(self._boffs) - 1, np.int64)])
        used = int(self._boffs[n])
        if used + need_bytes > len(self._bytes):
            grown = np.zeros(max(2 * len(self._bytes), used + need_bytes), np.uint8)
            grown[:used] = self._bytes[:used]
            self._bytes = grown
        if 2 * (n + 1) > len(self._table):
            self._table = np.full(2 * len(self._table), -1, np.int32)
            kernels["rehash"](self._hash, n, self._table)
