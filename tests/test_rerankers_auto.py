"""``RAGSPINE_RERANKER=auto`` is tied to the measured table (benchmarks/results/rerank.json):
it may pick a reranker only if that reranker helped (nDCG@10 up) on every English and
Chinese row it was measured on, and every measured reranker that helped on all of them is
in it. A reranker that could not be built for the benchmark (the operator-supplied
cross-encoder) may stay in ``AUTO_ORDER`` only if the table says why it was not measured."""

import json
from pathlib import Path

from ragspine_pipeline.retrieval.rerank.cross_encoder import AUTO_ORDER, LOCAL_RERANKERS

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "rerank.json"
AUTO_LANGUAGES = ("en", "zh")


def _table():
    data = json.loads(RESULTS.read_text(encoding="utf-8"))
    langs = data["languages"]
    every = [*data["rows"], *((data.get("earlier") or {}).get("rows") or [])]  # earlier runs count too
    rows = [r for r in every if langs.get(r["set"]) in AUTO_LANGUAGES and "delta_ndcg@10" in r]
    return data, langs, rows


def helps_on_english_and_chinese(name: str, rows: list[dict], langs: dict[str, str]) -> bool:
    mine = [r for r in rows if r["reranker"] == name]
    covered = {langs[r["set"]] for r in mine}
    return covered == set(AUTO_LANGUAGES) and all(r["delta_ndcg@10"] > 0 for r in mine)


def test_table_covers_english_and_chinese_for_every_local_reranker_it_measured():
    data, langs, rows = _table()
    measured = {r["reranker"] for r in rows} & set(LOCAL_RERANKERS)
    assert measured, "the table measures no local reranker on the English/Chinese sets"
    for name in measured:
        assert {langs[r["set"]] for r in rows if r["reranker"] == name} == set(AUTO_LANGUAGES), name


def test_auto_order_is_exactly_what_helps_in_the_measured_table():
    data, langs, rows = _table()
    measured = {r["reranker"] for r in rows} & set(LOCAL_RERANKERS)
    for name in measured:
        assert (name in AUTO_ORDER) == helps_on_english_and_chinese(name, rows, langs), (
            f"{name}: in AUTO_ORDER={name in AUTO_ORDER}, but its English/Chinese deltas are "
            f"{[round(r['delta_ndcg@10'], 4) for r in rows if r['reranker'] == name]}")
    for name in set(AUTO_ORDER) - measured:
        assert name in data["unavailable"], f"{name} is in AUTO_ORDER but neither measured nor listed as unavailable"


def test_auto_rows_never_hurt_on_english_and_chinese():
    data, langs, _ = _table()
    for r in [*data["rows"], *((data.get("earlier") or {}).get("rows") or [])]:
        if r["reranker"] == "auto" and langs.get(r["set"]) in AUTO_LANGUAGES:
            assert r.get("delta_ndcg@10", 0.0) >= 0, r
