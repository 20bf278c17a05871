"""``PackedBM25Index``: the query API of ``BM25Index`` over a memory-mapped packed file.

Why a class of its own (composed, not a ``BM25Index`` subclass): the packed layout has no
per-posting weight array for the plain kernels to read; its kernels
(``kernels.packed``) unpack blocks and recompute each weight exactly, so the answers
are the plain layout's, bit for bit. ``index.mapped.open_index`` returns this class for a
file whose TOC says ``"layout": "packed"``; everything that opens an index
(``warehouse/lexical_files``, ``refresh.segments.open_segments``) gets it without a change.

Integrity is the plain reader's: header, footer, TOC and checksum table at open; a term's
per-term entries, block entries and packed words the first time the vocabulary resolves
it (checksums, then the structure: widths, offsets, positions below N, skip data), the
document lengths before the first query (every query reads them to recompute weights).
Without numba (or ``kernel="numpy"``) a query decodes its terms with numpy and runs the
plain numpy path (``index.numpy_search``) over them: slower, the same answers as a plain index's
numpy path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ....cpus import usable_cpus
from ..format.file import CorruptIndexError
from ..format.mapfile import MappedDocIds, MappedFile
from ..format.raw import RawPostings
from ..format.vocab_fc import vocab_names
from ..kernels import loader as bm25_kernel
from ..kernels.filter_stats import sliced_total
from ..kernels.loader import KernelLoader
from . import filter as bm25_filter
from . import numpy_search as bm25_numpy
from .base import IndexBase
from .bm25 import EXHAUSTIVE_MAX_DOCS, KERNELS, MAXSCORE_MIN_DOCS, candidate_mask
from .corpus_stats import CorpusStats
from .packed import (
    BLOCK_ARRAYS,
    OLD_TERM_ARRAYS,
    OPTIONAL_ARRAYS,
    PACKED_ARRAYS,
    PAD_WORDS,
    PackedArrays,
    check_blocks,
    decode_term,
    encode,
    norm_of,
    w_of,
)
from .packed_filter_support import PackedFilterSupport
from .packed_narrow import postings_pointers, term_dfs, term_wmax
from .packed_tables import (
    bit_row,
    bit_terms_of,
    idf_table,
    narrowed,
    pk_tuple,
    readonly,
    stored_idf_arrays,
    term_idf,
    wmax_tuple,
)
from .packed_verify import verify_packed
from .packed_views import PostingsView, QueryPostings
from .pool import (
    POSTINGS_PER_THREAD,
    BatchArrays,
    batch_one_by_one,
    empty_batch,
    run_batch,
)
from .postings import BLOCK_SIZE
from .stats_query import NO_STACK, StackArgs
from .topk import DENSE, ScoredDocs, empty_scored, top_k, top_k_dense

_TABLE_MAX = 1 << 20  # longest document length the weight tables cover (8 MiB each at most)
def _load_family() -> tuple[Any, Any, Any]:
    """The packed family: its kernels (``kernels.packed``), the filtered route
    (``index.packed_filter_search``) and the unfiltered route (``kernels.packed_route``)."""
    # lazy: the packed family's numba kernels (~45 ms of import, loaded at the first packed
    # file's open; without numba the loader falls back to the numpy path)
    from ..kernels import packed as kernels
    from ..kernels import packed_route
    from . import packed_filter_search  # imports kernels.packed_filtered

    return kernels, packed_filter_search, packed_route


# Load once, warm once per (length-code dtype, compact-length dtype), numpy path on failure:
# the one loader every kernel family shares (``kernels.loader.KernelLoader``).
_PACKED: KernelLoader[tuple[Any, Any, Any]] = KernelLoader(_load_family, lambda fam, key: _warm(*fam, *key))


def load_packed_kernels(code: np.dtype | None = None, lengths: np.dtype | None = None) -> Any:
    """The compiled packed kernels (``kernels.packed``; its filtered route is
    ``index.packed_filter_search``), warmed for the length-code dtype ``code`` of the file
    being opened (``doc_code``, or ``doc_len`` without codes) and the dtype ``lengths`` of
    its compact lengths (``index.filter.compact_dtype``), or None without numba.

    Why per dtype: every entry point compiles once per dtype of the length codes (and the
    filtered one per width of the lengths), and a cold compile of all of them costs about
    a minute per dtype on 2 cores. A file warms only its own dtypes at open, so its first
    query never compiles, and a process that opens files of one kind never pays for (or
    loads) the others."""
    code = np.dtype(code if code is not None else np.uint8)
    lengths = np.dtype(lengths if lengths is not None else np.uint8)
    family = _PACKED.get((code, lengths))
    return None if family is None else family[0]


def _routes() -> tuple[Any, Any]:
    """(filtered, unfiltered) routes of the loaded family (only called once it loaded)."""
    family = _PACKED.kernels
    assert family is not None
    return family[1], family[2]


def _warm(kernels: Any, filtered: Any, unfiltered: Any, code: np.dtype, lengths: np.dtype) -> None:
    """Load (or compile) every entry point a query calls, for read-only arrays (what a
    mapping gives) on a tiny index whose per-document length codes have dtype ``code``
    (uint8/uint16 codes, or the lengths themselves) and whose compact lengths have dtype
    ``lengths``. Not ``kernels.packed.search_one`` (the route runs it compiled into
    its own code: no query calls its dispatcher, and loading it cost ~40 ms of a first
    open) nor ``check_all`` (``verify``, at publish: it loads there)."""
    raw = RawPostings(indptr=np.array([0, 2], np.int64), indices=np.array([0, 1], np.int32),
                      tf=np.array([1, 3], np.uint8), doc_len=np.array([1, 3], np.uint32), terms=["a"])
    enc = encode(raw, 1.5, 0.75)
    data = np.concatenate(list(enc.words()))
    idf = idf_table(np.diff(raw.indptr), enc.idf)
    arrays = {"data": data, "doc_len": raw.doc_len, **enc.blocks, **enc.term_arrays(),
              "bit_terms": np.array([0], np.int32), "bits": np.full((1, 1), 3, np.uint64)}
    # Codes index the 4-entry tables below; lengths (no codes) are the lengths themselves,
    # and so are the block min lengths (uint32, not uint16 codes).
    if code.itemsize < 4:
        arrays["doc_code"] = np.array([0, 1], code)
    else:
        arrays["blk_minlen"] = arrays["blk_minlen"].astype(np.uint32)
    arrays["code_len"] = np.array([1, 3], np.uint32)  # pk[8]: uint32 either way
    for a in (*arrays.values(), *idf):  # a mapped file's arrays are read-only
        a.setflags(write=False)
    w_max = wmax_tuple(arrays)
    q = np.zeros(1, np.int64)
    acc, touched = np.zeros(2), np.zeros(2, np.int32)
    norm = norm_of(np.arange(4), 1.5, 0.75, 2.0)
    wt = (norm, w_of(np.ones(4, np.int64), norm), 1.5, 0.75, 2.0)
    pk = pk_tuple(arrays, arrays["bit_terms"])
    for exhaustive in (0, 2):
        unfiltered.search_one(pk, idf, w_max, q, wt, 1, acc, touched, exhaustive)
    unfiltered.search_batch(pk, idf, w_max, q, np.array([0, 1], np.int64), wt, 1, 2, 0)
    filtered.warm(pk, wt, w_max, 2, lengths)
    # A dense mask's summed length (bm25_packed_filter_search._prepare_bits): not in its warm.
    sliced_total(np.zeros(1, np.uint64), np.zeros((1, 1), np.uint64))
    kernels.decode_term(pk, 0)  # a segment reads postings through it (bm25_segments)


class PackedFile(MappedFile):
    """The mapping of a packed file: a term's first use checks its blocks."""

    def packed(self) -> PackedArrays:
        a = self.arrays
        return PackedArrays(data=a["data"], bptr=a["bptr"], last_count=a["last_count"],
                            code_len=a["code_len"] if "doc_code" in a else None,
                            **{n: a[n] for n in BLOCK_ARRAYS})

    PER_TERM = ("idf", "bit_row")  # whichever its version holds (format 3: none)
    bit_terms: np.ndarray  # packed_tables.bit_terms_of, set by open_packed

    def _bit_row(self, t: int) -> int:
        """From the sorted bit-set terms, whatever the file's version (format 3 keeps no
        per-term row; its small tables are verified at open)."""
        return bit_row(self.bit_terms, t)

    def _check_term(self, t: int) -> None:
        """The packed layout: pointers in range, the bit-set row, the term's block arrays
        and packed words verified, then its blocks decoded in bounds (``check_blocks``)."""
        a = self.arrays
        if "indptr" in self.toc.arrays:  # formats 1-3 (their df also checked against bptr)
            s, e, b0, b1, row = self._term_pointers(t)
            ok = 0 <= s <= e and b1 - b0 == -(-(e - s) // BLOCK_SIZE)
        else:
            for name in ("bptr", "last_count"):
                self.elems(name, t, t + 1 + (name == "bptr"))
            for name in self.PER_TERM:
                if name in a:
                    self.elems(name, t, t + 1)
            b0, b1, row = int(a["bptr"][t]), int(a["bptr"][t + 1]), self._bit_row(t)
            if b1 - b0 > 1:  # its bound is in the multi-block table (a binary search reads it)
                self.whole("wmax_terms")
                self.whole("wmax_q")
            c = int(a["last_count"][t])
            ok = 1 <= c <= BLOCK_SIZE if b1 > b0 else c == 0
        if not (ok and 0 <= b0 <= b1 < len(a["blk_off"]) and -1 <= row < a["bits"].shape[0]):
            raise CorruptIndexError(self.path, f"postings pointers of term {t} are out of range")
        self._bits_row(row)
        for name in BLOCK_ARRAYS:
            self.elems(name, b0, b1 + (name == "blk_off"))
        if b0 > 0:
            self.elems("blk_last", b0 - 1, b0)
        w0, w1 = int(a["blk_off"][b0]), int(a["blk_off"][b1])
        if not 0 <= w0 <= w1 <= len(a["data"]) - PAD_WORDS:
            raise CorruptIndexError(self.path, f"packed words of term {t} lie outside the data")
        self.elems("data", w0, w1 + PAD_WORDS)
        problem = check_blocks(self.packed(), b0, b1, self.toc.n_docs, len(a["data"]))
        if problem is not None:
            raise CorruptIndexError(self.path, f"term {t}: {problem}")


class PackedBM25Index(MappedDocIds, IndexBase):
    """A packed BM25 file, memory-mapped (``open_packed``); ``BM25Index``'s query API."""

    path: Path
    n_terms: int
    n_docs: int
    k1: float
    b: float

    # ------------------------------------------------------------ shape
    @property
    def nbytes(self) -> int:
        """Bytes of the postings arrays (what the plain index's ``nbytes`` counts)."""
        a = self._file.arrays
        return int(sum(a[n].nbytes for n in (*PACKED_ARRAYS, *OPTIONAL_ARRAYS) if n in a))

    @property
    def _doc_len32(self) -> np.ndarray:
        """The document lengths (uint32, read-only): the file's, or for a format 3 file
        with length codes ``code_len[doc_code]``, built on the first use (the numpy path,
        filters given as positions, segments' statistics; compiled queries read codes)."""
        d = self.__dict__.get("_doc_len_arr")
        if d is None:
            a = self._file.arrays
            if "doc_len" in a:
                d = a["doc_len"]
            else:
                self._doc_lengths_read()
                d = readonly(np.asarray(a["code_len"][a["doc_code"]], np.uint32))
            d = self.__dict__.setdefault("_doc_len_arr", d)
        return d

    @property
    def doc_len(self) -> np.ndarray:
        return self._doc_len32

    @property
    def df(self) -> np.ndarray:
        a = self._file.arrays
        return term_dfs(a["bptr"], a["last_count"])

    @property
    def indptr(self) -> np.ndarray:
        """The plain postings pointers (int64 [T+1]): the file's (formats 1-3), or rebuilt
        from ``bptr`` and ``last_count`` on the first use (``PostingsView``, refresh, stack
        statistics; the kernels never read it)."""
        ip = self.__dict__.get("_indptr")
        if ip is None:
            a = self._file.arrays
            ip = a["indptr"] if "indptr" in a else readonly(postings_pointers(a["bptr"], a["last_count"]))
            ip = self.__dict__.setdefault("_indptr", ip)
        return ip

    def decode(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        """(doc positions, tf) of a verified term id."""
        if self._kernels is not None:
            return self._kernels.decode_term(self._pk, t)
        return decode_term(self._file.packed(), t)

    def term_postings(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        """(doc positions, tf) of term id ``t``, its blocks checked on first use."""
        self._file.verify_term(t)
        return self.decode(t)

    def filter_support(self) -> PackedFilterSupport:
        """The lazily built helpers of this index's filtered queries
        (``index.packed_filter_support``), created on the first filtered query;
        ``dict.setdefault`` is atomic: threads racing on the first query keep one."""
        sup = self.__dict__.get("_filter_support")
        if sup is None:
            sup = self.__dict__.setdefault("_filter_support",
                                           PackedFilterSupport(self._file.arrays, self.n_terms, self.doc_len,
                                                               self._file.bit_terms))
        return sup

    def _doc_lengths_read(self) -> None:
        """Before the first query: lengths (and length codes) verified, as every query reads them."""
        if not self._lengths_ok:
            f = self._file
            if "doc_len" in f.arrays:
                f.whole("doc_len")
                if int(self._doc_len32.sum(dtype=np.int64)) != self.total_len:
                    raise CorruptIndexError(self.path, "document lengths do not add up to the recorded total")
            if "doc_code" in f.arrays:
                f.whole("doc_code")
                f.whole("code_len")
                codes, lengths = f.arrays["doc_code"], f.arrays["code_len"]
                if len(codes) != self.n_docs or (self.n_docs and int(codes.max()) >= len(lengths)):
                    raise CorruptIndexError(self.path, "document length codes do not match the lengths")
                if "doc_len" in f.arrays:
                    if self.n_docs and not np.array_equal(lengths[codes], self._doc_len32):
                        raise CorruptIndexError(self.path, "document length codes do not match the lengths")
                elif int(np.bincount(codes, minlength=len(lengths)) @ lengths.astype(np.int64)) != self.total_len:
                    raise CorruptIndexError(self.path, "document lengths do not add up to the recorded total")
            self._lengths_ok = True

    def _weights(self) -> tuple[np.ndarray, np.ndarray, float, float, float]:
        """The kernels' ``wt``: per length code (or per length up to the longest, at most
        ``_TABLE_MAX``, for a file without codes) its norm and its w at tf 1, computed once
        with the build's formula (``norm_of`` / ``w_of``, so identical floats); then k1, b
        and the weights' avgdl."""
        wt = self._wt
        if wt is None:
            self._doc_lengths_read()
            if "doc_code" in self._file.arrays:  # tables by length code
                lengths = self._file.arrays["code_len"]
            else:  # tables by length, up to the longest document
                lengths = np.arange(min(int(self._doc_len32.max()) if self.n_docs else 0, _TABLE_MAX) + 1)
            norm = norm_of(lengths, self.k1, self.b, self._w_avgdl)
            wt = self._wt = (norm, w_of(np.ones(len(norm), np.int64), norm), self.k1, self.b, self._w_safe)
        return wt

    def _as_mask(self, candidates: np.ndarray | None) -> np.ndarray | None:
        self._doc_lengths_read()
        return None if candidates is None else candidate_mask(candidates, self.n_docs)

    # ------------------------------------------------------------ numpy path
    def _query_postings(self, term_ids: list[int]) -> tuple[QueryPostings, list[int]]:
        """The distinct query terms decoded (plain arrays) and the query's local term ids."""
        local: dict[int, int] = {}
        for t in term_ids:
            local.setdefault(t, len(local))
        terms = list(local)
        decoded = [self.decode(t) for t in terms]
        indptr = np.zeros(len(terms) + 1, np.int64)
        np.cumsum([len(d) for d, _ in decoded], out=indptr[1:])
        docs = np.concatenate([d for d, _ in decoded]) if decoded else np.zeros(0, np.int64)
        tf = np.concatenate([f for _, f in decoded]) if decoded else np.zeros(0, np.int64)
        norm = norm_of(self._doc_len32[docs], self.k1, self.b, self._w_avgdl)
        tids = np.asarray(terms, np.int64)
        a = self._file.arrays
        qp = QueryPostings(indptr=indptr, indices=docs.astype(np.int32), tf=tf, w=w_of(tf, norm),
                           df=np.diff(indptr), idf=term_idf(self._idf, np.diff(indptr), tids),
                           w_max=term_wmax(a["bptr"], a["blk_bmax"], a["wmax_terms"], a["wmax_q"], tids),
                           doc_len=self._doc_len32, n_docs=self.n_docs, avgdl=self.avgdl, k1=self.k1, b=self.b)
        return qp, [local[t] for t in term_ids]

    def _accumulate(self, query_tokens: Sequence[str], mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        qp, local = self._query_postings(self._query_term_ids(query_tokens))
        return bm25_numpy.accumulate(qp, local, mask)

    # ------------------------------------------------------------ search
    def search(self, query_tokens: Sequence[str], k: int = 10, candidates: Any = None, *,
               stats: CorpusStats | None = None) -> ScoredDocs:
        """Top-``k`` matching docs by (-score, position); only docs with score > 0.

        ``candidates`` (a filter): a bool mask over the index positions, the surviving
        positions (any order), or a ``PackedFilter``; ``stats``: a stack's statistics;
        both as ``BM25Index.search`` takes them."""
        if stats is not None:
            return self._stack_search(query_tokens, k, candidates, stats)
        if k > 0 and self._kernels is not None:  # any filter form, prepared without a pass over N
            return self._search_compiled(query_tokens, k, candidates)
        mask = self._as_mask(candidates)
        if k <= 0:
            return empty_scored()
        if mask is None:
            qp, local = self._query_postings(self._query_term_ids(query_tokens))
            pruned = bm25_numpy.maxscore(qp, local, k, MAXSCORE_MIN_DOCS)
            if pruned is not None:
                return pruned
            ids, sc = bm25_numpy.accumulate(qp, local, None)
        else:
            ids, sc = self._accumulate(query_tokens, mask)
        return top_k_dense(sc, k) if ids is DENSE else top_k(ids, sc, k)

    def _search_compiled(self, query_tokens: Sequence[str], k: int, candidates: Any) -> ScoredDocs:
        tids = self._compiled_terms(query_tokens, candidates)
        if tids is None:
            return empty_scored()
        if candidates is None:
            sc = self._scratch
            ids, scores = _routes()[1].search_one(self._pk, self._idf, self._w_max, tids, self._weights(), int(k),
                                                 sc.acc, sc.touched, self._exhaustive_docs)
            return ScoredDocs(ids, scores)
        # A mask, positions or packed words: survivor statistics without a pass over N
        # lengths (bm25_packed_filter_search).
        return self._filtered.search(self, tids, int(k), candidates)

    def _filtered_run(self, tids: np.ndarray, k: int, candidates: Any,
                      stack: StackArgs = NO_STACK) -> tuple[np.ndarray, np.ndarray, Any]:
        return self._filtered.run(self, tids, k, candidates, stack)

    def _stack_accumulate(self, term_ids: list[int], mask: np.ndarray,
                          stack: StackArgs) -> tuple[np.ndarray, np.ndarray]:
        qp, local = self._query_postings(term_ids)
        return bm25_numpy.accumulate(qp, local, mask, stack)

    def search_batch_arrays(self, queries: Sequence[Sequence[str]], k: int = 10, *,
                            threads: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The batch as arrays (ids[nq, k] padded with -1, scores[nq, k], counts[nq]); the
        compiled kernel runs chunks of it without the GIL on the shared batch pool."""
        nq, kk = len(queries), max(int(k), 0)
        self._doc_lengths_read()
        if kk == 0 or nq == 0 or self.avgdl == 0:
            return empty_batch(nq, kk)
        if self._kernels is None:
            return batch_one_by_one(self.search, queries, kk)
        kernel = _routes()[1].search_batch
        wt = self._weights()

        def run(flat: np.ndarray, ptr: np.ndarray) -> BatchArrays:
            return kernel(self._pk, self._idf, self._w_max, flat, ptr, wt, kk, self.n_docs, self._exhaustive_docs)

        a = self._file.arrays
        return run_batch(queries, self.vocab.get, lambda known: term_dfs(a["bptr"], a["last_count"], known).sum(),
                         int(threads or usable_cpus()), POSTINGS_PER_THREAD, run)

    # ------------------------------------------------------------ full check
    def verify(self) -> None:
        """Every checksum and the whole structure, every block decoded and its skip data and
        bounds recomputed (what publishing runs before the rename; ``index.packed_verify``)."""
        verify_packed(self)


def _lengths_dtype(a: dict[str, np.ndarray]) -> np.dtype:
    """The dtype of the file's compact lengths (``PackedFilterSupport.lengths``): from its
    longest length, the last of its sorted length codes (a read of one value), or the
    lengths' maximum for a file without codes. Only the kernels warmed depend on it: the
    lengths are checked against the codes before any query."""
    if "doc_code" in a:
        code_len = a["code_len"]
        return bm25_filter.compact_dtype(int(code_len[-1]) if len(code_len) else 0)
    return bm25_filter.compact_dtype(int(a["doc_len"].max()) if len(a["doc_len"]) else 0)


def open_packed(f: PackedFile, vocab: Any, tables_ok: Callable[[MappedFile], bool], *,
                kernel: str = "auto") -> PackedBM25Index:
    """A ``PackedBM25Index`` over a mapped packed file whose TOC ``read_toc`` has checked
    (``index.mapped.open_index`` calls this with its vocabulary and its table checks)."""
    if kernel not in KERNELS:
        raise ValueError(f"unknown BM25 kernel {kernel!r}; available: {', '.join(KERNELS)}")
    path, toc = f.path, f.toc
    for name in (*PACKED_ARRAYS, *vocab_names(toc.vocab_block)):
        f.array(name)  # every one present
    a = f.arrays
    # Per version (index.packed_tables): idf per term or per df, bit_row or bit_terms,
    # doc_len or doc_code + code_len (or both, formats 1/2).
    f.array("idf" if "idf" in a or "idf_df" not in a else "idf_val")
    f.array("bit_row" if "bit_terms" not in a else "bit_terms")
    f.array("doc_len" if "doc_code" not in a else "code_len")
    codes = a.get("doc_code", a.get("doc_len"))  # the kernels' length codes (the lengths without codes)
    if len(codes) != toc.n_docs or len(a["bptr"]) != toc.n_terms + 1 or len(a["data"]) < PAD_WORDS:
        raise CorruptIndexError(path, "array sizes do not match the recorded counts")
    if "last_count" in a:  # this version (its term bound table is verified at a first use)
        for name in ("last_count", "wmax_terms", "wmax_q"):
            f.array(name)
        if len(a["last_count"]) != toc.n_terms or len(a["wmax_terms"]) != len(a["wmax_q"]):
            raise CorruptIndexError(path, "array sizes do not match the recorded counts")
    else:  # formats 1-3: read through this version's shapes (packed_tables.narrowed)
        for name in OLD_TERM_ARRAYS:
            f.array(name)
        if len(a["indptr"]) != toc.n_terms + 1:
            raise CorruptIndexError(path, "array sizes do not match the recorded counts")
        a.update(narrowed(f))
    for name in ("idf_df", "idf_val"):
        if name in a:  # a few thousand values, read by every query
            f.whole(name)
    f.bit_terms = bit_terms_of(f)
    ix = PackedBM25Index.__new__(PackedBM25Index)
    ix.path, ix._toc, ix._file, ix._blocks = path, toc, f, f.blocks
    ix.n_terms, ix.n_docs, ix.k1, ix.b = toc.n_terms, toc.n_docs, float(toc.k1), float(toc.b)
    ix.total_len = int(toc.total_len)
    ix.avgdl = ix.total_len / ix.n_docs if ix.n_docs else 0.0
    # The weights' avgdl: the corpus's for a segment (as the plain layout computes it).
    ix._w_avgdl = toc.corpus_len / toc.corpus_docs if toc.corpus_docs else ix.avgdl
    ix._w_safe = ix._w_avgdl if ix._w_avgdl > 0 else 1.0
    ix._lengths_ok = False
    ix._wt = None
    ix._idf, ix._w_max = stored_idf_arrays(a), wmax_tuple(a)
    ix.indices = PostingsView(lambda: ix.indptr, ix.term_postings, 0)
    ix.tf = PostingsView(lambda: ix.indptr, ix.term_postings, 1)
    ix.vocab = vocab
    ix._tables_ok = tables_ok
    for name in ("doc_id_off", "doc_id_blob", "global_pos"):
        if name in a:
            setattr(ix, f"_{name}", a[name])
    ix._kernels = None if kernel == "numpy" else load_packed_kernels(codes.dtype, _lengths_dtype(a))
    ix._filtered = None if ix._kernels is None else _routes()[0]
    bm25_kernel.require(kernel, ix._kernels)
    ix._pk = pk_tuple(a, f.bit_terms)
    ix._exhaustive_docs = EXHAUSTIVE_MAX_DOCS
    ix._scratch = bm25_kernel.Scratch(ix.n_docs) if ix._kernels is not None else None
    return ix
