"""The adversarial suite: labels fail closed, relabels, non-interference, the catalog as a
trust boundary, one writer per library, retention, hostile files and names.

Everything here runs the engine's warehouse steps (no Dagster) on small corpora made
in the test, so it stays fast; the Dagster-level checks (event log, run queue) are in
``test_security_pipeline.py``.
"""

import json
import math
import os
import shutil
import time
from pathlib import Path

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragspine_pipeline.corpus import load_library
from ragspine_pipeline.ingest.documents import TITLE_MAX_CHARS, read_document
from ragspine_pipeline.ingest.parsers import ParseError, decode_text, parse_file
from ragspine_pipeline.paths import DEMO_ROOT
from ragspine_pipeline.retrieval.link.narrative_link import NarrativeIndexRetriever
from ragspine_pipeline.sensitivity import (
    LABELS_ENV,
    RESTRICTED_SENSITIVITY,
    LabelConfigError,
    is_restricted,
    known_labels,
    normalize_label,
    resolve_label,
)
from ragspine_pipeline.warehouse import pipeline as P
from ragspine_pipeline.warehouse.versioned import (
    FAIL_ENV,
    PublishInterrupted,
    VersionedTables,
    WarehouseBusy,
)

LIB = "lib"


def write_lib(root: Path, files: dict[str, str | bytes], lib: str = LIB) -> Path:
    folder = root / lib
    folder.mkdir(parents=True, exist_ok=True)
    for name, body in files.items():
        p = folder / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(body if isinstance(body, bytes) else body.encode("utf-8"))
    return folder


def meta(**kw) -> str:
    return json.dumps(kw, ensure_ascii=False)


def refresh(wh: VersionedTables, corpus: Path, lib: str = LIB, **chunk_kw):
    raw = P.build_raw_documents(wh, corpus, lib)
    P.build_chunks(wh, lib, **chunk_kw)
    P.build_lexical_index(wh, lib)
    P.publish_snapshot(wh, lib)
    return raw


def served(wh: VersionedTables, lib: str = LIB) -> NarrativeIndexRetriever:
    return NarrativeIndexRetriever(P.load_snapshot_index(wh, lib))


def served_doc_ids(wh: VersionedTables, lib: str = LIB) -> set[str]:
    return {c.doc_id for c in P.load_snapshot_index(wh, lib).retriever.chunks}


# ------------------------------------------------------------------ 1. labels fail closed
ODD = ["RESTRI\u200bCTED", "\ufeffRESTRICTED", "RESTRI\u00adCTED", "RESTRICTED\x00", "ＲＥＳＴＲＩＣＴＥＤ",
       "restricted", " Restricted\t"]
UNKNOWN = ["\u0420UBLIC", "PUBLIC?", "PUBLIK", "", "  ", "SECRET", ["PUBLIC"], ["RESTRICTED"], {"x": "PUBLIC"},
           1, 0, True, False, None, 1.5, math.nan]


@pytest.mark.parametrize("label", ODD)
def test_odd_spellings_of_restricted_stay_restricted(label):
    # Issue 25: only the plain spelling (ASCII case, ASCII spaces) is a label; the rest is
    # RESTRICTED and reported.
    assert is_restricted(label) and resolve_label([label], default="INTERNAL").restricted
    plain = label.strip(" ").upper() == RESTRICTED_SENSITIVITY
    assert (normalize_label(label) == RESTRICTED_SENSITIVITY) == plain
    assert bool(resolve_label([label], default="INTERNAL").problem) != plain


@pytest.mark.parametrize("label", UNKNOWN, ids=repr)
def test_unknown_or_malformed_labels_count_as_restricted(label):
    assert normalize_label(label) is None
    assert is_restricted(label)
    verdict = resolve_label([label], default="INTERNAL")
    assert verdict.restricted and verdict.problem


def test_known_labels_in_any_spelling_and_configurable_set(monkeypatch):
    assert normalize_label("ｐｕｂｌｉｃ") is None and not is_restricted(" Internal ")  # issue 25: plain spellings only
    assert resolve_label(["PUBLIC", "confidential", "INTERNAL"], default="INTERNAL").label == "CONFIDENTIAL"
    assert resolve_label([], default="INTERNAL").label == "INTERNAL"
    assert resolve_label([], default=None).restricted  # the library requires a label
    monkeypatch.setenv(LABELS_ENV, "open, team, RESTRICTED")
    assert known_labels() == ("OPEN", "TEAM", "RESTRICTED")
    assert not is_restricted("team") and is_restricted("PUBLIC")  # PUBLIC is not a label here
    monkeypatch.setenv(LABELS_ENV, "PUBLIC,INTERNAL")
    with pytest.raises(LabelConfigError):
        known_labels()


