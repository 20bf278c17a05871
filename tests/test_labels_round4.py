"""Issue 42 (RESTRICTED, round 4), the ingest side: labels fail closed by construction.

Every case the issue's attacker found served as INTERNAL — look-alike and misspelt label
keys, sidecars named almost right, front matter the parser did not read, repeated HTML
attributes, hard links — must now be withheld (RESTRICTED) and reported by
``sensitivity_labels_valid`` (a hard link across libraries: refused, like a symlink), and
no error message, log line or CLI output may carry a restricted document's bytes.
"""

from __future__ import annotations

import json
import logging
import os
import zipfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_security import meta, write_lib
from test_security_labels_round3 import (
    CANARY,
    LIB,
    SECRET_TEXT,
    assert_no_canary,
    build,
    engine_view,
    failing_files,
)

from ragspine_pipeline.corpus import load_library
from ragspine_pipeline.ingest.documents import CorpusError, read_document
from ragspine_pipeline.ingest.metadata_keys import label_word_in, match_key
from ragspine_pipeline.ingest.parsers import ParseError, parse_source
from ragspine_pipeline.sensitivity import confusables_map, edit_distance, is_restricted, skeleton

OPEN = ("open.md", "# Open memo\n\nthe canteen menu for the Lyon plant.")
OPEN_META = ("open.meta.json", meta(sensitivity="PUBLIC"))
TAGGED = "".join(chr(0xE0000 + ord(c)) for c in "sensitivity")

# Keys Unicode's confusables data or the edit distance must catch (the list).
LOOKALIKE_KEYS = {
    "smallcap_e": "s\u1d07nsitivity", "smallcap_i": "sens\u026ativity", "smallcap_t": "sensi\u1d1bivity",
    "lisu": "\ua4e2ENSITIVITY", "cherokee": "\u13daensitivity", "i_stroke": "sens\u0268tivity",
    "turned_t": "sensitivi\u0287y", "tags": TAGGED, "typo1": "sensitivty", "typo2": "sensitvity",
    "plural": "sensitivitys", "colon": "Sensitivity:", "dc": "DC.sensitivity", "og": "og:sensitivity",
    "swap": "snesitivity", "math_bold": "\U0001d42c\U0001d41e\U0001d427\U0001d42c\U0001d422\U0001d42d\U0001d422"
                                        "\U0001d42f\U0001d422\U0001d42d\U0001d432",
}


@pytest.mark.parametrize("key", list(LOOKALIKE_KEYS.values()), ids=list(LOOKALIKE_KEYS))
def test_lookalike_and_misspelt_label_keys_are_misspelt(key):
    assert match_key(key).known == "sensitivity" and match_key(key).misspelt


@pytest.mark.parametrize("key", ["description", "author", "og:title", "twitter:title", "keywords", "viewport",
                                 "generator", "robots", "entities", "DC.title", "x"])
def test_ordinary_html_and_front_matter_keys_stay_ordinary(key):
    assert match_key(key).known == "" and not label_word_in(key)


def test_skeleton_uses_unicode_confusables_data():
    table = confusables_map()
    assert table["\u13da"] == "S" and table["\ua4e2"] == "S"  # Cherokee DU, Lisu SA: from Unicode's file
    assert skeleton("\u0455\u0435n\u0455\u0456t\u0456v\u0456t\u0443") == skeleton("sensitivity")
    assert edit_distance("sensitivty", "sensitivity", 2) == 1 and edit_distance("snesitivity", "sensitivity", 2) == 1
    assert edit_distance("title", "sensitivity", 2) == 3  # over the limit: reported as limit + 1


def _fm(key: str, value: str = "RESTRICTED") -> str:
    return f"---\n{json.dumps(key)}: {value}\ntitle: x\n---\n{SECRET_TEXT}"


def _html(head: str) -> str:
    return f"<html><head>{head}</head><body><p>{SECRET_TEXT}</p></body></html>"


