"""The streaming build's two token lookups (compiled table, Arrow dictionary) number terms
identically, first seen first, however the batches are typed, sliced or mixed with Python
batches, and while the compiled table grows many times."""

import numpy as np
import pyarrow as pa
import pytest

from ragspine_pipeline.retrieval.lexical.refresh.stream_kernels import kernels
from ragspine_pipeline.retrieval.lexical.refresh.term_ids import TermIds

COMPILED = kernels("auto")
ARROW = {**COMPILED, "encode": None}


def random_terms(rng: np.random.Generator, n: int) -> list[str]:
    """Short and long terms, unicode, the empty string, prefixes of one another."""
    alphabet = list("abcxyz") + ["é", "營", "Ω", "\x00", " "]
    out = ["", "a", "aa", "a" * 40, "a" * 41, "營收", "x\x00"]
    while len(out) < n:
        out.append("".join(rng.choice(alphabet, size=int(rng.integers(1, 14)))))
    return list(dict.fromkeys(out))


@pytest.mark.skipif(COMPILED.get("encode") is None, reason="numba not installed")
def test_compiled_and_arrow_lookups_number_terms_alike():
    rng = np.random.default_rng(5)
    terms = np.array(random_terms(rng, 30_000), dtype=object)
    compiled, arrow = TermIds(), TermIds()
    for step in range(8):
        toks = terms[rng.zipf(1.3, size=20_000) % len(terms)].tolist()
        if step == 3:  # a Python batch adds terms to the dict directly (Arrow could not hold it)
            for t in ["\ud800", *toks[:50], "brand-new"]:
                compiled.setdefault(t, len(compiled))
                arrow.setdefault(t, len(arrow))
            continue
        typ = pa.large_string() if step % 2 else pa.string()
        values = pa.array(["pad", *toks, "pad"], typ)[1:-1]  # a slice: offsets start past 0
        got, want = compiled.encode(values, COMPILED), arrow.encode(values, ARROW)
        assert got.dtype == np.int32 and np.array_equal(got, want)
        assert list(compiled.items()) == list(arrow.items())
    assert len(compiled) > 4096 and len(compiled._table) > 4096  # the table grew (and was rehashed)
    assert [t for t, _ in sorted(compiled.items(), key=lambda kv: kv[1])] == list(compiled)


def test_empty_batches_and_empty_strings():
    for k in (COMPILED, ARROW):
        v = TermIds()
        assert v.encode(pa.array([], pa.string()), k).tolist() == []
        assert v.encode(pa.array(["", "", "b", ""], pa.string()), k).tolist() == [0, 0, 1, 0]
        assert list(v) == ["", "b"]
