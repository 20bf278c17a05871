"""`ragspine eval` ranks documents without building snippet dicts (issue 16 item 5).

The old runner asked ``retrieve`` for ~3x depth snippets per query and built a full dict
(``dataclasses.asdict`` of the locator, metadata, scores) for each; evaluation only needs
document ids in rank order. Counted conversions, not wall clock.
"""

import io
import json

import pytest

from ragspine_pipeline.eval import runner
from ragspine_pipeline.eval.runner import (
    EvalConfig,
    evaluate_dataset,
    evaluate_modes,
    progress_enabled,
)
from ragspine_pipeline.retrieval.chunking.chunking import SourceLocator
from ragspine_pipeline.retrieval.hybrid import retriever as hybrid
from ragspine_pipeline.retrieval.link import narrative_index, narrative_link


def _dataset(tmp_path, n_docs=60, n_queries=6):
    (tmp_path / "qrels").mkdir()
    with (tmp_path / "corpus.jsonl").open("w") as f:
        for i in range(n_docs):
            f.write(json.dumps({"_id": f"d{i}", "title": f"Doc {i}",
                                "text": f"shared words about topic{i % 7} and item{i} with common text"}) + "\n")
    with (tmp_path / "queries.jsonl").open("w") as f:
        for q in range(n_queries):
            f.write(json.dumps({"_id": str(q), "text": f"common topic{q % 7} item{q}"}) + "\n")
    (tmp_path / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\td{q}\t1\n" for q in range(n_queries)))
    return tmp_path


@pytest.fixture
def counted(monkeypatch):
    calls = {"snippet": 0, "locator": 0}
    real_snip, real_loc = narrative_index.build_snippet, SourceLocator.to_dict
    real_hit = hybrid.RetrievalHit
    hit_calls = []

    def hit(*a, **kw):
        hit_calls.append(1)
        return real_hit(*a, **kw)

    def snip(*a, **kw):
        calls["snippet"] += 1
        return real_snip(*a, **kw)

    def loc(self):
        calls["locator"] += 1
        return real_loc(self)

    monkeypatch.setattr(narrative_index, "build_snippet", snip)  # where retrieve looks it up
    monkeypatch.setattr(SourceLocator, "to_dict", loc)
    monkeypatch.setattr(hybrid, "RetrievalHit", hit)
    calls["hits"] = hit_calls
    return calls


def test_eval_builds_no_snippet_dicts_and_keeps_the_ranking(tmp_path, counted):
    ds = _dataset(tmp_path)
    res = evaluate_dataset(str(ds), EvalConfig(progress=False))
    assert counted == {"snippet": 0, "locator": 0, "hits": []}  # old code: ~3 * depth each, per query
    assert res["counts"]["queries"] == 6 and res["ndcg@10"] > 0.5
    modes = evaluate_modes(str(ds), ["bm25"], cfg=EvalConfig(progress=False))
    assert counted == {"snippet": 0, "locator": 0, "hits": []}
    assert modes[0]["ndcg@10"] == res["ndcg@10"]


def test_ranked_hits_match_retrieve_and_retrieve_builds_only_top_k(tmp_path, counted):
    from ragspine_pipeline.corpus import ingest_documents, paragraph_chunker
    from ragspine_pipeline.eval.beir import load_beir
    from ragspine_pipeline.retrieval.chunking.chunk_store import ChunkStore

    ds = load_beir(_dataset(tmp_path))
    store = ChunkStore(":memory:")
    ingest_documents(store, runner.beir_documents(ds), scope_prefix="", chunker=paragraph_chunker(10**6, 0))
    index = narrative_link.NarrativeIndex.from_chunks(list(store.iter_chunks()), channels=("bm25",))
    r = narrative_link.NarrativeIndexRetriever(index)
    hits = r.ranked_hits("common topic3 item3", top_k=40)
    assert r.ranked_chunks("common topic3 item3", top_k=40) == [h.chunk for h in hits]
    assert counted["snippet"] == 0
    snippets = r.retrieve("common topic3 item3", top_k=5)
    assert counted["snippet"] == 5 and counted["locator"] == 5  # one dict per returned snippet
    assert [s["chunk_id"] for s in snippets] == [h.chunk.chunk_id for h in hits[:5]]
    assert r.ranked_hits("common", top_k=0) == []


def test_progress_only_for_a_terminal_and_never_under_json():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    assert progress_enabled(stream=Tty()) is True
    assert progress_enabled(stream=Tty(), json_output=True) is False
    assert progress_enabled(stream=io.StringIO()) is False  # a pipe / captured stderr


def test_cli_eval_json_prints_no_progress(tmp_path, capsys, monkeypatch):
    from ragspine_pipeline import cli

    monkeypatch.setattr(runner, "progress_enabled", lambda **kw: True)  # pretend a terminal
    seen = {}
    real = runner.evaluate_dataset

    def spy(folder, cfg):
        seen["progress"] = cfg.progress
        return real(folder, cfg)

    monkeypatch.setattr(runner, "evaluate_dataset", spy)
    assert cli.main(["eval", str(_dataset(tmp_path)), "--json"]) == 0
    assert seen["progress"] is False
    out = capsys.readouterr()
    assert json.loads(out.out)["counts"]["queries"] == 6
    assert "query/s" not in out.err and "it/s" not in out.err


@pytest.mark.parametrize("channels", [("bm25",), ("bm25", "dense")])
def test_ranked_doc_ids_equal_ranked_chunks_with_restricted_and_multi_chunk_docs(channels):
    # The array path of `ragspine eval` (label verdicts per distinct label, dedupe by
    # document) must give exactly the doc ids of ranked_chunks, RESTRICTED ones dropped.
    from ragspine_pipeline.eval.metrics import dedupe_keep_best
    from ragspine_pipeline.retrieval.chunking.chunking import Chunk, SourceLocator
    from ragspine_pipeline.retrieval.vector.embedding_backends import DeterministicHashBackend

    labels = ["PUBLIC", "RESTRICTED", "internal", "Confidential??", None]
    chunks = [Chunk(chunk_id=f"c{i:03d}", doc_id=f"d{i // 3}", title="", text=f"common topic{i % 7} item{i % 5}",
                    source_locator=SourceLocator(f"d{i // 3}", 0, 10), sensitivity=labels[i % len(labels)])
              for i in range(90)]
    backend = DeterministicHashBackend() if "dense" in channels else None
    index = narrative_link.NarrativeIndex.from_chunks(chunks, channels=channels, embedding_backend=backend)
    r = narrative_link.NarrativeIndexRetriever(index)
    for q in ("common topic3 item3", "topic1", "item4 common", "absent"):
        for depth in (1, 5, 40):
            want = dedupe_keep_best([c.doc_id for c in r.ranked_chunks(q, top_k=3 * depth)])[:depth]
            assert r.ranked_doc_ids(q, chunk_depth=3 * depth, depth=depth) == want
    from ragspine_pipeline.sensitivity import is_restricted

    assert sum(is_restricted(c.sensitivity) for c in chunks) == 54  # RESTRICTED, odd, None: fail closed
    got = r.ranked_chunks("common", top_k=90)
    assert len(got) == 36 and not any(is_restricted(c.sensitivity) for c in got)
    assert len(r.ranked_doc_ids("common", chunk_depth=90, depth=90)) == len({c.doc_id for c in got})
