"""A refresh writes the lexical version's served files from the previous version's (#27):
the served records keep the previous records of rows that stayed and make only the new
ones, and the BM25 merge loads only the new chunks' tokens. What comes out must be what a
full write of the same served rows writes, byte for byte, and nothing that left serving
(deleted, relabelled RESTRICTED, withheld) may be carried over.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_bm25_merge import _refresh, assert_same_answers

from ragspine_pipeline.retrieval.lexical.index.mapped import open_index
from ragspine_pipeline.warehouse import pipeline as P
from ragspine_pipeline.warehouse import served_records as R
from ragspine_pipeline.warehouse.chunk_tables import served_chunk_table
from ragspine_pipeline.warehouse.lexical_files import BM25_FILE, open_bm25_file, write_bm25_file
from ragspine_pipeline.warehouse.versioned import VersionedTables

LIB = "lib"


def _write(corpus: Path, name: str, text: str, label: str = "PUBLIC", **meta: str) -> None:
    (corpus / LIB).mkdir(parents=True, exist_ok=True)
    (corpus / LIB / f"{name}.md").write_text(text, encoding="utf-8")
    (corpus / LIB / f"{name}.meta.json").write_text(json.dumps({"sensitivity": label, **meta}), encoding="utf-8")


def _full_write(wh: VersionedTables, folder: Path) -> Path:
    """What a full write of the latest version's served rows gives."""
    lex = wh.latest(P.LEXICAL, LIB)
    folder.mkdir(parents=True, exist_ok=True)
    R.write_served_records(folder, served_chunk_table(wh, LIB, lex.manifest["metadata"]["chunks_version"]))
    return folder


def _corpus(tmp_path: Path) -> Path:
    corpus = tmp_path / "corpus"
    rng = np.random.default_rng(5)
    words = [f"w{i}" for i in range(60)]
    for i in range(14):
        body = "\n\n".join(" ".join(rng.choice(words, 40)) + f" marker{i}p{k}" for k in range(3))
        _write(corpus, f"doc{i:02d}", f"# Doc {i}\n\n{body}\n", label="PUBLIC" if i % 3 else "INTERNAL")
    return corpus


@pytest.fixture(autouse=True)
def _small_batches(monkeypatch):
    monkeypatch.setattr(R, "BATCH_ROWS", 4)  # several record batches, rows moving across their bounds


def test_refreshed_records_are_the_full_write_byte_for_byte(tmp_path):
    corpus = _corpus(tmp_path)
    wh = VersionedTables(tmp_path / "wh")
    _refresh(wh, corpus)
    secret = "zqxsecretword"
    # An edit, an addition, a deletion, a relabel to RESTRICTED and one to another open label.
    _write(corpus, "doc01", "# Doc 1\n\nrewritten body with brandnew words\n")
    _write(corpus, "doc_aa", "# New\n\nanother brandnew document sorting first\n")
    (corpus / LIB / "doc02.md").unlink()
    (corpus / LIB / "doc02.meta.json").unlink()
    _write(corpus, "doc04", (corpus / LIB / "doc04.md").read_text(encoding="utf-8") + secret, label="RESTRICTED")
    _write(corpus, "doc05", (corpus / LIB / "doc05.md").read_text(encoding="utf-8"), label="CONFIDENTIAL")
    lex = _refresh(wh, corpus)
    md = lex.metadata
    assert md["served_build"] == "merged", md.get("served_full_reason")
    assert md["bm25_build"] == "merged" and md["bm25_stack_off"]  # a RESTRICTED relabel: no stack
    assert md["served_records_added"] >= 2 and md["served_records_kept"] > 0
    ref = _full_write(wh, tmp_path / "ref")
    got = lex.published.path
    assert (got / R.SERVED_FILE).read_bytes() == (ref / R.SERVED_FILE).read_bytes()
    assert (got / R.SERVED_META).read_bytes() == (ref / R.SERVED_META).read_bytes()
    served = P.load_snapshot_index(wh, LIB).retriever.chunks
    assert not any(c.doc_id.endswith(("/doc04", "/doc02")) for c in served)
    assert secret.encode() not in (got / R.SERVED_FILE).read_bytes()
    assert {c.sensitivity for c in served if c.doc_id.endswith("/doc05")} == {"CONFIDENTIAL"}


def test_the_token_loader_feeds_the_merge_what_a_full_build_counts(tmp_path, monkeypatch):
    from ragspine_pipeline.warehouse import served_refresh
    from ragspine_pipeline.warehouse.lexical_stack import StackPolicy

    monkeypatch.setattr(served_refresh, "DEFAULT_POLICY", StackPolicy(max_churn=0.25, min_docs=0))  # a small library that stacks
    corpus = _corpus(tmp_path)
    wh = VersionedTables(tmp_path / "wh")
    _refresh(wh, corpus)
    for r in range(3):  # several refreshes: the new tokens sit in ever newer segments
        _write(corpus, f"doc{r + 6:02d}", f"# Doc {r}\n\nround {r} words brandnew{r}\n")
        lex = _refresh(wh, corpus)
        # Stacked, until the churn passes the merge policy's bound (folded into one file).
        assert lex.metadata["bm25_build"] == ("stacked" if r == 0 else lex.metadata["bm25_build"])
        assert lex.metadata["bm25_build"] in ("stacked", "merged")
    served = served_chunk_table(wh, LIB, lex.metadata["chunks_version"], columns=["chunk_id"])
    ids = served.column("chunk_id").to_pylist()
    tok = P._aligned(wh.read(P.LEXICAL, LIB, "tokens", lex.published.version), served.column("chunk_id"), "x")
    docs = tok.column("tokens").to_pylist()
    write_bm25_file(tmp_path / "fresh", ids, docs)
    merged, fresh = open_bm25_file(lex.published.path), open_index(tmp_path / "fresh" / BM25_FILE)
    assert merged.same_doc_ids(ids)
    queries = [["brandnew0"], ["brandnew2", "round"], ["w1", "w2"], ["marker3p1"], ["words"], ["doc"]]
    assert_same_answers(merged, fresh, len(ids), queries)


def test_damaged_previous_records_are_not_reused(tmp_path):
    corpus = _corpus(tmp_path)
    wh = VersionedTables(tmp_path / "wh")
    first = _refresh(wh, corpus)
    path = first.published.path / R.SERVED_FILE
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.chmod(0o600)
    path.write_bytes(bytes(raw))
    _write(corpus, "doc01", "# Doc 1\n\nrewritten\n")
    lex = _refresh(wh, corpus)
    assert lex.metadata["served_build"] == "full" and "checksum" in lex.metadata["served_full_reason"]
    ref = _full_write(wh, tmp_path / "ref")
    assert (lex.published.path / R.SERVED_FILE).read_bytes() == (ref / R.SERVED_FILE).read_bytes()