def test_every_metadata_source_is_read_and_the_most_restrictive_wins(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus"
    write_lib(corpus, {
        "side.md": "# Side\n\nzebra side text", "side.meta.json": meta(Sensitivity="RESTRICTED"),
        "front.md": "---\nSENSITIVITY: restricted\nentity: ACME_CN\n---\n# Front\n\nzebra front text",
        "page.html": '<html><head><meta name="Sensitivity" content="RESTRICTED"></head><body><p>zebra page</p></body></html>',
        "both.md": "---\nsensitivity: RESTRICTED\n---\nzebra both", "both.meta.json": meta(sensitivity="PUBLIC"),
        "listed.md": "zebra listed", "listed.meta.json": meta(sensitivity=["PUBLIC"]),
        "typo.md": "zebra typo", "typo.meta.json": meta(sensitivity="PUBLlC"),
        "open.md": "zebra open text", "open.meta.json": meta(sensitivity="public", Entity="ACME_US"),
    })
    wh = VersionedTables(tmp_path / "wh")
    raw = refresh(wh, corpus)
    assert served_doc_ids(wh) == {f"{LIB}/open"}
    check = raw.checks["sensitivity_labels_valid"]
    assert not check.passed
    assert sorted(f.split(":")[0] for f in check.metadata["files"]) == ["listed.md", "typo.md"]
    docs = {d.doc_id: d for d in load_library(corpus / LIB)[0]}
    assert docs[f"{LIB}/front"].metadata["entity"] == "ACME_CN" and docs[f"{LIB}/front"].text.startswith("# Front")
    assert docs[f"{LIB}/open"].metadata == {"entity": "ACME_US", "sensitivity": "PUBLIC"}
    # A library that requires labels: a document without one is RESTRICTED, and reported.
    monkeypatch.setenv("RAGSPINE_DEFAULT_SENSITIVITY", "required")
    (corpus / LIB / "open.meta.json").write_text(meta(entity="ACME_US"), encoding="utf-8")
    raw = refresh(wh, corpus)
    assert served_doc_ids(wh) == set()
    assert any(f.startswith("open.md") for f in raw.checks["sensitivity_labels_valid"].metadata["files"])


# --------------------------------------------------- 2. a failed relabel is not served stale
def test_relabel_that_fails_to_parse_withholds_the_old_public_version(tmp_path):
    corpus = tmp_path / "corpus"
    write_lib(corpus, {"memo.md": "zebra board memo", "memo.meta.json": meta(sensitivity="PUBLIC"),
                       "other.md": "zebra other", "other.meta.json": meta(sensitivity="PUBLIC")})
    wh = VersionedTables(tmp_path / "wh")
    refresh(wh, corpus)
    assert f"{LIB}/memo" in served_doc_ids(wh)
    (corpus / LIB / "memo.meta.json").write_text('{"sensitivity": "RESTRICTED",', encoding="utf-8")
    raw = refresh(wh, corpus)
    assert not raw.checks["parse_failures_zero"].passed
    assert raw.checks["parse_failures_zero"].metadata["files"][0].startswith("memo.md")
    assert served_doc_ids(wh) == {f"{LIB}/other"}
    assert f"{LIB}/memo" in {c.doc_id for c in P.active_chunks(wh, LIB)}  # stored, not served
    # The documented opt-out serves the last good version instead.
    P.build_chunks(wh, LIB, on_parse_error="serve_last_good")
    P.build_lexical_index(wh, LIB)
    P.publish_snapshot(wh, LIB)
    assert f"{LIB}/memo" in served_doc_ids(wh)


def _same_size_rewrite(path: Path, new: bytes) -> None:
    st = path.stat()
    assert len(new) == st.st_size
    path.write_bytes(new)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # as `cp -p` / `touch -r` leave it


def test_same_size_edits_with_preserved_mtime_are_seen(tmp_path):
    corpus = tmp_path / "corpus"
    write_lib(corpus, {"memo.md": "zebra quarterly memo", "memo.meta.json": '{"sensitivity": "PUBLIC"    }'})
    wh = VersionedTables(tmp_path / "wh")
    refresh(wh, corpus)
    assert f"{LIB}/memo" in served_doc_ids(wh)
    _same_size_rewrite(corpus / LIB / "memo.meta.json", b'{"sensitivity": "RESTRICTED"}')
    refresh(wh, corpus)
    assert served_doc_ids(wh) == set()
    _same_size_rewrite(corpus / LIB / "memo.meta.json", b'{"sensitivity": "INTERNAL"  }')
    _same_size_rewrite(corpus / LIB / "memo.md", b"zebra quarterly mamo")
    refresh(wh, corpus)
    assert [c.text for c in P.load_snapshot_index(wh, LIB).retriever.chunks] == ["zebra quarterly mamo"]


# ------------------------------------------------------------------ 4. non-interference
VOCAB = ["revenue", "margin", "zebra", "plant", "tariff", "lyon", "union", "深圳", "苏州", "工会", "营收"]


@st.composite
def corpora(draw):
    n = draw(st.integers(1, 6))
    docs = {}
    for i in range(n):
        words = draw(st.lists(st.sampled_from(VOCAB), min_size=1, max_size=30))
        docs[f"d{i}"] = (" ".join(words), draw(st.sampled_from(["PUBLIC", "INTERNAL"])),
                         draw(st.sampled_from(["A", "B"])))
    secret = {}
    for i in range(draw(st.integers(1, 3))):
        words = draw(st.lists(st.sampled_from(VOCAB), min_size=1, max_size=40))
        label = draw(st.sampled_from(["RESTRICTED", "restricted", "RESTRI\u200bCTED", "PUBLlC", "[]"]))
        # Issue 42: the hidden document is also written in each ingest form the reader
        # must fail closed on (an open label beside the fault, wherever one fits).
        secret[f"s{i}"] = (" ".join(words), label, draw(st.sampled_from(["A", "B"])), draw(st.sampled_from(FORMS)))
    return docs, secret


FORMS = ("sidecar", "lookalike_key", "typo_key", "tag_key", "fm_broken", "fm_cr_only", "case_sidecar", "ext_sidecar",
         "closed_schema", "html_dup", "html_namespace", "written_txt", "hard_link")
_TAGS = "".join(chr(0xE0000 + ord(c)) for c in "sensitivity")


def _form_files(d: str, text: str, label: str, ent: str, form: str) -> dict[str, str | tuple[str, str]]:
    """The files of one document written in ``form`` (a ``("link", name)`` value: a hard link)."""
    side = {f"{d}.meta.json": meta(sensitivity=label, entity=ent)}
    fm = {"lookalike_key": "s\u1d07nsitivity", "typo_key": "sensitivty", "tag_key": _TAGS}
    if form in fm:
        return {f"{d}.md": f"---\n{json.dumps(fm[form])}: PUBLIC\nentity: {ent}\n---\n{text}"}
    if form == "fm_broken":
        return {f"{d}.md": f"----\nsensitivity: RESTRICTED\n----\n{text}"}
    if form == "fm_cr_only":
        return {f"{d}.md": f"---\rsensitivity: RESTRICTED\r---\r{text}"}
    if form == "case_sidecar":
        return {f"{d}.md": text, f"{d.upper()}.META.JSON": meta(sensitivity="PUBLIC", entity=ent)}
    if form == "ext_sidecar":
        return {f"{d}.md": text, f"{d}.md.meta.json": meta(sensitivity="PUBLIC", entity=ent)}
    if form == "closed_schema":
        return {f"{d}.md": text, f"{d}.meta.json": meta(sensitivity="PUBLIC", entity=ent, label="RESTRICTED")}
    if form in ("html_dup", "html_namespace"):
        tag = ('<meta name="sensitivity" content="RESTRICTED" content="PUBLIC">' if form == "html_dup"
               else '<meta name="DC.sensitivity" content="RESTRICTED">')
        return {f"{d}.html": f"<html><head>{tag}</head><body><p>{text}</p></body></html>"}
    if form == "written_txt":
        return {f"{d}.txt": f"Sensitivity: RESTRICTED\n\n{text}"}
    if form == "hard_link":
        return {f"{d}.md": text, **side, f"{d}_alias.md": ("link", f"{d}.md"),
                f"{d}_alias.meta.json": meta(sensitivity="PUBLIC", entity=ent)}
    return {f"{d}.md": text, **side}


def _served_outputs(root: Path, docs: dict, queries: list[str]) -> str:
    """Served output over a fresh corpus + warehouse at ``root`` (the same path for both
    worlds, so source paths in the snippets agree)."""
    shutil.rmtree(root, ignore_errors=True)
    corpus = root / "corpus"
    files: dict[str, str | tuple[str, str]] = {}
    for d, (text, label, ent, *form) in docs.items():
        files.update(_form_files(d, text, label, ent, form[0] if form else "sidecar"))
    folder = write_lib(corpus, {n: b for n, b in files.items() if not isinstance(b, tuple)})
    for name, body in files.items():
        if isinstance(body, tuple):
            os.link(folder / body[1], folder / name)
    wh = VersionedTables(root / "wh")
    refresh(wh, corpus)
    r = served(wh)
    out = [r.retrieve(q, filters=f, top_k=10) for q in queries for f in (None, {"entity": "A"})]
    return json.dumps(out, ensure_ascii=False, sort_keys=True)


@settings(max_examples=12)
@given(corpora(), st.lists(st.lists(st.sampled_from(VOCAB), min_size=1, max_size=3).map(" ".join),
                           min_size=1, max_size=3))
def test_served_output_is_identical_with_or_without_restricted_documents(tmp_path_factory, corpus, queries):
    docs, secret = corpus
    root = tmp_path_factory.mktemp("worlds")
    with_secret = _served_outputs(root, {**docs, **secret}, queries)
    without = _served_outputs(root, docs, queries)
    assert with_secret == without


def test_the_reported_score_leak_is_closed(tmp_path):
    """Issue 9: a restricted document's words changed public scores ("深圳 工会" vs "苏州 工会")."""
    public = {"p": ("深圳 苏州 工会 营收", "PUBLIC", "A")}
    secret = {"s": ("深圳 深圳 深圳 工会 董事会", "RESTRICTED", "A")}
    queries = ["深圳 工会", "苏州 工会"]
    with_secret = _served_outputs(tmp_path / "w", {**public, **secret}, queries)
    assert with_secret == _served_outputs(tmp_path / "w", public, queries)


def test_a_library_of_only_restricted_documents_serves_nothing(tmp_path):
    corpus = tmp_path / "corpus"
    write_lib(corpus, {"s.md": "zebra secret", "s.meta.json": meta(sensitivity="RESTRICTED")})
    wh = VersionedTables(tmp_path / "wh")
    refresh(wh, corpus)
    assert served(wh).retrieve("zebra secret", top_k=5) == []


# ------------------------------------------------------------ 5. the catalog redacts by default
def _catalog_blob(path: Path) -> str:
    con = duckdb.connect(str(path), read_only=True)
    try:
        names = [r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()]
        names += [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()]
        return json.dumps({n: con.execute(f'SELECT * FROM "{n}"').fetchall() for n in names}, default=str,
                          ensure_ascii=False)
    finally:
        con.close()


def test_catalog_redacts_every_version_of_restricted_documents(tmp_path):
    corpus = tmp_path / "corpus"
    write_lib(corpus, {"memo.md": "# Memo QUARTZPUBLIC\n\nzebra first draft",
                       "memo.meta.json": meta(sensitivity="PUBLIC"),
                       "board.md": "# Board\n\nQUARTZBOARD minutes", "board.meta.json": meta(sensitivity="RESTRICTED"),
                       "open.md": "zebra open text"})
    wh = VersionedTables(tmp_path / "wh")
    refresh(wh, corpus)
    # Relabelled restricted later: its older, public version must be hidden too.
    (corpus / LIB / "memo.md").write_text("# Memo\n\nQUARTZLATER zebra final", encoding="utf-8")
    (corpus / LIB / "memo.meta.json").write_text(meta(sensitivity="RESTRICTED"), encoding="utf-8")
    refresh(wh, corpus)
    out = P.build_catalog(wh, [LIB], tmp_path / "catalog.duckdb")
    assert out["redacted"] and not out["errors"]
    blob = _catalog_blob(tmp_path / "catalog.duckdb")
    assert "QUARTZ" not in blob and "zebra open text" in blob
    con = duckdb.connect(str(tmp_path / "catalog.duckdb"), read_only=True)
    rows = con.execute(f"SELECT doc_id, version, text, redacted FROM chunks_{LIB} ORDER BY doc_id, version").fetchall()
    con.close()
    assert rows and not [r for r in rows if r[0].endswith(("memo", "board"))]  # no row of it, in any version
    # The unredacted catalog is opt-in, under its own name.
    P.build_catalog(wh, [LIB], tmp_path / "catalog_restricted.duckdb", include_restricted=True)
    assert "QUARTZBOARD" in _catalog_blob(tmp_path / "catalog_restricted.duckdb")


# ----------------------------------------------------------------- 6. one writer per library
def test_second_writer_waits_then_fails_clearly(tmp_path):
    import threading

    wh = VersionedTables(tmp_path)
    held, release = threading.Event(), threading.Event()

    def holder():
        with wh.lock(LIB):
            held.set()
            release.wait(30)

    t = threading.Thread(target=holder)
    t.start()
    held.wait(30)
    try:
        with pytest.raises(WarehouseBusy, match="RAGSPINE_LOCK_TIMEOUT"), wh.lock(LIB, timeout=0.2):
            pass
        with wh.lock("other", timeout=0.2):  # other libraries are not blocked
            pass
    finally:
        release.set()
        t.join()
    with wh.lock(LIB, timeout=5), wh.lock(LIB):  # re-entrant in one thread
        pass


def _writer(root: str, corpus: str, rounds: int, start) -> None:
    wh = VersionedTables(root)
    start.wait()
    for _ in range(rounds):
        refresh(wh, Path(corpus))
        for asset in (P.RAW, P.CHUNKS, P.LEXICAL, P.SNAPSHOT):
            wh.prune(asset, LIB, keep=1, retain_for=0)


def _mutator(corpus: str, rounds: int, start) -> None:
    folder = Path(corpus) / LIB
    start.wait()
    for i in range(rounds):
        (folder / f"m{i % 7}.md").write_text(f"zebra mutation {i} " + "plant " * (i % 5), encoding="utf-8")
        if i % 3 == 0:
            (folder / f"m{(i + 3) % 7}.md").unlink(missing_ok=True)
        time.sleep(0.005)


def test_two_writers_and_a_mutator_end_equal_to_a_fresh_build(tmp_path):
    import multiprocessing as mp

    corpus = tmp_path / "corpus"
    write_lib(corpus, {f"d{i}.md": f"zebra base document {i}" for i in range(5)})
    root = tmp_path / "wh"
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    procs = [ctx.Process(target=_writer, args=(str(root), str(corpus), 50, start)) for _ in range(2)]
    procs.append(ctx.Process(target=_mutator, args=(str(corpus), 100, start)))
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(600)
        assert p.exitcode == 0
    wh = VersionedTables(root)
    refresh(wh, corpus)  # the last state of the files, incrementally
    fresh = VersionedTables(tmp_path / "fresh")
    refresh(fresh, corpus)
    state = [(c.chunk_id, c.text) for c in P.served_chunks(wh, LIB, wh.latest(P.CHUNKS, LIB).version)]
    assert state == [(c.chunk_id, c.text) for c in P.served_chunks(fresh, LIB, fresh.latest(P.CHUNKS, LIB).version)]
    # The same snippets and scores (document versions differ: the history has more of them).
    q = [[{k: v for k, v in s.items() if k != "version"} for s in served(w).retrieve("zebra plant mutation", top_k=20)]
         for w in (wh, fresh)]
    assert q[0] and json.dumps(q[0], sort_keys=True) == json.dumps(q[1], sort_keys=True)


# ------------------------------------------------------------------------ 7. retention
def test_a_reader_holding_the_catalog_survives_compaction_and_pruning(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus"
    write_lib(corpus, {f"d{i}.md": f"zebra document {i}" for i in range(3)})
    wh = VersionedTables(tmp_path / "wh")
    refresh(wh, corpus)
    P.build_catalog(wh, [LIB], tmp_path / "catalog.duckdb")
    con = duckdb.connect(str(tmp_path / "catalog.duckdb"), read_only=True)
    before = con.execute(f"SELECT count(*) FROM chunks_{LIB} WHERE active").fetchone()[0]
    for i in range(20):  # > 16 segments: the tables compact
        (corpus / LIB / f"n{i}.md").write_text(f"zebra new {i}", encoding="utf-8")
        refresh(wh, corpus)
        for asset in (P.RAW, P.CHUNKS, P.LEXICAL, P.SNAPSHOT):
            wh.prune(asset, LIB, keep=1)  # default retention: one hour
    assert con.execute(f"SELECT count(*) FROM chunks_{LIB} WHERE active").fetchone()[0] == before
    assert con.execute(f"SELECT count(*) FROM lexical_tokens_{LIB}").fetchone()[0] == before
    for asset in (P.RAW, P.CHUNKS, P.LEXICAL, P.SNAPSHOT):
        wh.prune(asset, LIB, keep=1, retain_for=0)  # without retention the old files go ...
    with pytest.raises(duckdb.Error):  # ... and the held view cannot be read any more
        con.execute(f"SELECT count(*) FROM chunks_{LIB}").fetchone()
    con.close()


def test_failure_injection_covers_the_catalog(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus"
    write_lib(corpus, {"a.md": "zebra"})
    wh = VersionedTables(tmp_path / "wh")
    refresh(wh, corpus)
    path = tmp_path / "catalog.duckdb"
    P.build_catalog(wh, [LIB], path)
    before = path.read_bytes()
    (corpus / LIB / "b.md").write_text("zebra two", encoding="utf-8")
    refresh(wh, corpus)
    monkeypatch.setenv(FAIL_ENV, "catalog")
    with pytest.raises(PublishInterrupted):
        P.build_catalog(wh, [LIB], path)
    assert path.read_bytes() == before and not list(tmp_path.glob(".catalog.duckdb.*"))


# ------------------------------------------------------------------ 8-11. hostile input
def test_a_two_million_character_line_gets_a_short_title(tmp_path):
    corpus = tmp_path / "corpus"
    write_lib(corpus, {"long.txt": "营收" * 1_000_000})
    doc = read_document(corpus / LIB / "long.txt", LIB, root=corpus)
    assert len(doc.title) <= TITLE_MAX_CHARS and len(doc.text) == 2_000_000


def test_files_over_the_size_limit_are_parse_errors(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus"
    write_lib(corpus, {"big.md": "zebra " * 400, "small.md": "zebra"})
    monkeypatch.setenv("RAGSPINE_MAX_FILE_BYTES", "1000")
    wh = VersionedTables(tmp_path / "wh")
    raw = refresh(wh, corpus)
    (err,) = raw.checks["parse_failures_zero"].metadata["files"]
    assert err.startswith("big.md") and "limit" in err and served_doc_ids(wh) == {f"{LIB}/small"}


def test_raw_text_uses_64_bit_offsets(tmp_path):
    corpus = tmp_path / "corpus"
    write_lib(corpus, {"a.md": "zebra"})
    wh = VersionedTables(tmp_path / "wh")
    refresh(wh, corpus)
    import pyarrow as pa

    assert wh.read(P.RAW, LIB, "documents").schema.field("text").type == pa.large_string()


def test_library_names_map_to_distinct_views_and_a_bad_library_fails_alone(tmp_path):
    corpus = tmp_path / "corpus"
    wh = VersionedTables(tmp_path / "wh")
    libs = ["a b", "a%b", "a_b", "A_b", "ünï"]
    for lib in libs:
        write_lib(corpus, {"doc.md": f"zebra in {lib}"}, lib=lib)
        refresh(wh, corpus, lib)
    write_lib(corpus, {"doc.md": "zebra broken"}, lib="broken")
    refresh(wh, corpus, "broken")
    lex = wh.latest(P.LEXICAL, "broken")
    for f in lex.table_paths("tokens"):
        f.unlink()  # a library whose index files were lost
    out = P.build_catalog(wh, libs + ["broken"], tmp_path / "catalog.duckdb")
    assert list(out["errors"]) == ["broken"]
    con = duckdb.connect(str(tmp_path / "catalog.duckdb"), read_only=True)
    views = dict(((lib, t), v) for lib, t, v in con.execute("SELECT * FROM catalog_views").fetchall())
    texts = {lib: con.execute(f'SELECT text FROM "{views[(lib, "documents")]}"').fetchone()[0] for lib in libs}
    con.close()
    assert len({views[(lib, "chunks")] for lib in libs}) == len(libs)
    assert texts == {lib: f"zebra in {lib}" for lib in libs}
    assert views[("a_b", "chunks")] == "chunks_a_b"  # plain names stay readable


def test_symlinks_out_of_the_corpus_are_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("zebra host secret", encoding="utf-8")
    (outside / "x.meta.json").write_text(meta(sensitivity="PUBLIC"), encoding="utf-8")
    corpus = tmp_path / "corpus"
    folder = write_lib(corpus, {"ok.md": "zebra fine", "inner.md": "zebra inner", "x.md": "zebra x"})
    (folder / "leak.txt").symlink_to(outside / "secret.txt")
    (folder / "alias.md").symlink_to(folder / "inner.md")  # inside the corpus: allowed
    (folder / "x.meta.json").symlink_to(outside / "x.meta.json")
    wh = VersionedTables(tmp_path / "wh")
    raw = refresh(wh, corpus)
    errs = sorted(raw.checks["parse_failures_zero"].metadata["files"])
    assert [e.split(":")[0] for e in errs] == ["leak.txt", "x.md"] and all("outside the corpus" in e for e in errs)
    assert served_doc_ids(wh) == {f"{LIB}/ok", f"{LIB}/inner", f"{LIB}/alias"}


def test_byte_order_marks_and_utf16(tmp_path):
    assert decode_text("\ufeff# Title\nbody".encode()) == "# Title\nbody"
    assert decode_text("\ufeffПривет".encode("utf-16-le")) == "Привет"
    assert decode_text("\ufeff营收".encode("utf-16-be")) == "营收"
    corpus = tmp_path / "corpus"
    write_lib(corpus, {"a.md": "\ufeff# Заголовок\n\nтекст".encode(), "b.txt": "Windows notes".encode("utf-16")})
    docs = {d.doc_id: d for d in load_library(corpus / LIB)[0]}
    assert docs[f"{LIB}/a"].title == "Заголовок" and not docs[f"{LIB}/a"].text.startswith("\ufeff")
    assert docs[f"{LIB}/b"].text == "Windows notes"
    with pytest.raises(ParseError, match="UTF-8"):
        decode_text(b"\xc3\x28")
    assert parse_file(corpus / LIB / "b.txt") == "Windows notes"


@pytest.mark.parametrize("value", ['{"entity": NaN}', '{"entity": {"a": 1}}', '{"period": [2023]}',
                                   '{"topic": true}', '{"entity": Infinity}', '{"note": NaN}'])
def test_sidecar_values_that_are_not_scalars_are_errors(tmp_path, value):
    corpus = tmp_path / "corpus"
    write_lib(corpus, {"a.md": "zebra", "a.meta.json": value, "ok.md": "fine"})
    docs, errors = load_library(corpus / LIB)
    assert [Path(e.path).name for e in errors] == ["a.md"] and [d.doc_id for d in docs] == [f"{LIB}/ok"]


def test_duplicate_ids_are_named_by_path_in_the_library(tmp_path):
    corpus = tmp_path / "corpus"
    write_lib(corpus, {"x.md": "zebra one", "sub/x.txt": "zebra two"})
    wh = VersionedTables(tmp_path / "wh")
    raw = refresh(wh, corpus)
    (err,) = raw.checks["parse_failures_zero"].metadata["files"]
    assert "duplicate document id" in err and ("sub/x.txt" in err or "x.md already" in err)
    assert str(tmp_path) not in err


def test_hostile_corpus_copy_of_the_demo_still_builds(tmp_path):
    """The demo corpus plus one of each hostile file: the library still publishes."""
    corpus = tmp_path / "corpus"
    shutil.copytree(DEMO_ROOT / "acme_reports", corpus / LIB)
    write_lib(corpus, {"bom.md": "\ufeffzebra".encode(), "bad.txt": b"\xc3\x28", "nan.md": "zebra",
                       "nan.meta.json": '{"entity": NaN}', "line.txt": "营收" * 50_000})
    wh = VersionedTables(tmp_path / "wh")
    raw = refresh(wh, corpus)
    assert raw.metadata["parse_failures"] == 2
    assert served(wh).retrieve("营收", top_k=3)


def test_engine_only_store_withholds_a_document_that_stops_parsing(tmp_path):
    from ragspine_pipeline.corpus import ingest_folder
    from ragspine_pipeline.retrieval.chunking.chunk_store import ChunkStore

    corpus = tmp_path / "corpus"
    folder = write_lib(corpus, {"memo.md": "zebra memo", "memo.meta.json": meta(sensitivity="PUBLIC"),
                                "other.md": "zebra other"})
    store = ChunkStore(str(tmp_path / "chunks.duckdb"))
    store.init_schema()
    try:
        ingest_folder(store, folder)
        (folder / "memo.meta.json").write_text('{"sensitivity": "RESTRICTED"', encoding="utf-8")
        ingest_folder(store, folder)
        assert {c.doc_id for c in store.iter_chunks()} == {f"{LIB}/other"}
        assert any(c.doc_id == f"{LIB}/memo" for c in store.iter_chunks(include_inactive=True))  # still stored
        (folder / "memo.meta.json").write_text(meta(sensitivity="RESTRICTED"), encoding="utf-8")
        ingest_folder(store, folder)  # it parses again: served again, with its new label
        assert {c.doc_id: c.sensitivity for c in store.iter_chunks()}[f"{LIB}/memo"] == "RESTRICTED"
    finally:
        store.close()
    # The opt-out keeps serving the last good version.
    from ragspine_pipeline.corpus import ingest_documents, load_library

    (folder / "memo.meta.json").write_text(meta(sensitivity="PUBLIC"), encoding="utf-8")
    store = ChunkStore(str(tmp_path / "optout.duckdb"))
    store.init_schema()
    try:
        ingest_folder(store, folder)
        (folder / "memo.meta.json").write_text("{broken", encoding="utf-8")
        docs, errors = load_library(folder)
        ingest_documents(store, docs, scope_prefix=f"{LIB}/", errors=errors, on_parse_error="serve_last_good")
        assert {c.doc_id for c in store.iter_chunks()} == {f"{LIB}/memo", f"{LIB}/other"}
    finally:
        store.close()


def _refresh_forever(root: str, corpus: str, started) -> None:
    wh = VersionedTables(root)
    i = 0
    while True:
        (Path(corpus) / LIB / f"k{i % 4}.md").write_text(f"zebra kill round {i}", encoding="utf-8")
        started.set()
        refresh(wh, Path(corpus))
        wh.prune(P.CHUNKS, LIB, keep=1, retain_for=0)
        i += 1


def test_kill_minus_nine_at_random_points_loses_nothing(tmp_path):
    """A writer killed mid-step leaves the last published versions readable, its lock
    released, and the next refresh equal to a fresh build."""
    import multiprocessing as mp
    import random
    import signal

    corpus = tmp_path / "corpus"
    write_lib(corpus, {f"d{i}.md": f"zebra base {i}" for i in range(4)})
    root = tmp_path / "wh"
    ctx = mp.get_context("spawn")
    rng = random.Random(9)
    for _ in range(8):
        started = ctx.Event()
        proc = ctx.Process(target=_refresh_forever, args=(str(root), str(corpus), started))
        proc.start()
        assert started.wait(120)
        time.sleep(rng.uniform(0.0, 0.4))
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(60)
        wh = VersionedTables(root)
        if wh.latest(P.SNAPSHOT, LIB) is not None:  # whatever was published still serves
            served(wh).retrieve("zebra", top_k=3)
    wh = VersionedTables(root)
    with wh.lock(LIB, timeout=5):  # the killed writer's lock is gone with it
        pass
    refresh(wh, corpus)
    fresh = VersionedTables(tmp_path / "fresh")
    refresh(fresh, corpus)
    got = [(c.chunk_id, c.text) for c in P.served_chunks(wh, LIB, wh.latest(P.CHUNKS, LIB).version)]
    assert got == [(c.chunk_id, c.text) for c in P.served_chunks(fresh, LIB, fresh.latest(P.CHUNKS, LIB).version)]


def test_restricted_text_is_never_sent_to_the_embedding_model(tmp_path):
    from ragspine_pipeline.retrieval.vector.embedding_backends import (
        backend_model_id,
        make_embedding_backend,
    )

    class Recording:
        """The deterministic backend, recording every text it is asked to embed."""

        def __init__(self):
            self.inner = make_embedding_backend("deterministic")
            self.model_id = backend_model_id(self.inner)
            self.seen: list[str] = []

        def embed_texts(self, texts):
            self.seen.extend(texts)
            return self.inner.embed_texts(texts)

    corpus = tmp_path / "corpus"
    write_lib(corpus, {"open.md": "zebra open", "s.md": "QUARTZ zebra secret", "s.meta.json": meta(sensitivity="RESTRICTED"),
                       "odd.md": "QUARTZ odd", "odd.meta.json": meta(sensitivity="RESTRI\u200cCTEDX")})
    wh = VersionedTables(tmp_path / "wh")
    P.build_raw_documents(wh, corpus, LIB)
    P.build_chunks(wh, LIB)
    P.build_lexical_index(wh, LIB)
    backend = Recording()
    res = P.build_embeddings(wh, LIB, backend, "deterministic")
    assert backend.seen == ["zebra open"] and res.metadata["count"] == 1
    assert res.checks["restricted_never_embedded"].passed
    assert res.checks["restricted_never_embedded"].metadata["restricted_chunks"] == 2
    P.publish_snapshot(wh, LIB)
    index = P.load_snapshot_index(wh, LIB)
    assert [c.doc_id for c in index.retriever.chunks] == [f"{LIB}/open"]
    assert NarrativeIndexRetriever(index).retrieve("QUARTZ zebra", top_k=5)[0]["scores"]["vector"] is not None


def test_queries_have_a_length_limit_with_a_clear_message(tmp_path, monkeypatch):
    from ragspine_pipeline.retrieval.limits import MAX_QUERY_CHARS_ENV, QueryTooLong
    from ragspine_pipeline.retrieval.link.multi_index import MultiIndexRetriever

    corpus = tmp_path / "corpus"
    for lib in ("a", "b"):
        write_lib(corpus, {"doc.md": f"zebra {lib}"}, lib=lib)
    wh = VersionedTables(tmp_path / "wh")
    for lib in ("a", "b"):
        refresh(wh, corpus, lib)
    one = served(wh, "a")
    many = MultiIndexRetriever({"a": one, "b": served(wh, "b")})
    for r in (one, many):
        assert r.retrieve("zebra " * 600, top_k=1)  # 3,600 characters: fine
        with pytest.raises(QueryTooLong, match=MAX_QUERY_CHARS_ENV):
            r.retrieve("营收" * 1_000_000, top_k=1)
        with pytest.raises(TypeError):
            r.retrieve(["zebra"], top_k=1)
    monkeypatch.setenv(MAX_QUERY_CHARS_ENV, "10")
    with pytest.raises(QueryTooLong, match="maximum is 10"):
        one.retrieve("zebra zebra zebra", top_k=1)


def test_unknown_language_metadata_is_a_parse_error_not_a_silent_rule(tmp_path):
    corpus = tmp_path / "corpus"
    write_lib(corpus, {"a.md": "zebra", "a.meta.json": meta(language="englsh"), "b.md": "Привет мир",
                       "b.meta.json": meta(language="ru")})
    docs, errors = load_library(corpus / LIB)
    # Issue 42: the message names the key and the kind of problem, never the value.
    assert [Path(e.path).name for e in errors] == ["a.md"] and "'language'" in errors[0].error
    assert "englsh" not in errors[0].error
    assert [d.metadata["language"] for d in docs] == ["ru"]