ROUND4_FILES = {
    **{f"key_{name}.md": _fm(key) for name, key in LOOKALIKE_KEYS.items()},
    "key_label_suffix.md": _fm("sensitivity_label"),
    "key_nested.md": f"---\nmeta:\n  sensitivity: RESTRICTED\n---\n{SECRET_TEXT}",
    "html_dc.html": _html('<meta name="DC.sensitivity" content="RESTRICTED">'),
    "html_og.html": _html('<meta property="og:sensitivity" content="RESTRICTED">'),
    "html_dup.html": _html('<meta name="sensitivity" content="RESTRICTED" content="PUBLIC">'),
    "html_smallcap.html": _html('<meta name="s\u1d07nsitivity" content="RESTRICTED">'),
    # Sidecars named almost right: each is that document's sidecar, and a problem.
    "k8.md": SECRET_TEXT, "K8.meta.json": meta(sensitivity="RESTRICTED"),
    "k10.md": SECRET_TEXT, "k10.META.JSON": meta(sensitivity="PUBLIC"),
    "k9.md": SECRET_TEXT, "k9.md.meta.json": meta(sensitivity="RESTRICTED"),
    # Sidecars are a closed schema: an undeclared key beside a PUBLIC label.
    "closed.md": SECRET_TEXT, "closed.meta.json": meta(sensitivity="PUBLIC", classification="RESTRICTED"),
    # Front matter the parser cannot read: withheld, reported, never served as text.
    "fm_unterminated.md": f"---\nsensitivity: RESTRICTED\n{SECRET_TEXT}",
    "fm_blank_before.md": f"\n---\nsensitivity: RESTRICTED\n---\n{SECRET_TEXT}",
    "fm_space_before.md": f" ---\nsensitivity: RESTRICTED\n---\n{SECRET_TEXT}",
    "fm_four_dashes.md": f"----\nsensitivity: RESTRICTED\n----\n{SECRET_TEXT}",
    "fm_cr_only.md": f"---\rsensitivity: RESTRICTED\r---\r{SECRET_TEXT}",
    "fm_bom_zwsp.md": f"\u200b---\nsensitivity: RESTRICTED\n---\n{SECRET_TEXT}",
    "fm_txt_unterminated.txt": f"---\nsensitivity: RESTRICTED\n{SECRET_TEXT}",
    # A label written as a line of the first lines, in any file type.
    "line.txt": f"Sensitivity: RESTRICTED\n\n{SECRET_TEXT}",
    "line_typo.md": f"# Memo\n\n**Sensitivty level**: RESTRICTED\n\n{SECRET_TEXT}",
    "line_html.html": f"<html><body><p>Sensitivity: RESTRICTED</p><p>{SECRET_TEXT}</p></body></html>",
}
ROUND4_PROBLEMS = sorted(n for n in ROUND4_FILES if not n.endswith((".json", ".JSON")))


def test_every_round4_ingest_form_is_withheld_and_reported(tmp_path):
    corpus = tmp_path / "corpus"
    write_lib(corpus, {**dict([OPEN, OPEN_META]), **ROUND4_FILES})
    wh, raw, out = build(tmp_path, corpus)
    assert_no_canary(raw, out)
    from test_security import served_doc_ids

    assert served_doc_ids(wh) == {f"{LIB}/open"}
    assert failing_files(raw, "sensitivity_labels_valid") == ROUND4_PROBLEMS
    labels, errors = engine_view(corpus / LIB)
    assert errors == [] and {k for k, v in labels.items() if not is_restricted(v)} == {f"{LIB}/open"}
    docs = {Path(d.source_path).name: d for d in load_library(corpus / LIB)[0]}
    assert sorted(n for n, d in docs.items() if d.label_problem) == ROUND4_PROBLEMS
    for d in docs.values():
        assert CANARY not in d.label_problem


def test_front_matter_in_a_txt_file_is_read_as_in_markdown(tmp_path):
    folder = write_lib(tmp_path / "corpus", {"fm.txt": f"---\nsensitivity: RESTRICTED\ntopic: t\n---\n{SECRET_TEXT}",
                                             "open.txt": "---\nsensitivity: PUBLIC\n---\nplain words"})
    docs = {d.doc_id: d for d in load_library(folder)[0]}
    assert docs[f"{LIB}/fm"].metadata["sensitivity"] == "RESTRICTED" and not docs[f"{LIB}/fm"].label_problem
    assert docs[f"{LIB}/open"].metadata["sensitivity"] == "PUBLIC" and docs[f"{LIB}/open"].text == "plain words"
    assert "sensitivity" not in docs[f"{LIB}/fm"].text  # the block is metadata, never served as text


