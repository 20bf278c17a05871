"""Issue 25 (RESTRICTED, round 3), the ingest side, from the attacker's view.

1. a symlink into another library is refused by both readers; a link inside one library
   takes the stricter of its own label and its target's;
2. a metadata key that only imitates a known key (zero-width, look-alike, full-width,
   NUL) makes the document RESTRICTED and fails ``sensitivity_labels_valid``; HTML
   ``name``, ``property`` and ``http-equiv`` meta forms are all read;
3. only plain spellings of open labels are open;
5. a sidecar that cannot be read withholds its one document; the library still builds.

Every corpus carries a canary word in restricted text and metadata; the served output
(snippets of the published index), the step metadata and the check results must never
show it, and the checks must fail naming the file.
"""

import json
import os
from pathlib import Path

import pytest
from test_security import meta, refresh, served, served_doc_ids, write_lib

from ragspine_pipeline.corpus import load_library
from ragspine_pipeline.ingest.documents import read_document
from ragspine_pipeline.ingest.metadata_keys import match_key
from ragspine_pipeline.paths import DEMO_ROOT
from ragspine_pipeline.sensitivity import (
    LABELS_ENV,
    LabelConfigError,
    effective_label,
    is_restricted,
    normalize_label,
    resolve_label,
    skeleton,
)
from ragspine_pipeline.warehouse.versioned import VersionedTables

CANARY = "OKAPICANARY"
LIB = "lib"
SECRET_TEXT = f"# Board minutes\n\n{CANARY} the board approved the sale of the Lyon plant for {CANARY} reasons."
OPEN_TEXT = "# Open memo\n\nthe board approved the canteen menu for the Lyon plant."
QUERIES = [CANARY, "board approved sale Lyon plant", "Lyon plant"]


def build(tmp_path: Path, corpus: Path, lib: str = LIB):
    """The library through the real warehouse steps; (raw step result, served snippets JSON)."""
    wh = VersionedTables(tmp_path / "wh")
    raw = refresh(wh, corpus, lib)
    r = served(wh, lib)
    out = json.dumps([r.retrieve(q, top_k=20) for q in QUERIES], ensure_ascii=False)
    return wh, raw, out


def assert_no_canary(raw, out: str) -> None:
    assert CANARY not in out
    assert CANARY not in json.dumps(raw.metadata, ensure_ascii=False, default=str)
    for check in raw.checks.values():
        assert CANARY not in json.dumps(check.metadata, ensure_ascii=False, default=str)


def failing_files(raw, check: str) -> list[str]:
    outcome = raw.checks[check]
    names = sorted(f.split(":")[0] for f in outcome.metadata["files"])
    assert outcome.passed == (not names)
    return names


def engine_view(folder: Path, lib: str = LIB) -> tuple[dict[str, str], list[str]]:
    """The engine-only reader: doc_id -> label, and the names of the refused files."""
    docs, errors = load_library(folder, lib)
    return {d.doc_id: d.metadata["sensitivity"] for d in docs}, sorted(Path(e.path).name for e in errors)


# ------------------------------------------------------------------ 1. symlinks between libraries
def test_links_into_another_library_are_refused_by_both_readers(tmp_path):
    corpus = tmp_path / "corpus"
    secret = write_lib(corpus, {"s.md": SECRET_TEXT, "s.meta.json": meta(sensitivity="RESTRICTED", entity=CANARY)},
                       lib="secret")
    pub = write_lib(corpus, {"ok.md": OPEN_TEXT, "ok.meta.json": meta(sensitivity="PUBLIC"),
                             "link_across.meta.json": meta(sensitivity="PUBLIC"),
                             "own.md": "the Lyon plant canteen", "sub/deep.md": "Lyon plant roof"}, lib="pub")
    (pub / "link_across.md").symlink_to(Path("..") / "secret" / "s.md")
    (pub / "own.meta.json").symlink_to(secret / "s.meta.json")  # a sidecar borrowed from another library
    (pub / "sub" / "up.md").symlink_to(Path("..") / ".." / "secret" / "s.md")
    (pub / "linked_dir").symlink_to(secret, target_is_directory=True)  # never descended into
    _, raw, out = build(tmp_path, corpus, "pub")
    assert_no_canary(raw, out)
    refused = failing_files(raw, "parse_failures_zero")
    assert refused == ["link_across.md", "own.md", "sub/up.md"]
    assert all("outside the corpus library" in f for f in raw.checks["parse_failures_zero"].metadata["files"])
    labels, errors = engine_view(pub, "pub")
    assert errors == ["link_across.md", "own.md", "up.md"]  # the engine-only path refuses the same files
    assert labels == {"pub/ok": "PUBLIC", "pub/deep": "INTERNAL"}
    assert served_doc_ids(VersionedTables(tmp_path / "wh"), "pub") == set(labels)


