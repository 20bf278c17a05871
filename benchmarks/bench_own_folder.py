"""The issue-43 user's own folder, rebuilt from files Debian ships: hits@3 before and after.

A new user indexed a folder of real documents (licenses as txt/html/md/pdf/docx, man pages,
Python docstrings, a Japanese note) into two and then three libraries and asked ten
questions whose answers are known. With the per-library rule (each library ranked alone,
the lists fused by rank: ``RAGSPINE_MULTI_FUSION=rrf``, the only behaviour before issue 43)
every library's best hit got rank-1 credit, so the top 3 held one hit per library. This
script rebuilds that folder from ``/usr/share/common-licenses`` and ``/usr/share/man/man1``
(plus ``pydoc`` text of a few stdlib modules and a Japanese note written here), indexes it
with the product's in-process path (``index_in_process``: the steps ``ragspine index
--in-process`` runs), opens it as ``ragspine query`` does (``open_published_retriever``,
router ``none``: every library is asked) and measures, for ``rrf`` ("before") and
``global`` (the default, "after"), with 2 and 3 libraries:

* hits@3: the question's document among the first 3 snippets (10 questions);
* the invariants the issue names: no hit with ``bm25=0.0`` above one with ``bm25>0``
  (BM25 mode), ``fused`` never rising with rank, no passage twice in the top 5 (normalised
  text), no bare heading (``headings.is_bare``) returned.

``--modes bm25 hybrid``: hybrid indexes with the embedding spec given by ``--embedding``
(default ``minilm`` when installed, else ``deterministic``; the table names it).

    python benchmarks/bench_own_folder.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import gzip
import html
import json
import os
import platform
import pydoc
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from chunker_docs import multipage_pdf  # noqa: E402  (the tests' PDF writer: no PDF library writes one)

from benchmarks.common import out_dir, say_written  # noqa: E402
from ragspine_pipeline.indexing import environment  # noqa: E402
from ragspine_pipeline.retrieval.chunking.headings import is_bare  # noqa: E402

LICENSES = Path("/usr/share/common-licenses")
MAN1 = Path("/usr/share/man/man1")
MAN_PAGES = ("ls", "grep", "tar", "cp", "chmod", "gzip", "find", "sort", "du", "df")
PYDOC_MODULES = ("json", "shutil", "textwrap", "heapq")
FUSIONS = ("rrf", "global")  # rrf: the per-library rule ("before"); global: one ranking ("after", default)

JAPANESE_NOTE = (
    "社内勉強会のメモ\n\n"
    "次回の社内勉強会は三月十日の午後二時から大阪オフィスの第三会議室で開催します。"
    "テーマは全文検索システムの評価方法で、講師は情報システム部の田中さんです。\n\n"
    "参加を希望する人は三月五日までに総務部の山本さんへメールで申し込んでください。"
    "参加費は無料です。資料は当日配布します。\n"
)


@dataclass(frozen=True)
class Question:
    """One question, the documents (file stems, any library) that answer it, and why."""

    text: str
    answers: tuple[str, ...]
    where: str


QUESTIONS = (
    Question("what does the Apache license say about patent grants", ("Apache-2.0", "Apache-2.0-page"),
             "Apache-2.0 section 3, Grant of Patent License (txt, and the same text as html)"),
    Question("how do I list files sorted by modification time, newest first", ("ls", "ls-cheatsheet"),
             "ls(1): -t sort by time, newest first (the same text twice: tools/ls, notes/ls-cheatsheet)"),
    Question("GPL version 3 conveying verbatim copies of the program's source code", ("GPL-3",),
             "GPL-3 section 4, Conveying Verbatim Copies (markdown)"),
    Question("次回の勉強会はどこで開催しますか", ("meeting-note-ja",), "the Japanese note"),
    Question("grep print the line number with each output line", ("grep",), "grep(1): -n, --line-number"),
    Question("create a tar archive and filter it through gzip", ("tar",), "tar(1): -c, -z/--gzip"),
    Question("Mozilla Public License larger work combining covered software", ("MPL-2.0",),
             "MPL-2.0 section 3.3, Distribution of a Larger Work (pdf)"),
    Question("serialize a Python object as a JSON formatted string", ("pydoc-json",), "pydoc json: dumps"),
    Question("recursively copy an entire directory tree rooted at src with copytree", ("pydoc-shutil",),
             "pydoc shutil: copytree"),
    Question("Lesser General Public License work that uses the Library linked with it", ("LGPL-2.1",),
             "LGPL-2.1 section 5 (docx)"),
)


def available() -> str | None:
    """None when this machine ships what the folder is built from, else why not."""
    if not (LICENSES / "Apache-2.0").is_file():
        return f"{LICENSES} is absent (Debian's common-licenses package ships it)"
    missing = [m for m in MAN_PAGES if not (MAN1 / f"{m}.1.gz").is_file()]
    if missing:
        return f"man pages {missing} are absent under {MAN1}"
    for mod in ("docx", "bs4", "pypdf"):
        try:
            __import__(mod)
        except ImportError:
            return f"{mod} is not installed (docx/html/pdf parsing)"
    return None


_TROFF_ESC = re.compile(r"\\f(?:\[[^\]]*\]|\(..|.)|\\[&/,|^:]|\\\*\(..|\\\*.")


def man_text(name: str) -> str:
    """A man page as plain text: troff requests dropped, font escapes stripped (a simple
    regex, as a user without ``man`` would do; ``man -P cat`` is not everywhere)."""
    out = []
    for line in gzip.decompress((MAN1 / f"{name}.1.gz").read_bytes()).decode("utf-8", "replace").splitlines():
        if line.startswith(('.\\"', "'\\\"")):
            continue
        if line.startswith((".SH", ".SS")):
            out += ["", line.split(None, 1)[1].strip('"') if " " in line else ""]
            continue
        if line.startswith((".PP", ".TP", ".IP", ".P", ".LP", ".sp", ".br")):
            out.append("")
            line = line.split(None, 1)[1] if line.startswith(".IP") and " " in line else ""
        elif line.startswith("."):
            parts = line.split(None, 1)
            line = parts[1] if len(parts) > 1 and parts[0] in (".B", ".I", ".BR", ".IR", ".BI", ".RB") else ""
        line = _TROFF_ESC.sub("", line).replace("\\-", "-").replace("\\e", "\\").replace("\\ ", " ")
        out.append(line.replace('"', ""))
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip() + "\n"


def paragraphs(text: str) -> list[str]:
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]


def write_docx(path: Path, text: str) -> None:
    import docx

    d = docx.Document()
    for p in paragraphs(text):
        d.add_paragraph(p)
    d.save(str(path))


def write_pdf(path: Path, text: str, lines_per_page: int = 45) -> None:
    lines = [ln for p in paragraphs(text) for ln in (*_wrap(p), "")]
    path.write_bytes(multipage_pdf([lines[i:i + lines_per_page] for i in range(0, len(lines), lines_per_page)]))


def _wrap(p: str, width: int = 90) -> list[str]:
    import textwrap

    return textwrap.wrap(p, width) or [""]


def write_html(path: Path, title: str, text: str) -> None:
    body = "\n".join(f"<p>{html.escape(p)}</p>" for p in paragraphs(text))
    path.write_text(f"<html><head><title>{html.escape(title)}</title></head><body>\n<h1>{html.escape(title)}</h1>\n"
                    f"{body}\n</body></html>\n", encoding="utf-8")


def write_md(path: Path, title: str, text: str) -> None:
    """Markdown: the numbered section lines ("4. Conveying Verbatim Copies.") become headings."""
    out = [f"# {title}", ""]
    for p in paragraphs(text):
        out += [f"## {p}" if re.fullmatch(r"\d+\.\s+[A-Z][\w ,.'-]{2,60}", p) else p, ""]
    path.write_text("\n".join(out), encoding="utf-8")


def pydoc_text(module: str) -> str:
    return pydoc.render_doc(__import__(module), renderer=pydoc.plaintext)


def library_of(rel: str, libraries: int) -> str:
    """licenses | tools (man pages) | notes (pydoc text, the Japanese note); with two
    libraries the notes live in tools."""
    top = rel.split("/", 1)[0]
    return "tools" if libraries == 2 and top == "notes" else top


def build_folder(root: Path, libraries: int) -> Path:
    """The folder ``root/corpus`` with one sub-folder per library (2 or 3)."""
    if libraries not in (2, 3):
        raise ValueError("libraries must be 2 or 3")
    lic = {n: (LICENSES / n).read_text(encoding="utf-8") for n in
           ("Apache-2.0", "GPL-3", "GPL-2", "LGPL-2.1", "MPL-2.0", "Artistic", "BSD", "CC0-1.0")}
    corpus = root / "corpus"
    shutil.rmtree(corpus, ignore_errors=True)

    def put(rel: str, writer: Any, *args: Any) -> None:
        path = corpus / library_of(rel, libraries) / rel.split("/", 1)[1]
        path.parent.mkdir(parents=True, exist_ok=True)
        writer(path, *args)

    for name in ("Apache-2.0", "GPL-2", "Artistic", "BSD", "CC0-1.0"):
        put(f"licenses/{name}.txt", Path.write_text, lic[name], "utf-8")
    put("licenses/Apache-2.0-page.html", write_html, "Apache License 2.0", lic["Apache-2.0"])  # same text twice
    put("licenses/GPL-3.md", write_md, "GNU General Public License v3", lic["GPL-3"])
    put("licenses/MPL-2.0.pdf", write_pdf, lic["MPL-2.0"])
    put("licenses/LGPL-2.1.docx", write_docx, lic["LGPL-2.1"])
    for m in MAN_PAGES:
        put(f"tools/{m}.txt", Path.write_text, man_text(m), "utf-8")
    for m in PYDOC_MODULES:
        put(f"notes/pydoc-{m}.txt", Path.write_text, pydoc_text(m), "utf-8")
    put("notes/meeting-note-ja.txt", Path.write_text, JAPANESE_NOTE, "utf-8")
    put("notes/ls-cheatsheet.txt", Path.write_text, man_text("ls"), "utf-8")  # a passage two files share
    return corpus


def index_folder(corpus: Path, warehouse: Path, embedding: str) -> list[Any]:
    """Every library folder under ``corpus`` indexed in-process (``ragspine index --in-process``)."""
    from ragspine_pipeline import indexing

    with environment({"RAGSPINE_EMBEDDING": embedding}):
        reports = indexing.index_in_process(warehouse, indexing.plan_libraries(corpus))
    bad = [r for r in reports if getattr(r, "error", None)]
    if bad:
        raise RuntimeError(f"indexing failed: {[(r.name, r.error) for r in bad]}")
    return reports


def stem(doc_id: str) -> str:
    return doc_id.rsplit("/", 1)[-1]


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def check_answer(snippets: Sequence[dict[str, Any]], mode: str) -> dict[str, bool]:
    """The invariants of one answer (True: holds)."""
    bm = [float((s.get("scores") or {}).get("bm25") or 0.0) for s in snippets]
    fused = [float((s.get("scores") or {}).get("fused") or 0.0) for s in snippets]
    top5 = [_norm(s["text"]) for s in snippets[:5]]
    return {
        "no_zero_bm25_above_a_match": mode != "bm25" or not any(
            bm[i] == 0.0 and any(b > 0.0 for b in bm[i + 1:]) for i in range(len(bm))),
        "fused_monotone": all(a >= b for a, b in zip(fused, fused[1:], strict=False)),
        "no_duplicate_in_top5": len(set(top5)) == len(top5),
        "no_bare_heading": not any(is_bare(s["text"]) for s in snippets),
    }


def ask(corpus: Path, warehouse: Path, fusion: str, mode: str, embedding: str, top_k: int = 10,
        router: str = "none") -> dict[str, Any]:
    """The ten questions through the served retriever; hits@3 and the invariants."""
    from ragspine_pipeline.serving import open_published_retriever

    holders: dict[str, set[str]] = {}  # library -> the file stems it holds
    for lib in (p for p in corpus.iterdir() if p.is_dir()):
        holders[lib.name] = {f.stem for f in lib.rglob("*") if f.is_file()}
    with environment({"RAGSPINE_MULTI_FUSION": fusion, "RAGSPINE_EMBEDDING": embedding}):
        retriever = open_published_retriever(warehouse, mode=mode, router=router)
        rows = []
        for q in QUESTIONS:
            out = retriever.retrieve(q.text, top_k=top_k)
            top3 = [stem(s["doc_id"]) for s in out[:3]]
            right_libs = {lib for lib, names in holders.items() if names & set(q.answers)}
            rows.append({"question": q.text, "answers": list(q.answers), "hit": any(t in q.answers for t in top3),
                         "hit_at_1": bool(top3) and top3[0] in q.answers,
                         "other_library_in_top3": sum(s.get("library_id") not in right_libs for s in out[:3]),
                         "zero_bm25_in_top3": sum(not (s.get("scores") or {}).get("bm25") for s in out[:3]),
                         "duplicates_listed": sum(len(s.get("duplicates") or ()) for s in out[:5]),
                         "top3": [f"{s.get('library_id', '')}:{stem(s['doc_id'])}" for s in out[:3]],
                         "checks": check_answer(out, mode)})
    failed = {k: [r["question"] for r in rows if not r["checks"][k]] for k in rows[0]["checks"]}
    return {"hits_at_3": sum(r["hit"] for r in rows), "hits_at_1": sum(r["hit_at_1"] for r in rows),
            "other_library_in_top3": sum(r["other_library_in_top3"] for r in rows),
            "zero_bm25_in_top3": sum(r["zero_bm25_in_top3"] for r in rows),
            "duplicates_listed": sum(r["duplicates_listed"] for r in rows),
            "questions": len(rows), "rows": rows, "invariant_failures": {k: v for k, v in failed.items() if v}}


def run(work: Path, modes: Sequence[str], embedding: str, routers: Sequence[str] = ("none",),
        say: Any = print) -> dict[str, Any]:
    cells: list[dict[str, Any]] = []
    for n in (2, 3):
        for mode in modes:
            emb = "deterministic" if mode == "bm25" else embedding
            base = work / f"libs{n}-{mode}"
            corpus = build_folder(base, n)
            t0 = time.perf_counter()
            index_folder(corpus, base / "warehouse", emb)
            secs = time.perf_counter() - t0
            for router, fusion in ((r, f) for r in routers for f in FUSIONS):
                r = ask(corpus, base / "warehouse", fusion, mode, emb, router=router)
                cells.append({"libraries": n, "mode": mode, "embedding": emb if mode != "bm25" else None,
                              "router": router, "fusion": fusion, "index_s": round(secs, 1), **r})
                say(f"{n} libraries {mode:6s} router {router:5s} {fusion:6s}: hits@3 {r['hits_at_3']}/{r['questions']}, "
                    f"hits@1 {r['hits_at_1']}, other library in top 3 {r['other_library_in_top3']}/30, "
                    f"invariant failures {sum(len(v) for v in r['invariant_failures'].values())}")
    return {"cells": cells}


def markdown(result: dict[str, Any], command: str) -> str:
    lines = ["# Own folder (issue 43): hits@3 before (rrf) and after (global)", "",
             "The issue's folder rebuilt from Debian's `/usr/share/common-licenses` (txt, one as html, md, pdf,",
             "docx), ten `man1` pages, `pydoc` text of four stdlib modules and a Japanese note; indexed with",
             "the in-process path, asked through `open_published_retriever` (router `none`: every",
             "library; `rules`: the default router, which may pick libraries first).",
             "`rrf` = each library ranked alone, fused by rank (the behaviour before issue 43);",
             "`global` = one ranking over the union (the default since).", "",
             f"Command: `{command}`", "", f"Machine: {result.get('machine', '?')}", "",
             "| libraries | mode | embedding | router | fusion | hits@3 | hits@1 | other library in top 3 (of 30) "
             "| bm25=0 in top 3 | duplicates listed | zero-bm25 above match | fused not monotone "
             "| duplicate in top 5 | bare heading |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    keys = ("no_zero_bm25_above_a_match", "fused_monotone", "no_duplicate_in_top5", "no_bare_heading")
    for c in result["cells"]:
        f = c["invariant_failures"]
        lines.append(f"| {c['libraries']} | {c['mode']} | {c['embedding'] or '-'} | {c.get('router', 'none')} | "
                     f"{c['fusion']} | "
                     f"{c['hits_at_3']}/{c['questions']} | {c['hits_at_1']}/{c['questions']} | {c['other_library_in_top3']} | "
                     f"{c['zero_bm25_in_top3']} | {c['duplicates_listed']} | " + " | ".join(str(len(f.get(k, []))) for k in keys) + " |")
    lines += ["", "\"other library in top 3\": top-3 snippets from a library holding none of the question's",
              "answers (the per-library rule gives every library's best hit rank-1 credit). \"bm25=0 in top 3\":",
              "dense-only hits (hybrid). \"duplicates listed\": copies collapsed into the top 5's",
              "`duplicates`. The last four columns count questions (of 10) whose answer breaks that invariant",
              "(zero-bm25 above match is checked in BM25 mode only, where every hit matches a term).", "",
              "## Top 3 per question", ""]
    for c in result["cells"]:
        lines.append(f"### {c['libraries']} libraries, {c['mode']}, router {c.get('router', 'none')}, {c['fusion']}")
        lines.append("")
        for r in c["rows"]:
            lines.append(f"- {'hit ' if r['hit'] else 'MISS'} {r['question']} -> {', '.join(r['top3'])}")
        lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/out/, git-ignored)")
    ap.add_argument("--routers", nargs="+", default=["none"], choices=["none", "rules"])
    ap.add_argument("--modes", nargs="+", default=["bm25"], choices=["bm25", "hybrid"])
    ap.add_argument("--embedding", default=None, help="hybrid's embedding spec (default minilm if installed)")
    ap.add_argument("--name", default="own_folder")
    args = ap.parse_args(argv)
    why = available()
    if why:
        print(f"skipped: {why}", file=sys.stderr)
        return 2
    embedding = args.embedding
    if embedding is None and "hybrid" in args.modes:
        from ragspine_pipeline.retrieval.vector.embedding_backends import make_embedding_backend

        try:
            make_embedding_backend("minilm").embed_queries(["probe"])
            embedding = "minilm"
        except Exception as exc:  # noqa: BLE001 - no local model: the deterministic backend, named in the table
            print(f"minilm unavailable ({type(exc).__name__}); hybrid uses the deterministic backend", file=sys.stderr)
            embedding = "deterministic"
    embedding = embedding or "deterministic"
    with tempfile.TemporaryDirectory() as tmp:
        result = run(Path(tmp), args.modes, embedding, args.routers)
    command = "python benchmarks/bench_own_folder.py " + " ".join(argv if argv is not None else sys.argv[1:])
    result["command"] = command.strip()
    result["machine"] = f"{platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    out = out_dir(args.out)
    (out / f"{args.name}.json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n",
                                                encoding="utf-8")
    (out / f"{args.name}.md").write_text(markdown(result, command.strip()) + "\n", encoding="utf-8")
    say_written([out / f"{args.name}.json", out / f"{args.name}.md"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
