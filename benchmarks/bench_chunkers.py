"""Chunker benchmark: nDCG@10 and Recall@100 of each chunker, contextual headers on/off and
RAPTOR modes, on documents long enough to need chunking; paragraph is the baseline row.

    python benchmarks/bench_chunkers.py                          # cmrc2018-trial, xquad-de, scifact
    python benchmarks/bench_chunkers.py --sets xquad-de --semantic

Long documents are built from the BEIR-layout sets in ``../shared/eval/``:

* ``xquad-de``: the 240 paragraphs of the 48 SQuAD articles, one document per article
  (``# <article title>`` then its paragraphs in id order, blank lines between) — no inner
  headings, so structure-aware chunkers see one section per document.
* ``cmrc2018-trial``: every CMRC passage has its own article title, so passages are joined
  8 at a time in id order, each under its own ``## <title>`` heading (real titles, real
  structure).
* ``scifact``: abstracts joined 10 at a time in id order, each under ``## <title>``.

Relevance stays at the passage level: a retrieved chunk stands for every passage it
overlaps, largest overlap first (a RAPTOR synthesis for its members' passages, in member
order); the ranked list of distinct passages is scored against the set's qrels. (A chunk
that spans several passages so brings all of them, as it would bring them into a prompt.) So every chunker answers the
same question — which passage holds the answer — whatever its chunk size. BM25 only
(the "english" analyzer, which also segments CJK), so no model downloads; ``--semantic``
adds the semantic chunker with the default ONNX embedder (slow on 2 cores).
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import add_io_args, out_dir, require_sets, say_written, use_data  # noqa: E402
from ragspine_pipeline.corpus import make_chunker  # noqa: E402
from ragspine_pipeline.eval.beir import load_beir  # noqa: E402
from ragspine_pipeline.eval.metrics import ndcg_at_k, recall_at_k  # noqa: E402
from ragspine_pipeline.ingest.documents import Document  # noqa: E402
from ragspine_pipeline.ingest.parsers import text_structure  # noqa: E402
from ragspine_pipeline.retrieval.chunking.contextual import make_index_text_fn  # noqa: E402
from ragspine_pipeline.retrieval.hybrid.retriever import HybridRetriever  # noqa: E402
from ragspine_pipeline.retrieval.raptor import build_raptor_tree  # noqa: E402

GROUP = {"cmrc2018-trial": 8, "scifact": 10}
CHUNKERS = ["paragraph", "layout", "parent_child", "sentence_window"]
DEPTH = 100  # passages kept per query (Recall@100)
# Leader clustering is O(chunks x clusters): RAPTOR rows only for sets up to this size.
RAPTOR_MAX_CHUNKS = 3000


def long_documents(name: str, ds) -> tuple[list[Document], dict[str, list[tuple[int, int, str]]]]:
    """Documents and, per document, the (start, end, passage id) spans of its passages."""
    ids = list(ds.corpus)
    groups: list[tuple[str, list[str]]] = []
    if name in GROUP:
        n = GROUP[name]
        groups = [(f"{name}-{i // n:04d}", ids[i:i + n]) for i in range(0, len(ids), n)]
    else:  # one document per article title
        by_title: dict[str, list[str]] = {}
        for pid in ids:
            by_title.setdefault(ds.corpus[pid].title or pid, []).append(pid)
        groups = [(f"{name}-{t}", pids) for t, pids in by_title.items()]
    docs, spans = [], {}
    for doc_id, pids in groups:
        parts, sp, pos = [], [], 0
        if name not in GROUP:
            head = f"# {ds.corpus[pids[0]].title}\n\n"
            parts.append(head)
            pos = len(head)
        for pid in pids:
            block = ds.corpus[pid].text.strip()
            if name in GROUP:
                head = f"## {ds.corpus[pid].title.strip() or pid}\n\n"
                parts.append(head)
                pos += len(head)
            sp.append((pos - (len(head) if name in GROUP else 0), pos + len(block), pid))
            parts.append(block + "\n\n")
            pos += len(block) + 2
        text = "".join(parts)
        docs.append(Document(doc_id, ds.corpus[pids[0]].title, text, {},
                             structure=text_structure(text, markdown=True)))
        spans[doc_id] = sp
    return docs, spans


def passages_of(spans: list[tuple[int, int, str]], start: int, end: int) -> list[str]:
    """The passages a span overlaps, largest overlap first (ties in reading order)."""
    i = max(0, bisect.bisect_right([s for s, _, _ in spans], start) - 1)
    hits: list[tuple[int, int, str]] = []
    for j, (s, e, pid) in enumerate(spans[i:]):
        if s >= end:
            break
        ov = min(e, end) - max(s, start)
        if ov > 0:
            hits.append((-ov, j, pid))
    return [pid for _, _, pid in sorted(hits)] or [spans[i][2]]


def evaluate(retriever: HybridRetriever, to_passages, ds) -> dict[str, float]:
    nd, rc = [], []
    t0 = time.perf_counter()
    for qid, q in ds.queries.items():
        if qid not in ds.qrels:
            continue
        ranked: list[str] = []
        for h in retriever.search(q, top_k=400):
            for p in to_passages(h.chunk):
                if p not in ranked:
                    ranked.append(p)
            if len(ranked) >= DEPTH:
                break
        nd.append(ndcg_at_k(ranked, ds.qrels[qid], 10))
        rc.append(recall_at_k(ranked, ds.qrels[qid], 100))
    return {"ndcg@10": sum(nd) / len(nd), "recall@100": sum(rc) / len(rc), "queries": len(nd),
            "seconds": round(time.perf_counter() - t0, 1)}


def run_set(name: str, root: Path, semantic: bool) -> list[dict]:
    ds = load_beir(root / name)
    docs, spans = long_documents(name, ds)
    rows: list[dict] = []
    specs = CHUNKERS + (["semantic"] if semantic else [])
    for spec in specs:
        chunker = make_chunker(spec)
        chunks = [c for d in docs for c in chunker(d)]
        leaf = {c.chunk_id: c for c in chunks}

        def to_passages(c, leaf=leaf):
            if c.chunk_id in leaf:
                return passages_of(spans[c.doc_id], c.start, c.end)
            return []

        variants = [("off", None)] + ([("on", make_index_text_fn("title,heading"))]
                                      if spec in ("paragraph", "layout") else [])
        for ctx, fn in variants:
            kw = {"index_text": fn} if fn else {}
            r = HybridRetriever(chunks, analyzer="english", **kw)
            res = evaluate(r, to_passages, ds)
            rows.append({"set": name, "chunker": chunker.key, "contextual": ctx, "raptor": "-",
                         "chunks": len(chunks), "mean_chars": round(sum(len(c.text) for c in chunks) / len(chunks)),
                         **res})
            print(json.dumps(rows[-1], ensure_ascii=False), file=sys.stderr)
        if spec == "paragraph" and len(chunks) <= RAPTOR_MAX_CHUNKS:
            tree = build_raptor_tree(chunks, analyzer="english")
            nodes = {n.node_id: n for n in tree.nodes}

            def tree_passages(c, nodes=nodes, to_passages=to_passages, leaf=leaf):
                n = nodes.get(c.chunk_id)
                if n is None or not n.is_synthesis:
                    return to_passages(c)
                return [p for m in n.members for p in passages_of(spans[leaf[m].doc_id], leaf[m].start, leaf[m].end)]

            from ragspine_pipeline.retrieval.raptor.retriever import RaptorRetriever

            for mode in ("collapsed", "internal") if tree.synthesis_nodes() else ("collapsed",):
                rr = RaptorRetriever(tree, chunks, mode=mode, analyzer="english")
                res = evaluate(rr.retriever, tree_passages, ds)
                rows.append({"set": name, "chunker": chunker.key, "contextual": "off", "raptor": mode,
                             "chunks": len(rr.retriever), "mean_chars": round(sum(len(c.text) for c in
                                                                                  rr.retriever.chunks)
                                                                              / len(rr.retriever)),
                             "tree": tree.shape()["nodes_per_level"], **res})
                print(json.dumps(rows[-1], ensure_ascii=False), file=sys.stderr)
    return rows


def write(rows: list[dict], out: Path, command: str) -> list[Path]:
    paths = [out / "chunkers.json", out / "chunkers.md"]
    paths[0].write_text(json.dumps({"command": command, "rows": rows}, ensure_ascii=False, indent=1), encoding="utf-8")
    lines = ["# Chunkers: nDCG@10 / Recall@100 on long documents (BM25, passage-level qrels)\n",
             f"Command: `{command}`\n",
             "Long documents as described in benchmarks/bench_chunkers.py; ratio = nDCG@10 / paragraph's "
             "nDCG@10 on the same set. Contextual = the `title,heading` header (RAGSPINE_CONTEXTUAL) on the "
             f"indexed text. RAPTOR rows (extractive, TF-IDF vectors, threshold 0.35) only for sets of up to "
             f"{RAPTOR_MAX_CHUNKS} paragraph chunks (clustering is O(chunks x clusters)).\n",
             "| set | chunker | contextual | RAPTOR | chunks | mean chars | nDCG@10 | ratio | Recall@100 |",
             "|---|---|---|---|---|---|---|---|---|"]
    base = {r["set"]: r["ndcg@10"] for r in rows if r["chunker"].startswith("paragraph") and r["contextual"] == "off"
            and r["raptor"] == "-"}
    for r in rows:
        lines.append(f"| {r['set']} | {r['chunker']} | {r['contextual']} | {r['raptor']} | {r['chunks']} | "
                     f"{r['mean_chars']} | {r['ndcg@10']:.4f} | {r['ndcg@10'] / base[r['set']]:.3f} | "
                     f"{r['recall@100']:.4f} |")
    paths[1].write_text("\n".join(lines) + "\n", encoding="utf-8")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        sets = list(dict.fromkeys(r["set"] for r in rows))
        fig, axes = plt.subplots(1, len(sets), figsize=(5 * len(sets), 4), squeeze=False)
        for ax, s in zip(axes[0], sets, strict=True):
            rs = [r for r in rows if r["set"] == s]
            labels = [f"{r['chunker'].split(':')[0]}{'+ctx' if r['contextual'] == 'on' else ''}"
                      f"{'+raptor:' + r['raptor'] if r['raptor'] != '-' else ''}" for r in rs]
            ax.barh(labels, [r["ndcg@10"] for r in rs])
            ax.set_title(s)
            ax.set_xlabel("nDCG@10")
        fig.tight_layout()
        png = out / "chunkers.png"
        fig.savefig(png, dpi=90)
        paths.append(png)
    except ImportError:
        pass
    return paths


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sets", default="xquad-de,cmrc2018-trial,scifact")
    ap.add_argument("--semantic", action="store_true", help="also the semantic chunker (default ONNX embedder)")
    add_io_args(ap)
    args = ap.parse_args()
    root = use_data(args.data)
    sets = [s for s in args.sets.split(",") if s]
    require_sets(root, sets)
    out = out_dir(args.out)
    os.environ.setdefault("RAGSPINE_CONTEXTUAL", "off")
    rows = [r for s in sets for r in run_set(s, root, args.semantic)]
    command = "python benchmarks/bench_chunkers.py " + " ".join(sys.argv[1:])
    say_written(write(rows, out, command.strip()))


if __name__ == "__main__":
    main()