def test_a_link_inside_one_library_takes_the_stricter_label(tmp_path):
    corpus = tmp_path / "corpus"
    folder = write_lib(corpus, {
        "secret.md": SECRET_TEXT, "secret.meta.json": meta(sensitivity="RESTRICTED"),
        "alias.meta.json": meta(sensitivity="PUBLIC", topic="alias"),  # the link claims PUBLIC
        "open.md": OPEN_TEXT, "open.meta.json": meta(sensitivity="PUBLIC"),
        "open_alias.meta.json": meta(sensitivity="CONFIDENTIAL"),  # stricter than the target: kept
        "front.md": f"---\nsensitivity: RESTRICTED\n---\n{CANARY} front matter secret",
        "front_alias.meta.json": meta(sensitivity="PUBLIC"),
    })
    (folder / "alias.md").symlink_to("secret.md")
    (folder / "bare_alias.md").symlink_to("secret.md")  # no sidecar: INTERNAL alone, RESTRICTED target
    (folder / "open_alias.md").symlink_to("open.md")
    (folder / "no_label_alias.md").symlink_to("open.md")  # the default (INTERNAL) is stricter than PUBLIC
    (folder / "front_alias.md").symlink_to("front.md")  # the label inside the target file counts too
    wh, raw, out = build(tmp_path, corpus)
    assert_no_canary(raw, out)
    expected = {"secret": "RESTRICTED", "alias": "RESTRICTED", "bare_alias": "RESTRICTED", "open": "PUBLIC",
                "open_alias": "CONFIDENTIAL", "no_label_alias": "INTERNAL", "front": "RESTRICTED",
                "front_alias": "RESTRICTED"}
    labels, errors = engine_view(folder)
    assert errors == [] and labels == {f"{LIB}/{k}": v for k, v in expected.items()}
    assert served_doc_ids(wh) == {f"{LIB}/{k}" for k, v in expected.items() if not is_restricted(v)}
    assert raw.checks["parse_failures_zero"].passed and raw.checks["sensitivity_labels_valid"].passed
    assert read_document(folder / "alias.md", LIB).metadata["topic"] == "alias"  # the link's own metadata kept


def test_relabelling_a_link_target_reaches_the_link_on_the_next_refresh(tmp_path):
    corpus = tmp_path / "corpus"
    folder = write_lib(corpus, {"t.md": SECRET_TEXT, "t.meta.json": meta(sensitivity="PUBLIC"),
                                "l.meta.json": meta(sensitivity="PUBLIC"), "open.md": OPEN_TEXT})
    (folder / "l.md").symlink_to("t.md")
    wh, raw, out = build(tmp_path, corpus)
    assert served_doc_ids(wh) == {f"{LIB}/t", f"{LIB}/l", f"{LIB}/open"}
    (folder / "t.meta.json").write_text(meta(sensitivity="RESTRICTED"), encoding="utf-8")  # only the target's sidecar
    raw = refresh(wh, corpus)
    assert raw.metadata["parsed"] == 2  # the target and the link: both re-read, nothing else
    assert served_doc_ids(wh) == {f"{LIB}/open"}
    assert_no_canary(raw, json.dumps([served(wh).retrieve(q, top_k=20) for q in QUERIES]))

