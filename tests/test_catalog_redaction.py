"""The redacted catalog says nothing about restricted or withheld documents (issue 25, item 4).

Built from the attacker's view: a canary word in restricted text, metadata and file
names; the catalog's readable content (every view and table, ordered rows, and the view
SQL) compared byte for byte across corpora that differ only in restricted documents; the
catalog file's bytes and every published file grepped for the canary; the first run after
an upgrade rewrites an old catalog; raw and chunk Parquet are owner-only.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from datetime import datetime, timedelta
from pathlib import Path
from unittest import mock

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragspine_pipeline.corpus import DEMO_ROOT
from ragspine_pipeline.graph.step import build_relation_graph
from ragspine_pipeline.retrieval.lexical.analysis.analyzer import make_analyzer
from ragspine_pipeline.retrieval.vector.embedding_backends import make_embedding_backend
from ragspine_pipeline.warehouse import catalog as C
from ragspine_pipeline.warehouse import pipeline as P
from ragspine_pipeline.warehouse.raptor_tables import build_raptor_step
from ragspine_pipeline.warehouse.versioned import OWNER_ONLY_ASSETS, VersionedTables

ROOT = Path(__file__).resolve().parents[1]
LIB = "lib"
CANARY = "Quartzkrot"  # the analyzer keeps it whole (no stemming suffix): greppable in tokens
VOCAB = ["revenue", "margin", "zebra", "plant", "tariff", "lyon", "union", "深圳", "工会", "营收"]
FIXED = datetime(2026, 1, 1)


def test_the_canary_survives_the_analyzer():
    assert make_analyzer(None).analyze(CANARY) == [CANARY.lower()]


def _clock(latest: datetime | None) -> datetime:
    """A deterministic ingest clock (strictly increasing): the worlds' timestamps agree."""
    return FIXED if latest is None or latest < FIXED else latest + timedelta(microseconds=1)


def _sidecar(**kw: object) -> str:
    return json.dumps(kw, ensure_ascii=False)


def _build(root: Path, corpus: Path, *, extras: bool = True) -> VersionedTables:
    """A fresh warehouse at ``root/wh`` (the same path for every world) and its catalog."""
    shutil.rmtree(root / "wh", ignore_errors=True)
    wh = VersionedTables(root / "wh")
    with mock.patch("ragspine_pipeline.warehouse.chunk_tables.timestamp_after", _clock):
        _refresh(wh, corpus, extras=extras)
    out = P.build_catalog(wh, [LIB], root / "wh" / "catalog.duckdb")
    assert out["rebuilt"] and not out["errors"], out
    return wh


def _refresh(wh: VersionedTables, corpus: Path, *, extras: bool = True) -> None:
    P.build_raw_documents(wh, corpus, LIB)
    P.build_chunks(wh, LIB)
    P.build_lexical_index(wh, LIB)
    if extras:
        P.build_embeddings(wh, LIB, make_embedding_backend("deterministic"), "deterministic")
        build_raptor_step(wh, LIB, threshold=0.3, max_depth=2)
        build_relation_graph(wh, LIB)
    P.publish_snapshot(wh, LIB)


