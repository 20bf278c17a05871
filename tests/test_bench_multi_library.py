"""benchmarks/bench_multi_library.py --hybrid-fusion policy on tiny BEIR sets (issue 43 item 1).

Why: the multi-library table's hybrid rows must fuse as ``RAGSPINE_EMBEDDING_BACKEND=auto``
does (e.g. CJK: e5, convex 0.5), not by the index's plain RRF; a bench that silently kept
RRF, or took the choice from a copy of the numbers instead of ``auto_policy``, would only
show as a wrong table. A hashing backend stands in for the models (nothing is loaded).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import bench_multi_library as bml  # noqa: E402
from ragspine_pipeline.retrieval.link.multi_index import MultiIndexRetriever  # noqa: E402
from ragspine_pipeline.retrieval.vector.auto_policy import choice_for_group  # noqa: E402
from ragspine_pipeline.retrieval.vector.embedding_backends import DeterministicHashBackend  # noqa: E402
from ragspine_pipeline.vector_cache import CachingEmbeddingBackend  # noqa: E402

ZH = ["北京是中国的首都，人口众多。", "长江是亚洲最长的河流。", "熊猫生活在四川的山区。", "上海是一座港口城市。",
      "茶叶起源于中国南方。", "故宫位于北京市中心。", "黄河被称为母亲河。", "西湖在杭州，风景优美。"]
EN = ["the wing lift grows with the angle of attack", "boundary layer flow over a flat plate",
      "heat transfer at hypersonic speed", "shock waves in supersonic nozzles"]
DE = ["Berlin ist die Hauptstadt von Deutschland.", "Der Rhein fließt durch viele Städte.",
      "Die Alpen liegen im Süden des Landes.", "München ist für das Oktoberfest bekannt."]


def write_set(root: Path, name: str, texts: list[str]) -> None:
    d = root / name
    (d / "qrels").mkdir(parents=True)
    (d / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"{name}-{i}", "title": "", "text": t},
                                                       ensure_ascii=False) + "\n" for i, t in enumerate(texts)),
                                    encoding="utf-8")
    (d / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": t[:6]}, ensure_ascii=False) + "\n"
                                             for i, t in enumerate(texts)), encoding="utf-8")
    (d / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"q{i}\t{name}-{i}\t1\n" for i in range(len(texts))), encoding="utf-8")


@pytest.fixture()
def data(tmp_path, monkeypatch):
    """Tiny sets under the shared names, every model a cached hashing backend."""
    root = tmp_path / "eval"
    write_set(root, "cmrc2018-trial", ZH)
    for name, texts in (("cranfield", EN), ("scifact", EN[::-1]), ("xquad-de", DE)):
        write_set(root, name, texts)
    # One dimension per model: a distinct model id each (vectors of two models never compare).
    fake = {m: CachingEmbeddingBackend(DeterministicHashBackend(dim=dim), tmp_path / "vectors" / m)
            for m, dim in (("e5", 16), ("minilm", 24), ("usem3", 32), ("static", 40))}
    monkeypatch.setattr(bml, "_BACKEND", fake)
    return root


def test_policy_run_fuses_as_auto_and_says_so(data, tmp_path):
    out = tmp_path / "out"
    args = ["--data", str(data), "--out", str(out), "--sets", "cmrc2018-trial", "--hybrid-sets", "cmrc2018-trial",
            "--hybrid-fusion", "policy", "--hybrid-model", "auto", "--label", "policy",
            "--setups", "split2", "split2+"]
    assert bml.main(args) == 0
    got = json.loads((out / "multi_library_policy.json").read_text())
    want = choice_for_group("cjk")  # the product's own reading of auto_policy.json
    pol = got["policy"]["cmrc2018-trial"]
    assert (pol["group"], pol["model"], pol["fusion"]) == ("cjk", want.model, want.fusion.to_dict())
    assert pol["fusion"]["method"] == "convex"  # not the index's plain RRF
    assert pol["setups"]["split2"]["parts_agree"] is True
    # An English extra library resolved on its own would get the English choice.
    assert pol["setups"]["split2+cranfield+scifact"]["own_choice"]["noise-cranfield"] == \
        bml.choice_text(choice_for_group("en"))
    assert sum(n for c in pol["embedded_now"]["hybrid-policy"].values() for n in c.values()) > 0  # fresh cache
    for setup in ("split2", "split2+cranfield+scifact"):
        for mode in bml.MODES:
            assert f"cmrc2018-trial|hybrid-policy|{setup}|{mode}" in got["cells"]
    md = (out / "multi_library_policy.md").read_text()
    assert f"| cmrc2018-trial | cjk: {want.model} convex w={want.fusion.dense_weight:g} |" in md
    # A rerun finds every cell written and leaves it as it was (resumable).
    assert bml.main(args) == 0
    again = json.loads((out / "multi_library_policy.json").read_text())
    assert again["cells"] == got["cells"]


def test_policy_own_resolves_each_library_alone(data, tmp_path):
    out = tmp_path / "out"
    assert bml.main(["--data", str(data), "--out", str(out), "--sets", "cmrc2018-trial", "--hybrid-sets",
                     "cmrc2018-trial", "--hybrid-fusion", "policy-own", "--hybrid-model", "auto", "--label", "own",
                     "--setups", "split2+", "--modes", "global"]) == 0
    got = json.loads((out / "multi_library_own.json").read_text())
    assert "cmrc2018-trial|hybrid-policy-own|split2+cranfield+scifact|global" in got["cells"]
    assert "hybrid-policy-own one library" in (out / "multi_library_own.md").read_text()
    chunks, ds = bml.set_chunks(data, "cmrc2018-trial")
    libs = bml.setups(chunks, "cmrc2018-trial", data, bml.OWN_CHANNELS, ["split2+"])
    libs = next(iter(libs.values()))
    own = bml.record_setup_choices({}, "cmrc2018-trial", "split2+", libs, bml.policy_choice(chunks))
    assert bml.choice_text(own["noise-cranfield"]) == bml.choice_text(choice_for_group("en"))
    parts = {lib: bml.library(cs, lib, bml.OWN_CHANNELS, own[lib]) for lib, cs in libs.items()}
    multi = MultiIndexRetriever(parts, router=None, fusion="global")
    hit = multi.retrieve(ds.queries["q1"], top_k=3)[0]
    # Two models in one union (e5 for the Chinese parts, MiniLM for the English extras): the
    # libraries of the question's language answer the dense channel with their model and fusion.
    assert hit["scores"]["fusion"]["method"] == "convex" and hit["scores"]["fusion"]["dense"] == "raw_cosine"
    assert multi.last["dense_scope"] and not any(lib.startswith("noise") for lib in multi.last["dense_scope"])


def test_every_mode_fuses_with_the_choice(data):
    chunks, ds = bml.set_chunks(data, "cmrc2018-trial")
    choice = bml.policy_choice(chunks)
    one = bml.library(chunks, "one", bml.POLICY_CHANNELS, choice)
    assert one.index.retriever.fusion == choice.fusion
    libs = bml.setups(chunks, "cmrc2018-trial", data, bml.POLICY_CHANNELS, ["split2"])["split2"]
    parts = {lib: bml.library(cs, lib, bml.POLICY_CHANNELS, choice) for lib, cs in libs.items()}
    query = ds.queries["q1"]
    for mode in ("global", "rrf"):
        multi = MultiIndexRetriever(parts, router=None, fusion=mode)
        hits = multi.retrieve(query, top_k=3)
        assert hits and multi.last["fusion"] == mode
        fusion = hits[0]["scores"]["fusion"]
        assert (fusion["method"], fusion["dense_weight"]) == (choice.fusion.method, choice.fusion.dense_weight)


def test_rrf_stays_the_default_and_policy_needs_auto(data, tmp_path):
    assert bml.hybrid_channels("xquad-de", "auto") == "hybrid-e5"
    assert bml.hybrid_channels("scifact", "auto") == "hybrid"
    assert bml.hybrid_channels("scifact", "auto", "policy") == "hybrid-policy"
    with pytest.raises(SystemExit) as e:
        bml.main(["--data", str(data), "--out", str(tmp_path), "--hybrid-fusion", "policy"])
    assert e.value.code == 2