def test_a_link_whose_target_has_a_bad_label_is_reported(tmp_path):
    corpus = tmp_path / "corpus"
    folder = write_lib(corpus, {"t.md": SECRET_TEXT, "t.meta.json": meta(sensitivity="PUB\u200bLIC"),
                                "l.meta.json": meta(sensitivity="PUBLIC")})
    (folder / "l.md").symlink_to("t.md")
    wh, raw, out = build(tmp_path, corpus)
    assert_no_canary(raw, out)
    assert failing_files(raw, "sensitivity_labels_valid") == ["l.md", "t.md"]
    assert served_doc_ids(wh) == set()


# ------------------------------------------------------------------ 2. misspelt label keys
MISSPELT_KEYS = ["sensitiv\u200bity", "sens\u0456tivity", "ｓｅｎｓｉｔｉｖｉｔｙ", "sensitivity\x00", "\ufeffsensitivity",
                 "sensi\u00adtivity", "Sensitivity\t", "\u0455\u0435n\u0455\u0456t\u0456v\u0456t\u0443",
                 "s\u0435nsitivity", "sensitivity_", "SENSITIV\u0399TY", "sensitivity\u00a0",
                 "ent\u200bity", "t\u0456tle", "top\u0456c", "ＧＥＯＧＲＡＰＨＹ", "peri\u03bfd", "langua\u0261e"]


@pytest.mark.parametrize("key", MISSPELT_KEYS, ids=ascii)
def test_keys_that_imitate_a_known_key_are_misspelt(key):
    assert match_key(key).misspelt, key


@pytest.mark.parametrize("key", ["sensitivity", "Sensitivity", " SENSITIVITY ", "Title", "entity"])
def test_known_keys_as_written(key):
    m = match_key(key)
    assert m.exact and not m.misspelt and m.known == key.strip().lower()


@pytest.mark.parametrize("key", ["description", "author", "og:title", "sensitivity_notes", "entities", "x"])
def test_other_keys_are_extra_metadata(key):
    assert match_key(key).known == ""


def _html(head: str, body: str) -> str:
    return f"<html><head>{head}</head><body><p>{body}</p></body></html>"


def test_misspelt_keys_and_every_meta_form_fail_closed_through_the_pipeline(tmp_path):
    corpus = tmp_path / "corpus"
    files = {
        "open.md": OPEN_TEXT, "open.meta.json": meta(sensitivity="PUBLIC", entity="ACME"),
        # The label is there but under a key that only looks right: RESTRICTED, reported.
        "zw.md": SECRET_TEXT, "zw.meta.json": meta(**{"sensitiv\u200bity": "RESTRICTED"}),
        "cyr.md": SECRET_TEXT, "cyr.meta.json": meta(**{"sens\u0456tivity": "RESTRICTED"}),
        "wide.md": SECRET_TEXT, "wide.meta.json": meta(**{"ｓｅｎｓｉｔｉｖｉｔｙ": "RESTRICTED"}),
        "nul.md": SECRET_TEXT, "nul.meta.json": meta(**{"sensitivity\x00": "RESTRICTED"}),
        # Even with a correct PUBLIC label beside it, a misspelt key withholds the document.
        "ent.md": SECRET_TEXT, "ent.meta.json": meta(sensitivity="PUBLIC", **{"ent\u0456ty": CANARY}),
        "fm.md": f"---\nsensitiv\u200bity: RESTRICTED\n---\n{SECRET_TEXT}",
        "fm_title.md": f"---\nt\u0456tle: {CANARY}\nsensitivity: PUBLIC\n---\n{SECRET_TEXT}",
        "html_name.html": _html('<meta name="sensitiv&#x200b;ity" content="RESTRICTED">', SECRET_TEXT),
        # Every <meta> form is a label: read as written, these give RESTRICTED without a problem.
        "html_prop.html": _html('<meta property="sensitivity" content="RESTRICTED">', SECRET_TEXT),
        "html_equiv.html": _html('<meta http-equiv="Sensitivity" content="RESTRICTED">', SECRET_TEXT),
        "html_nocontent.html": _html('<meta name="sensitivity" value="PUBLIC">', SECRET_TEXT),
        # A key given by an attribute that only looks like ``name``: unreadable, so RESTRICTED.
        "html_attr.html": _html('<meta n\u0430me="sensitivity" content="PUBLIC">', SECRET_TEXT),
    }
    write_lib(corpus, files)
    wh, raw, out = build(tmp_path, corpus)
    assert_no_canary(raw, out)
    assert served_doc_ids(wh) == {f"{LIB}/open"}
    assert failing_files(raw, "sensitivity_labels_valid") == [
        "cyr.md", "ent.md", "fm.md", "fm_title.md", "html_attr.html", "html_name.html", "html_nocontent.html",
        "nul.md", "wide.md", "zw.md"]
    assert raw.checks["parse_failures_zero"].passed
    labels, errors = engine_view(corpus / LIB)
    assert errors == [] and {k for k, v in labels.items() if not is_restricted(v)} == {f"{LIB}/open"}
    docs = {d.doc_id: d for d in load_library(corpus / LIB)[0]}
    assert "ent\u0456ty" not in docs[f"{LIB}/ent"].metadata  # the imitating key is not kept as extra metadata
    assert "not written exactly as 'sensitivity'" in docs[f"{LIB}/zw"].label_problem


