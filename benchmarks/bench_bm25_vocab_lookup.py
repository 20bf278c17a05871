"""Per-token vocabulary lookup cost of a published BM25 file (issue 47 item 4, bytes T3).

Why: format 4 replaced the hash-table vocabulary with a front-coded sorted one; a query
pays one lookup per distinct token (then cached). One fresh process per file: open, the
first lookup (the vocabulary's checksums and tables, and the term's postings check), then
20,000 known and 20,000 absent tokens (cache cleared, per-term postings checks marked done
so the dictionary alone is timed) and 5,000 ``term(tid)`` decodes. Prints one JSON line::

    python benchmarks/bench_bm25_vocab_lookup.py FILE.bm25
"""

import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ragspine_pipeline.retrieval.lexical.index.mapped import open_index  # noqa: E402

path = sys.argv[1]
t0 = time.perf_counter()
ix = open_index(path, kernel="numpy")
t_open = time.perf_counter() - t0
v = ix.vocab
rng = np.random.default_rng(0)
tids = rng.choice(len(v), 20000, replace=False)
t0 = time.perf_counter()
v.get("w1")
first = time.perf_counter() - t0  # vocabulary checksums and tables, and the term's postings check
terms = [v.term(int(t)) for t in tids]
absent = [t + "x" for t in terms]
v._cache.clear()
ix._file.term_ok[:] = True  # time the lookup, not the per-term postings checks
t0 = time.perf_counter()
for t in terms:
    v.get(t)
hit = (time.perf_counter() - t0) / len(terms)
t0 = time.perf_counter()
for t in absent:
    v.get(t)
miss = (time.perf_counter() - t0) / len(absent)
t0 = time.perf_counter()
for t in tids[:5000].tolist():
    v.term(t)
term_us = (time.perf_counter() - t0) / 5000
assert all(v.get(t) == int(i) for t, i in zip(terms, tids, strict=True))
print(json.dumps({"file": Path(path).name, "format": ix._file.toc.version, "vocab_block": ix._file.toc.vocab_block,
                  "open_ms": round(1000 * t_open, 2), "first_lookup_ms": round(1000 * first, 2),
                  "hit_us": round(1e6 * hit, 2), "miss_us": round(1e6 * miss, 2), "term_us": round(1e6 * term_us, 2)}))