def catalog_content(path: Path) -> dict[str, object]:
    """Everything a reader of the catalog file can read: each table's and view's rows in
    a total order, each view's SQL, and the list of objects."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        views = con.execute("SELECT view_name, sql FROM duckdb_views() WHERE NOT internal ORDER BY 1").fetchall()
        tables = [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall()]
        out: dict[str, object] = {"objects": [v for v, _ in views] + tables, "view_sql": dict(views)}
        for name in [v for v, _ in views] + tables:
            cur = con.execute(f"SELECT * FROM {C.quote_ident(name)} ORDER BY ALL")
            out[name] = {"columns": [d[0] for d in cur.description], "rows": cur.fetchall()}
        return out
    finally:
        con.close()


def _dump(content: dict[str, object]) -> str:
    return json.dumps(content, default=repr, ensure_ascii=False, sort_keys=True)


def _write_secret(folder: Path, secret: dict[str, tuple[str, str, str]]) -> None:
    for name, (text, label, value) in secret.items():
        (folder / f"{name}.md").write_text(f"# {CANARY} {name}\n\n{text} {CANARY}\n", encoding="utf-8")
        (folder / f"{name}.meta.json").write_text(
            _sidecar(sensitivity=label, topic=value, entity=value, geography=value, period=value), encoding="utf-8")
    # A document withheld because its sidecar does not parse (its label is unknown).
    (folder / f"w_{CANARY}.md").write_text(f"{CANARY} withheld text\n", encoding="utf-8")
    (folder / f"w_{CANARY}.meta.json").write_text('{"sensitivity": "PUBLIC", ' + CANARY, encoding="utf-8")


def _library(tmp_path: Path, files: dict[str, str], secret: dict[str, tuple[str, str, str]] | None = None
             ) -> tuple[Path, Path]:
    """(corpus root, library folder) holding ``files`` and, given ``secret``, restricted documents."""
    folder = tmp_path / "corpus" / LIB
    folder.mkdir(parents=True)
    for name, body in files.items():
        (folder / name).write_text(body, encoding="utf-8")
    if secret is not None:
        _write_secret(folder, secret)
    return tmp_path / "corpus", folder


def _remove_secret(folder: Path) -> None:
    for p in folder.iterdir():
        if CANARY.lower() in p.name.lower() or p.name.startswith("s_"):
            p.unlink()


@st.composite
def worlds(draw):
    """(open docs, restricted docs variant A, variant B): A and B differ in text and metadata."""
    docs = {}
    for i in range(draw(st.integers(1, 4))):
        words = draw(st.lists(st.sampled_from(VOCAB), min_size=1, max_size=25))
        docs[f"d{i}"] = (" ".join(words), draw(st.sampled_from(["PUBLIC", "INTERNAL"])),
                         draw(st.sampled_from(["A", "B"])))

    def secret():
        out = {}
        for i in range(draw(st.integers(1, 3))):
            words = draw(st.lists(st.sampled_from(VOCAB), min_size=1, max_size=40))
            label = draw(st.sampled_from(["RESTRICTED", "restricted", "RESTRI\u200bCTED", "PUBLlC"]))
            value = draw(st.sampled_from([f"{CANARY}-topic", "A", "深圳 " + CANARY, "40.0% to 30.0%"]))
            out[f"s_{CANARY}{i}"] = (" ".join(words), label, value)
        return out

    return docs, secret(), secret()


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
def test_catalog_content_does_not_depend_on_restricted_documents(tmp_path_factory, world):
    docs, secret_a, secret_b = world
    root = tmp_path_factory.mktemp("catalog_worlds")
    folder = root / "corpus" / LIB
    folder.mkdir(parents=True)
    for name, (text, label, entity) in docs.items():  # the open files are the same files in every world
        (folder / f"{name}.md").write_text(f"# {name}\n\n{text}\n", encoding="utf-8")
        (folder / f"{name}.meta.json").write_text(_sidecar(sensitivity=label, entity=entity), encoding="utf-8")
    path = root / "wh" / "catalog.duckdb"

    _write_secret(folder, secret_a)
    _build(root, root / "corpus")
    with_a = catalog_content(path)
    raw_bytes = path.read_bytes()
    assert CANARY.encode() not in raw_bytes and CANARY.lower().encode() not in raw_bytes.lower()

    _remove_secret(folder)
    _write_secret(folder, secret_b)  # other text, other metadata, as many documents or not
    _build(root, root / "corpus")
    with_b = catalog_content(path)

    _remove_secret(folder)
    _build(root, root / "corpus")
    without = catalog_content(path)

    n_hidden = len(secret_a) + 1
    assert with_a[C.WITHHELD_COUNTS]["rows"] == [(LIB, n_hidden)]
    assert without[C.WITHHELD_COUNTS]["rows"] == [(LIB, 0)]
    if len(secret_b) == len(secret_a):
        assert _dump(with_a) == _dump(with_b)
    # The one thing allowed to differ: the per-library count of withheld documents.
    for world_ in (with_a, with_b, without):
        world_.pop(C.WITHHELD_COUNTS)
    assert _dump(with_a) == _dump(with_b) == _dump(without)
    assert CANARY.lower() not in _dump(with_a).lower()
    assert with_a["open_documents"]["rows"] == [(LIB, f"{LIB}/{d}") for d in sorted(docs)]


def _published_text(wh_root: Path) -> list[tuple[Path, str]]:
    """(file, its readable content) of every file a published snapshot or reader may see:
    everything but the owner-only raw/chunk tables and the lock files."""
    out = []
    for p in sorted(wh_root.rglob("*")):
        rel = p.relative_to(wh_root).parts
        if not p.is_file() or rel[0] in OWNER_ONLY_ASSETS or rel[0] == ".locks":
            continue
        data = p.read_bytes()
        text = data.decode("utf-8", "replace")
        if p.suffix == ".parquet":
            text += json.dumps(pq.read_table(p).to_pylist(), default=repr, ensure_ascii=False)
        out.append((p, text))
    return out


def test_no_published_file_and_no_catalog_byte_holds_the_canary(tmp_path):
    files = {}
    for i, words in enumerate(["revenue margin zebra plant", "tariff lyon union 营收", "zebra plant revenue"]):
        files[f"d{i}.md"] = f"# Open {i}\n\n{words}\n"
        files[f"d{i}.meta.json"] = _sidecar(sensitivity="PUBLIC", entity="A")
    corpus, _ = _library(tmp_path, files, {f"s_{CANARY}": ("revenue zebra 40.0% to 30.0%", "RESTRICTED",
                                                          f"{CANARY} value")})
    wh = _build(tmp_path, corpus)
    hits = [str(p.relative_to(wh.root)) for p, text in _published_text(wh.root) if CANARY.lower() in text.lower()]
    assert not hits, hits
    # The restricted document is really there, in the owner's tables (and the unredacted catalog).
    assert CANARY in json.dumps(wh.read(P.CHUNKS, LIB, "chunks").column("text").to_pylist())
    P.build_catalog(wh, [LIB], tmp_path / "catalog_restricted.duckdb", include_restricted=True)
    unredacted = catalog_content(tmp_path / "catalog_restricted.duckdb")
    assert CANARY in _dump(unredacted) and C.OPEN_DOCS not in unredacted["objects"]
    assert unredacted[C.WITHHELD_COUNTS]["rows"] == [(LIB, 0)]


def _index_rows(wh: VersionedTables, asset: str, table: str) -> list[dict]:
    """Every row of every segment the latest version of an index table names."""
    return [r for p in wh.latest(asset, LIB).table_paths(table) for r in pq.read_table(p).to_pylist()]


def test_a_relabel_to_restricted_leaves_no_index_segment_with_its_chunks(tmp_path):
    """A relabel keeps the chunk ids: the tokens and vectors written while the document was
    PUBLIC must not stay in an appended-to segment of the published index tables."""
    corpus, folder = _library(tmp_path, {"open.md": "# Open\n\nzebra revenue\n",
                                         "memo.md": f"# Memo\n\n{CANARY} margin plan\n",
                                         "memo.meta.json": _sidecar(sensitivity="PUBLIC")})
    wh = VersionedTables(tmp_path / "wh")
    _refresh(wh, corpus)
    memo = {c.chunk_id for c in P.active_chunks(wh, LIB) if c.doc_id == f"{LIB}/memo"}
    assert memo <= {r["chunk_id"] for r in _index_rows(wh, P.LEXICAL, "tokens")}
    (folder / "memo.meta.json").write_text(_sidecar(sensitivity="RESTRICTED"), encoding="utf-8")
    P.build_raw_documents(wh, corpus, LIB)
    P.build_chunks(wh, LIB)
    lex = P.build_lexical_index(wh, LIB)
    emb = P.build_embeddings(wh, LIB, make_embedding_backend("deterministic"), "deterministic")
    # Purged by a compaction, nothing recomputed: the open chunks keep their tokens and vectors.
    assert (lex.metadata["chunks_analyzed"], emb.metadata["embedded"]) == (0, 0)
    assert len(lex.published.segments("tokens")) == len(emb.published.segments("vectors")) == 1
    assert {c.chunk_id for c in P.active_chunks(wh, LIB) if c.doc_id == f"{LIB}/memo"} == memo  # same ids
    for asset, table in ((P.LEXICAL, "tokens"), (P.EMBEDDINGS, "vectors")):
        rows = _index_rows(wh, asset, table)
        assert rows and not memo & {r["chunk_id"] for r in rows}, asset
        assert CANARY.lower() not in json.dumps(rows, default=repr, ensure_ascii=False).lower()
    assert P.build_embeddings(wh, LIB, make_embedding_backend("deterministic"), "deterministic") \
        .checks["restricted_never_embedded"].passed


def test_a_lexical_index_from_before_is_rewritten_without_restricted_tokens(tmp_path):
    corpus, _ = _library(tmp_path, {"open.md": "zebra revenue\n"}, {"s_x": ("margin plan", "RESTRICTED", "A")})
    wh = VersionedTables(tmp_path / "wh")
    _refresh(wh, corpus, extras=False)
    # The index as the previous release wrote it: tokens of every active chunk, no ``open_only``.
    lex = wh.latest(P.LEXICAL, LIB)
    chunks = P.sorted_active_chunks(wh, LIB, lex.manifest["metadata"]["chunks_version"])
    an = make_analyzer(lex.manifest["metadata"]["analyzer"])
    old = pa.table({"chunk_id": [c.chunk_id for c in chunks],
                    "tokens": pa.array([an.analyze(c.text, c.language or None) for c in chunks],
                                       pa.list_(pa.string()))})
    meta = {k: v for k, v in lex.manifest["metadata"].items() if k != "open_only"}
    wh.write(P.LEXICAL, LIB, {"tokens": old}, meta)
    assert CANARY.lower() in json.dumps(_index_rows(wh, P.LEXICAL, "tokens")).lower()
    again = P.build_lexical_index(wh, LIB)
    assert not again.metadata["reused"] and again.metadata["open_only"]
    assert CANARY.lower() not in json.dumps(_index_rows(wh, P.LEXICAL, "tokens")).lower()
    assert P.build_lexical_index(wh, LIB).metadata["reused"]


def test_restricted_documents_leave_no_row_id_offset_or_hash(tmp_path):
    """What the issue names: metadata values, offsets/lengths, the content_hash that confirms
    a guessed text, doc_state/doc_versions hashes and chunk ids of restricted documents."""
    corpus, _ = _library(tmp_path, {"open.md": "# Open\n\nzebra revenue\n"},
                         {"s_board": ("margin fell from 40.0% to 30.0%", "RESTRICTED", "Project Nightjar")})
    wh = _build(tmp_path, corpus, extras=False)
    raw = [r for r in wh.read(P.RAW, LIB, "documents").to_pylist() if r["doc_id"] != f"{LIB}/open"]
    secret_ids = {r["doc_id"] for r in raw}
    secret_hashes = {r[k] for r in raw for k in ("content_hash", "file_hash") if r.get(k)}  # file_hash: raw.py
    secret_chunks = {r["chunk_id"] for r in wh.read(P.CHUNKS, LIB, "chunks").to_pylist() if r["doc_id"] in secret_ids}
    state = wh.read(P.CHUNKS, LIB, "doc_state").to_pylist() + wh.read(P.CHUNKS, LIB, "doc_versions").to_pylist()
    secret_fps = {r[k] for r in state if r["doc_id"] in secret_ids
                  for k in ("fingerprint", "source_hash", "content_hash") if r.get(k)}
    blob = _dump(catalog_content(tmp_path / "wh" / "catalog.duckdb"))
    assert secret_ids and secret_hashes and secret_chunks and secret_fps
    for needle in [*secret_ids, *secret_hashes, *secret_chunks, *secret_fps, "Nightjar", "board", "30.0%"]:
        assert needle not in blob, needle
    con = duckdb.connect(str(tmp_path / "wh" / "catalog.duckdb"), read_only=True)
    try:
        assert con.execute(f"SELECT DISTINCT doc_id FROM chunks_{LIB}").fetchall() == [(f"{LIB}/open",)]
        for view in ("documents", "doc_state", "doc_versions"):
            assert con.execute(f"SELECT DISTINCT doc_id FROM {view}_{LIB}").fetchall() == [(f"{LIB}/open",)]
        assert con.execute(f"SELECT count(*) FROM lexical_tokens_{LIB}").fetchone()[0] == \
            con.execute(f"SELECT count(*) FROM chunks_{LIB} WHERE active").fetchone()[0]
    finally:
        con.close()


def test_first_run_after_upgrade_rewrites_an_old_catalog(tmp_path):
    corpus, _ = _library(tmp_path, {"open.md": "zebra open\n"}, {"s_x": ("zebra secret", "RESTRICTED", "A")})
    wh = _build(tmp_path, corpus, extras=False)
    path = tmp_path / "wh" / "catalog.duckdb"
    assert P.build_catalog(wh, [LIB], path)["rebuilt"] is False  # nothing changed: kept
    # A catalog as the previous release wrote it: same snapshots, no format, a table naming the hidden document.
    index = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
    index.pop("format")
    path.with_suffix(".json").write_text(json.dumps(index), encoding="utf-8")
    path.unlink()
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE redacted_documents (library VARCHAR, doc_id VARCHAR)")
        con.execute("INSERT INTO redacted_documents VALUES (?, ?)", [LIB, f"{LIB}/s_x {CANARY}"])
    out = P.build_catalog(wh, [LIB], path)
    assert out["rebuilt"] is True and CANARY.encode() not in path.read_bytes()
    assert "redacted_documents" not in catalog_content(path)["objects"]
    assert json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))["format"] == C.CATALOG_FORMAT
    assert P.build_catalog(wh, [LIB], path)["rebuilt"] is False


def test_raw_and_chunk_tables_are_owner_only(tmp_path):
    corpus, _ = _library(tmp_path, {"a.md": "zebra\n"}, {"s_x": ("margin plan", "RESTRICTED", "A")})
    wh_root = tmp_path / "wh"
    (wh_root / P.RAW).mkdir(parents=True)
    (wh_root / P.RAW).chmod(0o755)  # a folder from before the upgrade
    umask = os.umask(0)  # whatever the umask says
    try:
        _refresh(VersionedTables(wh_root), corpus, extras=False)
    finally:
        os.umask(umask)
    for asset in OWNER_ONLY_ASSETS:
        base = wh_root / asset
        for p in [base, *base.rglob("*")]:
            mode = stat.S_IMODE(p.stat().st_mode)
            assert mode == (0o700 if p.is_dir() else 0o600), (p, oct(mode))
    # Published tables hold no restricted text: the umask decides.
    lex = next((wh_root / P.LEXICAL).rglob("*.parquet"))
    assert stat.S_IMODE(lex.stat().st_mode) == 0o666


def test_through_dagster_no_published_file_catalog_or_event_holds_the_canary(tmp_path, monkeypatch):
    """The attacker's view of a whole materialization: the catalog, every published file,
    the event log (materialization and check metadata) — none holds the canary."""
    dg = pytest.importorskip("dagster")
    sys.path.insert(0, str(ROOT))
    from dagster._serdes import serialize_value

    import definitions
    from resources import WarehouseResource

    lib = "acme_policies"
    corpus = tmp_path / "corpus"
    shutil.copytree(DEMO_ROOT / lib, corpus / lib)
    (corpus / lib / "board_minutes.md").write_text(f"# Board\n\nThe board approved {CANARY} sale. " * 3,
                                                   encoding="utf-8")
    (corpus / lib / "board_minutes.meta.json").write_text(
        _sidecar(sensitivity="RESTRICTED", entity=CANARY, topic=f"{CANARY} topic", period="2031Q1"), encoding="utf-8")
    monkeypatch.setenv("RAGSPINE_EMBEDDING", "none")
    instance = dg.DagsterInstance.ephemeral()
    resource = WarehouseResource(root=str(tmp_path / "wh"), corpus_root=str(corpus))
    assert definitions.materialize_library(lib, instance, resource, definitions.QUIET).success
    events = "\n".join(serialize_value(e) for run in instance.get_runs() for e in instance.all_logs(run.run_id))
    assert "board_minutes" in events and CANARY.lower() not in events.lower()
    catalog = resource.catalog_path()
    assert CANARY.lower().encode() not in catalog.read_bytes().lower()
    content = _dump(catalog_content(catalog))
    assert CANARY.lower() not in content.lower() and "board_minutes" not in content and "2031Q1" not in content
    hits = [str(p) for p, text in _published_text(tmp_path / "wh") if CANARY.lower() in text.lower()]
    assert not hits, hits


def test_step_metadata_shows_no_chunk_id_of_a_restricted_chunk(tmp_path):
    """A chunk id embeds a hash of the chunk's text: the chunks step's preview and check
    examples (Dagster UI metadata) show a RESTRICTED chunk only by its document."""
    corpus, _ = _library(tmp_path, {"open.md": "# Open\n\nzebra revenue\n"},
                         {"s_board": ("margin fell from 40.0% to 30.0%", "RESTRICTED", "Project Nightjar")})
    wh = VersionedTables(tmp_path / "wh")
    P.build_raw_documents(wh, corpus, LIB)
    step = P.build_chunks(wh, LIB)
    rows = wh.read(P.CHUNKS, LIB, "chunks").to_pylist()
    secret = {r["chunk_id"] for r in rows if r["doc_id"] != f"{LIB}/open"}
    opened = {r["chunk_id"] for r in rows if r["doc_id"] == f"{LIB}/open"}
    blob = _dump({"metadata": step.metadata, "checks": {k: v.metadata for k, v in step.checks.items()}})
    assert secret and opened
    for cid in secret:
        assert cid not in blob and cid.split("#", 1)[1] not in blob
    assert any(cid in blob for cid in opened)  # the preview still shows open chunks
    assert f"{LIB}/s_board#[redacted" in blob and "30.0%" not in blob