def test_a_repeated_key_is_refused_not_last_wins(tmp_path):
    """JSON and YAML keep the last of two equal keys: a second ``sensitivity`` would drop the first."""
    corpus = tmp_path / "corpus"
    write_lib(corpus, {
        "open.md": OPEN_TEXT,
        "dup.md": SECRET_TEXT, "dup.meta.json": '{"sensitivity": "RESTRICTED", "sensitivity": "PUBLIC"}',
        "fm.md": f"---\nsensitivity: RESTRICTED\nsensitivity: PUBLIC\n---\n{SECRET_TEXT}",
        "nested.md": "Lyon plant notes", "nested.meta.json": '{"sensitivity": "PUBLIC", "x": {"a": 1, "a": 2}}',
    })
    wh, raw, out = build(tmp_path, corpus)
    assert_no_canary(raw, out)
    assert failing_files(raw, "parse_failures_zero") == ["dup.md", "fm.md", "nested.md"]
    assert all("repeats a key" in f for f in raw.checks["parse_failures_zero"].metadata["files"])
    assert served_doc_ids(wh) == {f"{LIB}/open"}
    assert engine_view(corpus / LIB)[1] == ["dup.md", "fm.md", "nested.md"]

# ------------------------------------------------------------------ 3. odd spellings of open labels
ODD_OPEN = ["PUB\u200bLIC", "ＰＵＢＬＩＣ", "\u00a0PUBLIC", "PUBLIC\t", "PUBLIC\x00", "PUB\u00adLIC", "\ufeffPUBLIC",
            "\u0420UBLIC", "PUBL\u0406C", "INTERN\u0410L", "ｉｎｔｅｒｎａｌ", "Internal\u2060", "\u212aONFIDENTIAL",
            "PUBLIC\n", "P U B L I C", "PUBLIC\u3000"]


@pytest.mark.parametrize("label", ODD_OPEN, ids=ascii)
def test_odd_spellings_of_open_labels_are_restricted_and_reported(label):
    assert normalize_label(label) is None and is_restricted(label)
    assert effective_label(label, "INTERNAL") == "RESTRICTED"
    verdict = resolve_label([label], default="INTERNAL")
    assert verdict.restricted and verdict.problem


@pytest.mark.parametrize("label,canon", [("PUBLIC", "PUBLIC"), ("public", "PUBLIC"), ("  Internal ", "INTERNAL"),
                                          ("confidential", "CONFIDENTIAL"), ("RESTRICTED", "RESTRICTED")])