def test_ordinary_documents_are_not_flagged(tmp_path):
    folder = write_lib(tmp_path / "corpus", {
        "a.md": "---\nsensitivity: PUBLIC\nsensitivity_notes: reviewed by legal\n---\n# Sensitivity analysis\n\nrates",
        "b.md": "# Notes\n\n---\n\nA thematic break after the title is fine.",
        "c.docx.md": "Sensitivity: PUBLIC\n\ncover page agrees with the sidecar",
        "c.docx.meta.json": meta(sensitivity="PUBLIC"),
        "d.html": '<html><head><meta name="description" content="x"><meta property="og:title" content="y">'
                  "</head><body><p>text</p></body></html>"})
    docs, errors = load_library(folder)
    assert not errors and all(not d.label_problem for d in docs), [(d.doc_id, d.label_problem) for d in docs]
    assert {d.doc_id: d.metadata["sensitivity"] for d in docs} == {
        f"{LIB}/a": "PUBLIC", f"{LIB}/b": "INTERNAL", f"{LIB}/c.docx": "PUBLIC", f"{LIB}/d": "INTERNAL"}


def test_declared_sidecar_keys_are_allowed(tmp_path, monkeypatch):
    folder = write_lib(tmp_path / "corpus", {"a.md": "text", "a.meta.json": meta(sensitivity="PUBLIC", owner="hr")})
    assert load_library(folder)[0][0].metadata["sensitivity"] == "RESTRICTED"
    monkeypatch.setenv("RAGSPINE_METADATA_KEYS", "Owner, cost_center")
    doc = load_library(folder)[0][0]
    assert doc.metadata["sensitivity"] == "PUBLIC" and doc.metadata["owner"] == "hr" and not doc.label_problem


def test_an_orphan_sidecar_is_reported(tmp_path):
    folder = write_lib(tmp_path / "corpus", {"a.md": "text", "a.meta.json": meta(sensitivity="PUBLIC"),
                                             "gone.meta.json": meta(sensitivity="RESTRICTED"),
                                             "sub/Other.META.json": meta(sensitivity="RESTRICTED")})
    docs, errors = load_library(folder)
    assert [d.doc_id for d in docs] == [f"{LIB}/a"]
    assert sorted(Path(e.path).name for e in errors) == ["Other.META.json", "gone.meta.json"]
    assert all("orphan" in e.error for e in errors)


# ------------------------------------------------------------------ 5. hard links
def test_hard_links_take_the_strictest_label_and_are_refused_across_libraries(tmp_path):
    corpus = tmp_path / "corpus"
    sec = write_lib(corpus, {"s.md": SECRET_TEXT, "s.meta.json": meta(sensitivity="RESTRICTED")}, lib="sec")
    pub = write_lib(corpus, {**dict([OPEN, OPEN_META]), "t.md": SECRET_TEXT, "t.meta.json": meta(sensitivity="RESTRICTED")},
                    lib="pub")
    os.link(sec / "s.md", pub / "l.md")  # ln sec/s.md pub/l.md
    os.link(pub / "t.md", pub / "alias.md")  # inside one library: the strictest label of both names
    (pub / "alias.meta.json").write_text(meta(sensitivity="PUBLIC"))
    wh, raw, out = build(tmp_path, corpus, "pub")
    assert_no_canary(raw, out)
    from test_security import served_doc_ids

    assert served_doc_ids(wh, "pub") == {"pub/open"}
    assert failing_files(raw, "parse_failures_zero") == ["l.md"]
    assert "hard link" in raw.checks["parse_failures_zero"].metadata["files"][0]
    labels, errors = engine_view(pub, "pub")
    assert errors == ["l.md"] and labels["pub/alias"] == "RESTRICTED"
    assert engine_view(sec, "sec")[1] == ["s.md"]  # the other side of the link is refused too
    with pytest.raises(CorpusError, match="hard link"):
        read_document(pub / "l.md", "pub", root=corpus)


# ------------------------------------------------------------------ 6. no restricted byte in errors or logs
def _broken_docx(path: Path) -> None:
    import docx

    d = docx.Document()
    d.add_paragraph("body")
    d.save(str(path))
    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    members["word/document.xml"] = members["word/document.xml"].replace(b"body", f"&{CANARY};".encode())
    with zipfile.ZipFile(path, "w") as z:
        for n, data in members.items():
            z.writestr(n, data)