def test_plain_spellings_read_as_themselves(label, canon):
    assert normalize_label(label) == canon and effective_label(label, "INTERNAL") == canon
    assert normalize_label(canon) == canon  # a stored canonical label reads as itself
    assert resolve_label([label], default="INTERNAL") == resolve_label([canon], default="INTERNAL")
    assert not resolve_label([label], default="INTERNAL").problem


def test_an_odd_spelling_is_named_but_an_unknown_value_is_not_echoed():
    assert "PUBLIC" in resolve_label(["PUB\u200bLIC"], default=None).problem
    assert CANARY not in resolve_label([CANARY], default=None).problem
    assert skeleton("ＰＵＢ\u200bＬＩＣ") == skeleton("public")


def test_declared_labels_are_open_only_as_written(monkeypatch):
    monkeypatch.setenv(LABELS_ENV, "open, team, RESTRICTED")
    assert normalize_label("Team") == "TEAM" and not is_restricted(" team ")
    assert is_restricted("t\u0435am") and is_restricted("ＴＥＡＭ") and is_restricted("TE\u200bAM")
    monkeypatch.setenv(LABELS_ENV, "open, te\u200bam, RESTRICTED")
    with pytest.raises(LabelConfigError, match="invisible"):
        normalize_label("open")


def test_odd_open_spellings_never_serve_through_the_pipeline(tmp_path):
    corpus = tmp_path / "corpus"
    files = {"open.md": OPEN_TEXT, "open.meta.json": meta(sensitivity=" public ")}
    for i, label in enumerate(ODD_OPEN):
        files[f"odd{i:02d}.md"] = SECRET_TEXT
        files[f"odd{i:02d}.meta.json"] = meta(sensitivity=label, topic=CANARY)
    files["fm.md"] = f"---\nsensitivity: \"PUB\\u200bLIC\"\n---\n{SECRET_TEXT}"
    files["page.html"] = _html('<meta name="sensitivity" content="ＰＵＢＬＩＣ">', SECRET_TEXT)
    write_lib(corpus, files)
    wh, raw, out = build(tmp_path, corpus)
    assert_no_canary(raw, out)
    assert served_doc_ids(wh) == {f"{LIB}/open"}
    assert failing_files(raw, "sensitivity_labels_valid") == sorted(
        [f"odd{i:02d}.md" for i in range(len(ODD_OPEN))] + ["fm.md", "page.html"])