@pytest.fixture
def noisy_pypdf(monkeypatch):
    """pypdf as it behaves on a crafted file: it logs bytes of the file, then fails."""
    import pypdf
    from pypdf.errors import PdfReadError

    class Reader:
        def __init__(self, *a, **kw):
            logging.getLogger("pypdf._reader").warning("bad object %r", CANARY.encode())
            raise PdfReadError(f"cannot read {CANARY}")

    monkeypatch.setattr(pypdf, "PdfReader", Reader)


def _canary_corpus(root: Path) -> Path:
    folder = write_lib(root, {"lang.md": SECRET_TEXT, "lang.meta.json": meta(sensitivity="RESTRICTED", language=CANARY),
                              "bad.pdf": b"%PDF-1.4\n" + CANARY.encode(), "open.md": "open words"})
    pytest.importorskip("docx")
    _broken_docx(folder / "broken.docx")
    return folder


def test_parser_errors_name_the_kind_never_the_content(tmp_path, noisy_pypdf, caplog, capfd):
    folder = _canary_corpus(tmp_path / "corpus")
    caplog.set_level(logging.DEBUG)
    docs, errors = load_library(folder)
    assert sorted(Path(e.path).name for e in errors) == ["bad.pdf", "broken.docx", "lang.md"]
    for e in errors:
        assert CANARY not in e.error and Path(e.path).stem in e.error
    assert CANARY not in caplog.text
    out, err = capfd.readouterr()
    assert CANARY not in out + err
    with pytest.raises(ParseError) as exc:
        parse_source(folder / "broken.docx")
    assert "unreadable Word file" in str(exc.value) and CANARY not in str(exc.value)
    assert logging.getLogger("pypdf").propagate  # detached only while parsing


def test_the_cli_index_output_carries_no_restricted_byte(tmp_path, noisy_pypdf, caplog, capsys, monkeypatch):
    from ragspine_pipeline import cli

    monkeypatch.setenv("RAGSPINE_EMBEDDING_BACKEND", "none")
    monkeypatch.setenv("RAGSPINE_RETRIEVAL_MODE", "bm25")
    for name in ("RAGSPINE_GLOSSARY", "RAGSPINE_GRAPH_DIMENSIONS", "RAGSPINE_CORPUS_ROOT", "RAGSPINE_EMBEDDING",
                 "RAGSPINE_WAREHOUSE", "DAGSTER_HOME"):
        monkeypatch.delenv(name, raising=False)
    corpus = tmp_path / "corpus"
    _canary_corpus(corpus)
    caplog.set_level(logging.DEBUG)
    cli.main(["index", str(corpus), "--warehouse", str(tmp_path / "wh"), "--in-process"])
    out, err = capsys.readouterr()
    assert "lang.md" in out + err or "broken.docx" in out + err  # the failures are named ...
    assert CANARY not in out + err and CANARY not in caplog.text  # ... never what they hold


# ------------------------------------------------------------------ 8. non-interference, every ingest form
def test_every_ingest_form_leaves_the_served_output_as_without_it(tmp_path):
    """The hypothesis worlds of test_security draw these forms at random; here every one at
    once, so each is exercised on every run."""
    from test_security import FORMS, _served_outputs

    words = ["revenue", "margin", "zebra", "plant", "tariff", "lyon", "union"]
    docs = {f"d{i}": (" ".join(words[i:] + words[:i]), "PUBLIC", "AB"[i % 2]) for i in range(3)}
    secret = {f"s{i}": (f"zebra plant {w} tariff lyon", "RESTRICTED", "A", form)
              for i, (form, w) in enumerate(zip(FORMS, words * 3, strict=False))}
    queries = ["zebra plant", "tariff lyon", "revenue margin"]
    with_secret = _served_outputs(tmp_path / "w", {**docs, **secret}, queries)
    assert with_secret == _served_outputs(tmp_path / "w", docs, queries)


# ------------------------------------------------------------------ incremental refreshes see every label source
def test_a_refresh_sees_an_odd_sidecar_a_hard_link_sibling_and_an_orphan(tmp_path):
    from test_security import refresh, served_doc_ids

    from ragspine_pipeline.warehouse.versioned import VersionedTables

    corpus = tmp_path / "corpus"
    folder = write_lib(corpus, {**dict([OPEN, OPEN_META]), "k8.md": SECRET_TEXT,
                                "a.md": SECRET_TEXT, "a.meta.json": meta(sensitivity="PUBLIC")})
    os.link(folder / "a.md", folder / "b.md")
    (folder / "b.meta.json").write_text(meta(sensitivity="PUBLIC"))
    wh = VersionedTables(tmp_path / "wh")
    refresh(wh, corpus)
    assert served_doc_ids(wh) == {f"{LIB}/open", f"{LIB}/k8", f"{LIB}/a", f"{LIB}/b"}
    # A sidecar added in another case, a relabel of one name of a linked file, an orphan.
    (folder / "K8.META.JSON").write_text(meta(sensitivity="RESTRICTED"))
    (folder / "a.meta.json").write_text(meta(sensitivity="RESTRICTED"))
    (folder / "lost.meta.json").write_text(meta(sensitivity="RESTRICTED"))
    raw = refresh(wh, corpus)
    assert served_doc_ids(wh) == {f"{LIB}/open"}
    assert failing_files(raw, "sensitivity_labels_valid") == ["k8.md"]
    assert failing_files(raw, "parse_failures_zero") == ["lost.meta.json"]
    assert_no_canary(raw, "")


def test_parser_errors_through_the_dagster_code_location(tmp_path, noisy_pypdf, monkeypatch, capfd, caplog):
    """Each parser error path with a canary in the restricted document: the run succeeds,
    the check names the files, and no event of the run storage, log line or output holds
    the canary (pypdf's logger included)."""
    dg = pytest.importorskip("dagster")
    from test_security_pipeline import _all_event_text

    import definitions
    from resources import WarehouseResource

    corpus = tmp_path / "corpus"
    _canary_corpus(corpus)
    write_lib(corpus, {"k8.md": SECRET_TEXT, "K8.meta.json": meta(sensitivity="RESTRICTED", topic=CANARY),
                       "fm.md": f"----\nsensitivity: RESTRICTED\n----\n{SECRET_TEXT}"})
    monkeypatch.setenv("RAGSPINE_EMBEDDING", "none")
    monkeypatch.setenv("RAGSPINE_EMBEDDING_BACKEND", "none")
    caplog.set_level(logging.DEBUG)
    instance = dg.DagsterInstance.ephemeral()
    wh = WarehouseResource(root=str(tmp_path / "wh"), corpus_root=str(corpus))
    result = definitions.materialize_library(LIB, instance, wh)
    assert result.success
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    refused = sorted(f.split(":")[0] for f in checks["parse_failures_zero"].metadata["files"].value)
    invalid = sorted(f.split(":")[0] for f in checks["sensitivity_labels_valid"].metadata["files"].value)
    assert refused == ["bad.pdf", "broken.docx", "lang.md"] and invalid == ["fm.md", "k8.md"]
    assert CANARY not in _all_event_text(instance) and CANARY not in caplog.text
    out, err = capfd.readouterr()
    assert CANARY not in out + err


def test_linking_a_served_file_from_another_library_withholds_it_on_the_next_refresh(tmp_path):
    from test_security import refresh, served_doc_ids

    from ragspine_pipeline.warehouse.versioned import VersionedTables

    corpus = tmp_path / "corpus"
    pub = write_lib(corpus, {**dict([OPEN, OPEN_META]), "p.md": "plant tariff words"}, lib="pub")
    sec = write_lib(corpus, {"x.meta.json": meta(sensitivity="RESTRICTED")}, lib="sec")
    wh = VersionedTables(tmp_path / "wh")
    refresh(wh, corpus, "pub")
    assert served_doc_ids(wh, "pub") == {"pub/open", "pub/p"}
    os.link(pub / "p.md", sec / "x.md")  # the same bytes now also carry sec's RESTRICTED label
    raw = refresh(wh, corpus, "pub")
    assert served_doc_ids(wh, "pub") == {"pub/open"}
    assert failing_files(raw, "parse_failures_zero") == ["p.md"]


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="sensitivyrcdpublabc", max_size=30), st.sampled_from(["sensitivity", "pubiic", "restricted"]),
       st.integers(1, 2))
def test_the_filtered_approximate_search_answers_as_the_full_one(text, pattern, limit):
    from ragspine_pipeline.sensitivity import _osa, near_substring

    assert near_substring(text, pattern, limit) == (_osa(pattern, text, anywhere=True, limit=limit) <= limit)
    assert skeleton(text) == skeleton(text + "\u200b")  # invisible characters change nothing