# ------------------------------------------------------------------ 5. unreadable sidecars
def test_an_unreadable_sidecar_withholds_its_document_and_the_library_builds(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus"
    folder = write_lib(corpus, {"open.md": OPEN_TEXT, "open.meta.json": meta(sensitivity="PUBLIC")})
    names = ("as_dir", "dangling", "fifo", "io_error")
    for n in names:
        write_lib(corpus, {f"{n}.md": SECRET_TEXT, f"{n}.meta.json": meta(sensitivity="PUBLIC")})
    wh, raw, out = build(tmp_path, corpus)
    assert CANARY in out  # first the documents are PUBLIC and served ...
    # ... then each is relabelled in a way that leaves its label unreadable.
    (folder / "as_dir.meta.json").unlink()
    (folder / "as_dir.meta.json").mkdir()
    (folder / "dangling.meta.json").unlink()
    (folder / "dangling.meta.json").symlink_to("nowhere.meta.json")
    (folder / "fifo.meta.json").unlink()
    os.mkfifo(folder / "fifo.meta.json")  # reading it would block the build forever
    (folder / "io_error.meta.json").write_text(meta(sensitivity="RESTRICTED"), encoding="utf-8")
    real_read = Path.read_bytes

    def failing_read(self: Path) -> bytes:
        if self.name == "io_error.meta.json":
            raise OSError(5, "Input/output error")
        return real_read(self)

    monkeypatch.setattr(Path, "read_bytes", failing_read)
    raw = refresh(wh, corpus)
    r = served(wh)
    out = json.dumps([r.retrieve(q, top_k=20) for q in QUERIES], ensure_ascii=False)
    assert_no_canary(raw, out)
    assert served_doc_ids(wh) == {f"{LIB}/open"}  # the rest of the library built and publishes
    assert failing_files(raw, "parse_failures_zero") == [f"{n}.md" for n in names]
    labels, errors = engine_view(folder)
    assert labels == {f"{LIB}/open": "PUBLIC"} and errors == [f"{n}.md" for n in names]


def test_a_folder_that_cannot_be_listed_withholds_its_documents_and_the_library_builds(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus"
    write_lib(corpus, {"open.md": OPEN_TEXT, "locked/s.md": SECRET_TEXT, "locked/s.meta.json": meta(sensitivity="PUBLIC")})
    wh, raw, out = build(tmp_path, corpus)
    assert CANARY in out and raw.checks["parse_failures_zero"].passed
    real_scandir = os.scandir

    def failing_scandir(path):
        if str(path).endswith("locked"):
            raise PermissionError(13, "Permission denied")
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", failing_scandir)
    for _ in range(2):  # the second refresh changes nothing on disk: still reported
        raw = refresh(wh, corpus)
        assert_no_canary(raw, json.dumps([served(wh).retrieve(q, top_k=20) for q in QUERIES]))
        assert served_doc_ids(wh) == {f"{LIB}/open"}
        assert failing_files(raw, "parse_failures_zero") == ["locked/"]

# ------------------------------------------------------------------ all four through the Dagster code location
def test_round3_holes_through_the_dagster_code_location(tmp_path, monkeypatch, capfd):
    """A demo library with one of each hole: the run succeeds, both checks fail naming the
    files, and the canary is in no event, log line, output or answer."""
    dg = pytest.importorskip("dagster")
    import shutil

    from test_security_pipeline import _all_event_text

    import definitions
    from resources import RetrievalResource, WarehouseResource

    lib = "acme_policies"
    corpus = tmp_path / "corpus"
    folder = shutil.copytree(DEMO_ROOT / lib, corpus / lib)
    write_lib(corpus, {"s.md": SECRET_TEXT, "s.meta.json": meta(sensitivity="RESTRICTED", topic=CANARY)},
              lib="secret")
    write_lib(corpus, {"across.meta.json": meta(sensitivity="PUBLIC"),
                       "zw_key.md": SECRET_TEXT, "zw_key.meta.json": meta(**{"sensitiv\u200bity": "RESTRICTED"}),
                       "odd_label.md": SECRET_TEXT, "odd_label.meta.json": meta(sensitivity="ＰＵＢＬＩＣ"),
                       "prop.html": _html('<meta property="sensitivity" content="RESTRICTED">', SECRET_TEXT),
                       "dir_side.md": SECRET_TEXT}, lib=lib)
    (folder / "across.md").symlink_to(Path("..") / "secret" / "s.md")
    (folder / "dir_side.meta.json").mkdir()
    monkeypatch.setenv("RAGSPINE_EMBEDDING", "none")
    monkeypatch.setenv("RAGSPINE_EMBEDDING_BACKEND", "none")
    instance = dg.DagsterInstance.ephemeral()
    wh = WarehouseResource(root=str(tmp_path / "wh"), corpus_root=str(corpus))
    result = definitions.materialize_library(lib, instance, wh)
    assert result.success
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    refused = sorted(f.split(":")[0] for f in checks["parse_failures_zero"].metadata["files"].value)
    invalid = sorted(f.split(":")[0] for f in checks["sensitivity_labels_valid"].metadata["files"].value)
    assert refused == ["across.md", "dir_side.md"] and not checks["parse_failures_zero"].passed
    assert invalid == ["odd_label.md", "zw_key.md"] and not checks["sensitivity_labels_valid"].passed
    assert checks["restricted_never_served"].passed
    assert CANARY not in _all_event_text(instance)
    out, err = capfd.readouterr()
    assert CANARY not in out and CANARY not in err
    snippets = RetrievalResource(warehouse_root=str(tmp_path / "wh")).ask(f"{CANARY} board Lyon plant sale", top_k=20)
    assert snippets and all(CANARY not in json.dumps(s, ensure_ascii=False) for s in snippets)
