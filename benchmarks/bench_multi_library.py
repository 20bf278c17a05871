"""One collection split into libraries must rank as the collection does (issue 43, item 1).

For each shared eval set: the set as ONE library (the reference line), then the same
documents split into 2 and 4 libraries by a hash of the doc id, and the 2-way split with
two unrelated eval sets added as extra libraries (their documents are noise for every
query). Each multi-library setup is asked through ``MultiIndexRetriever`` (router
``none``: every library) under each ``RAGSPINE_MULTI_FUSION`` mode:

* ``rrf``: each library ranked alone, the lists fused by rank (the spec's rule; the only
  behaviour before issue 43, so a run on older code measures it whatever the variable says);
* ``global``: one ranking over the union (BM25 with the statistics of the libraries that
  hold the query's language, ``language_scope``; raw cosine across libraries; one fusion);
* ``global-union``: ``global`` with every library's BM25 statistics summed whatever the
  query's language (``MultiIndexRetriever(language_scope=False)``, the ``global`` of
  before the scope), so one run compares the two on the same code.

nDCG@10 at document level (a document at its best chunk) over every judged query, with
``retrieve(top_k=10)``, the product's default analyzer and whole-document chunks (as
``ragspine eval``). The target: every split within 0.005 of the one-library line.

``bm25`` runs on every set; hybrid (BM25 + a dense backend, RRF) on the sets named by
``--hybrid-sets`` (default the two English ones) with the model of ``--hybrid-model``:
``minilm`` (channels ``hybrid``, the model ``auto`` picks for English), ``e5`` (channels
``hybrid-e5``, the multilingual model ``auto`` picks for every other language group,
``auto_policy.json``), or ``auto`` (per set: ``minilm`` for the English sets, ``e5`` for the
rest). Passage and query vectors are cached per text under ``benchmarks/.cache/vectors``
(git-ignored), so the splits reuse the one library's vectors and a rerun embeds nothing.
``--setups`` runs a subset of the setups (the ``split2+A+B`` one embeds the two extra sets
too, the costly part for e5 on a small CPU).

``--hybrid-fusion policy`` measures hybrid the way ``RAGSPINE_EMBEDDING_BACKEND=auto``
runs it (channels ``hybrid-policy``, with ``--hybrid-model auto``): the set's chunks are
resolved by the product's own ``AutoEmbeddingBackend.resolve`` (``auto_policy.py``: the
language profile of ``(text, language, doc_id)`` items, as the warehouse's embeddings step
passes them), and the model AND the fusion it picks (e.g. CJK: e5, convex, dense weight
0.5) are given to every library of every setup, the one library, the split parts and the
extra libraries alike. So the one-library line, each library's own fusion (``rrf`` mode)
and the union's one fusion (``global``: ``global_rank.common_fusion`` takes the libraries'
shared config, convex included, when they share one model) all fuse as the product does
for that set. The JSON's ``policy`` records each set's choice, whether every split part
resolved alone picks the same, what each extra library would pick on its own, and how
many texts were embedded rather than read from the cache. ``--hybrid-fusion policy-own``
(channels ``hybrid-policy-own``) resolves every library on its own chunks instead, as the
warehouse does per library: parts (or extra libraries) that pick another model or fusion
make ``global`` fall back to RRF between them (``global_rank``). The default ``rrf`` is the
behaviour of before (plain RRF, the index default).

Resumable: each finished (set, channels, setup, mode) cell is written to the JSON at once,
and a rerun skips the cells already there (``--fresh`` starts over).

    python benchmarks/bench_multi_library.py --out benchmarks/results --label after
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import add_io_args, out_dir, require_sets, say_written, use_data  # noqa: E402
from ragspine_pipeline.corpus import ingest_documents  # noqa: E402
from ragspine_pipeline.eval.beir import load_beir  # noqa: E402
from ragspine_pipeline.eval.metrics import dedupe_keep_best, ndcg_at_k  # noqa: E402
from ragspine_pipeline.eval.runner import EvalConfig, _chunker, beir_documents  # noqa: E402
from ragspine_pipeline.retrieval.chunking.chunk_store import ChunkStore  # noqa: E402
from ragspine_pipeline.retrieval.link.multi_index import MultiIndexRetriever  # noqa: E402
from ragspine_pipeline.retrieval.link.narrative_link import NarrativeIndex, NarrativeIndexRetriever  # noqa: E402

ENGLISH_SETS = ("scifact", "cranfield")  # auto_policy.json's "en" group: minilm; every other group: e5
SETS = ("scifact", "cranfield", "cmrc2018-trial", "xquad-de", "xquad-ru", "xquad-ar", "xquad-th")
# Extra (unrelated) libraries per set: two other sets, English ones first (they share the
# most vocabulary with the English sets, so they are the harder noise).
NOISE_POOL = ("cranfield", "scifact", "xquad-de")
# ``global-union``: ``global`` with every library's BM25 statistics summed whatever the
# query's language (``language_scope=False``; the default before the language scope).
MODES = ("rrf", "global", "global-union")
SETUPS = ("split2", "split4", "split2+")
# nDCG@10 needs the first 10 only; a fused top 10 is the same from top-10 or top-100 lists
# (a hit past rank 10 of its list is outranked by that list's own first 10, in RRF and in a
# score-merged union alike). The "before" table was asked with top_k=100.
DEPTH = 10
TOLERANCE = 0.005
CACHE = Path(__file__).resolve().parent / ".cache" / "vectors"
MULTI_FUSION_ENV = "RAGSPINE_MULTI_FUSION"
HYBRID_FUSIONS = ("rrf", "policy", "policy-own")
POLICY_CHANNELS = "hybrid-policy"
OWN_CHANNELS = "hybrid-policy-own"  # every library resolved on its own chunks


def bucket(doc_id: str, n: int) -> int:
    """A stable library for a document: the doc id's hash, mod ``n``."""
    return int.from_bytes(hashlib.blake2b(doc_id.encode(), digest_size=8).digest(), "big") % n


def set_chunks(root: Path, name: str, prefix: str = "") -> tuple[list[Any], Any]:
    """A set's chunks (whole-document chunker) and its dataset; ``prefix`` renames doc ids."""
    ds = load_beir(root / name)
    docs = beir_documents(ds)
    if prefix:
        docs = [dataclasses.replace(d, doc_id=f"{prefix}{d.doc_id}") for d in docs]
    with ChunkStore(":memory:") as store:
        ingest_documents(store, docs, scope_prefix="", chunker=_chunker(EvalConfig()))
        return list(store.iter_chunks()), ds


_BACKEND: dict[str, Any] = {}


def hybrid_channels(name: str, model: str, fusion: str = "rrf") -> str:
    """The channels label of a set's hybrid cells: ``hybrid`` (MiniLM, the label of before),
    ``hybrid-MODEL``, or ``hybrid-policy`` (model and fusion from ``auto_policy``)."""
    if fusion.startswith("policy"):
        return POLICY_CHANNELS if fusion == "policy" else OWN_CHANNELS
    if model == "auto":
        model = "minilm" if name in ENGLISH_SETS else "e5"
    return "hybrid" if model == "minilm" else f"hybrid-{model}"


def model_backend(model: str) -> Any:
    """One backend per model and process, its vectors cached per text under ``CACHE``."""
    if model not in _BACKEND:
        from ragspine_pipeline.retrieval.vector.embedding_backends import make_embedding_backend
        from ragspine_pipeline.vector_cache import CachingEmbeddingBackend

        _BACKEND[model] = CachingEmbeddingBackend(make_embedding_backend(model), CACHE)
    return _BACKEND[model]


def backend(channels: str) -> Any:
    if channels == "bm25":
        return None
    return model_backend("minilm" if channels == "hybrid" else channels.removeprefix("hybrid-"))


def policy_choice(chunks: Sequence[Any]) -> Any:
    """What ``RAGSPINE_EMBEDDING_BACKEND=auto`` picks for a library of ``chunks``: the
    product's ``AutoEmbeddingBackend.resolve`` over ``(text, language, doc_id)`` items, as
    the warehouse's embeddings step builds them (an ``AutoChoice``: model, fusion, reason).
    No model is loaded to decide."""
    from ragspine_pipeline.retrieval.vector.auto_policy import AutoEmbeddingBackend

    return AutoEmbeddingBackend(model_backend).resolve((c.text, c.language or None, c.doc_id) for c in chunks)


def choice_text(choice: Any) -> str:
    """``model method w=weight``: one choice in a table cell."""
    return f"{choice.model} {choice.fusion.method} w={choice.fusion.dense_weight:g}"


def same_choice(a: Any, b: Any) -> bool:
    return (a.model, a.fusion.method, a.fusion.dense_weight) == (b.model, b.fusion.method, b.fusion.dense_weight)


def library(chunks: Sequence[Any], name: str, channels: str, choice: Any = None) -> NarrativeIndexRetriever:
    """One library's retriever; ``choice`` (an ``AutoChoice``) sets its dense model and fusion."""
    if choice is not None:  # dense weight 0 (auto's guard): hybrid is BM25 only, nothing is embedded
        be = model_backend(choice.model) if choice.uses_dense else None
    else:
        be = backend(channels)
    extra = {"fusion": choice.fusion} if choice is not None else {}
    idx = NarrativeIndex.from_chunks(list(chunks), embedding_backend=be, library_id=name,
                                     channels=("bm25", "dense") if be is not None else ("bm25",), **extra)
    if be is not None:
        import numpy as np

        idx.retriever.ensure_vectors(np.arange(len(idx.retriever.chunks)))  # embed (or read the cache) now
    return NarrativeIndexRetriever(idx)


def score(retriever: Any, queries: list[tuple[str, dict[str, float]]]) -> dict[str, Any]:
    t0 = time.perf_counter()
    total = 0.0
    for text, qrels in queries:
        out = retriever.retrieve(text, top_k=DEPTH)
        total += ndcg_at_k(dedupe_keep_best([s["doc_id"] for s in out]), qrels, 10)
    n = len(queries)
    return {"ndcg@10": round(total / n, 4), "queries": n,
            "ms_per_query": round((time.perf_counter() - t0) * 1000 / n, 2)}


def setups(chunks: list[Any], name: str, root: Path, channels: str,
           wanted: Sequence[str] = SETUPS) -> dict[str, dict[str, list[Any]]]:
    """Setup name -> {library: chunks}, for the setups in ``wanted`` (``split2+``: with the extra sets)."""
    out: dict[str, dict[str, list[Any]]] = {}
    for n in (2, 4):
        libs: dict[str, list[Any]] = {}
        for c in chunks:
            libs.setdefault(f"part{bucket(c.doc_id, n)}", []).append(c)
        out[f"split{n}"] = libs
    if "split2+" in wanted:
        noise = [s for s in NOISE_POOL if s != name][:2]
        plus = dict(out["split2"])
        for s in noise:
            plus[f"noise-{s}"] = set_chunks(root, s, prefix=f"noise-{s}/")[0]
        out["split2+" + "+".join(noise)] = plus
    return {k: v for k, v in out.items() if k in wanted or (k.startswith("split2+") and "split2+" in wanted)}


def scope_arg(mode: str) -> dict[str, bool]:
    """``global-union`` turns the language scope off (on code without it, no argument)."""
    import inspect

    if "language_scope" not in inspect.signature(MultiIndexRetriever).parameters:
        return {}
    return {"language_scope": mode != "global-union"}


def git_head() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parents[1], check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def write_md(path: Path, data: dict[str, Any]) -> None:
    lines = [f"# Multi-library ranking: a split collection against the same set as one library ({data['label']})",
             "", f"Command: `{data.get('command', '')}`  ", f"Code: {data['code']}; machine: {data['machine']}", "",
             *[f"Then: `{m['command']}` (code {m['code']}; machine: {m['machine']})  " for m in data.get("more_commands", [])],
             *([""] if data.get("more_commands") else []),
             f"nDCG@10 (document level, all judged queries, `retrieve(top_k={data.get('top_k', 100)})`, router none). "
             "Setups: the set "
             "hashed into 2 or 4 libraries by doc id; `split2+A+B`: the 2-way split plus sets A and B as extra "
             "libraries. Δ = split − one library; the target is |Δ| ≤ 0.005 "
             "(`rrf`: per-library ranking fused by rank, the spec's rule; `global`: one ranking over the union, "
             "BM25 weighed against the libraries of the query's language; `global-union`: the same with every "
             "library's statistics summed, the `global` of before the language scope).",
             "", "| set | channels | one library | setup | mode | nDCG@10 | Δ | within 0.005 | ms/query |",
             "|---|---|---|---|---|---|---|---|---|"]
    def order(key: str) -> tuple[Any, ...]:
        s, ch, setup, mode = key.split("|")
        return (ch != "bm25", SETS.index(s) if s in SETS else len(SETS), s,
                ("split2", "split4").index(setup) if setup in ("split2", "split4") else 2,
                MODES.index(mode) if mode in MODES else len(MODES))

    for key in sorted(data["cells"], key=order):
        cell = data["cells"][key]
        s, ch, setup, mode = key.split("|")
        if setup == "one":
            continue
        one = data["cells"].get(f"{s}|{ch}|one|-")
        if one is None:
            continue
        d = cell["ndcg@10"] - one["ndcg@10"]
        lines.append(f"| {s} | {ch} | {one['ndcg@10']:.4f} | {setup} | {mode} | {cell['ndcg@10']:.4f} | "
                     f"{d:+.4f} | {'yes' if abs(d) <= TOLERANCE else 'no'} | {cell['ms_per_query']} |")
    for ch in (POLICY_CHANNELS, OWN_CHANNELS):
        if data.get("policy") and any(k.split("|")[1] == ch for k in data["cells"]):
            lines += policy_lines(data, ch)
    if data.get("diagnosis"):
        lines += ["", f"Where the `split2+A+B` loss of `global-union` comes from (BM25, "
                  f"`{data.get('diagnosis_command', '--diagnose')}`: "
                  "`rank_union` top 10, no duplicate collapsing): *stats only* ranks the set's own libraries with "
                  "the union's statistics (the unrelated libraries count in N, length and df but return no hit); "
                  "*their documents* = union − stats only; *in top 10*: queries with an unrelated document in the "
                  "union's top 10 (documents in all); *scoped*: with the language scope; *one collection*: every "
                  "document of the setup indexed as a single library (what the union is meant to rank alike; "
                  "*max query diff*: the largest per-query nDCG@10 difference between the union and it).", "",
                  "| set | setup | one library | union Δ | stats only Δ | their documents Δ | in top 10 | "
                  "queries worse / better (union) | scoped Δ | one collection Δ | max query diff |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for s, d in data["diagnosis"].items():
            lines.append(f"| {s} | {d['setup']} | {d['one']:.4f} | {d['union'] - d['one']:+.4f} | "
                         f"{d['stats_only'] - d['one']:+.4f} | {d['union'] - d['stats_only']:+.4f} | "
                         f"{d['queries_with_unrelated']} ({d['unrelated_docs']}) | {d['worse']} / {d['better']} | "
                         f"{d['scoped'] - d['one']:+.4f} | "
                         + (f"{d['one_collection'] - d['one']:+.4f} | {d['union_vs_one_collection_max_query_diff']:.4f} |"
                            if "one_collection" in d else "- | - |"))
    if data.get("notes"):
        lines += ["", *data["notes"]]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def policy_lines(data: dict[str, Any], channels: str = POLICY_CHANNELS) -> list[str]:
    """The ``hybrid-policy`` (or ``-own``) summary: per set the ``auto`` choice, BM25 and
    hybrid one library, hybrid >= BM25, and each split's Δ per mode."""
    cells = data["cells"]
    seen = {k.split("|")[2].split("+")[0] + ("+" if "+" in k.split("|")[2] else "")
            for k in cells if k.split("|")[1] == channels}
    setups_seen = [s for s in SETUPS if s in seen]  # split2+: each set's own split2+A+B
    modes = [m for m in MODES if any(k.endswith(f"|{m}") for k in cells)]
    given = ("given to every library of every setup" if channels == POLICY_CHANNELS else
             "the one library's; each library of a setup resolves its own (its *own choice* in the JSON)")
    out = ["", f"Hybrid as `RAGSPINE_EMBEDDING_BACKEND=auto` runs it (channels `{channels}`): the model "
           "and fusion `auto_policy` picks for the set (`AutoEmbeddingBackend.resolve` over the set's chunks), "
           f"{given}. Δ = {channels} split − {channels} one library, per "
           f"mode ({' / '.join(f'`{m}`' for m in modes)}); *parts agree*: each split part resolved alone picks "
           "the same; *embedded*: texts embedded by the run rather than read from the vector cache.", "",
           f"| set | auto choice | BM25 one library | {channels} one library | hybrid ≥ BM25 | "
           + " | ".join(f"{s}{'A+B' if s.endswith('+') else ''} Δ" for s in setups_seen)
           + " | parts agree | embedded |",
           "|---|---|---|---|---|" + "---|" * len(setups_seen) + "---|---|"]
    for s in sorted(data["policy"], key=lambda s: SETS.index(s) if s in SETS else len(SETS)):
        p = data["policy"][s]
        bm, hy = cells.get(f"{s}|bm25|one|-"), cells.get(f"{s}|{channels}|one|-")
        if hy is None:
            continue
        deltas = []
        for column in setups_seen:
            exact = "" if column.endswith("+") else "|"  # split2 is not split2+A+B
            setup = next((k.split("|")[2] for k in cells if k.startswith(f"{s}|{channels}|{column}{exact}")), column)
            got = [cells.get(f"{s}|{channels}|{setup}|{m}") for m in modes]
            deltas.append(" / ".join("–" if c is None else f"{c['ndcg@10'] - hy['ndcg@10']:+.4f}" for c in got))
        agree = {st: v["parts_agree"] for st, v in p.get("setups", {}).items()}
        emb = sum(n for c in p.get("embedded_now", {}).get(channels, {}).values() for n in c.values())
        f = p["fusion"]
        out.append(f"| {s} | {p['group']}: {p['model']} {f['method']} w={f['dense_weight']:g} | "
                   f"{'–' if bm is None else format(bm['ndcg@10'], '.4f')} | {hy['ndcg@10']:.4f} | "
                   f"{'–' if bm is None else ('yes' if hy['ndcg@10'] >= bm['ndcg@10'] else 'no')} | "
                   + " | ".join(deltas) + f" | {'–' if not agree else 'yes' if all(agree.values()) else 'no'} | {emb} |")
    return out


class _Unranked:
    """A library's BM25 index that counts in the union's statistics but returns no hit."""

    def __init__(self, index: Any) -> None:
        self.index = index

    def survivor_stats(self, *args: Any, **kwargs: Any) -> Any:
        return self.index.survivor_stats(*args, **kwargs)

    def search(self, toks: Any, k: int = 10, candidates: Any = None, *, stats: Any = None) -> Any:
        got = self.index.search(toks, k=k, candidates=candidates, stats=stats)
        return dataclasses.replace(got, ids=got.ids[:0], scores=got.scores[:0])


def diagnose(root: Path, name: str) -> dict[str, Any]:
    """Split a ``split2+A+B`` BM25 loss into the statistics' part and the unrelated documents' part."""
    import copy

    import numpy as np

    from ragspine_pipeline.retrieval.link.global_rank import rank_union

    chunks, ds = set_chunks(root, name)
    queries = [(ds.queries[q], {d: float(g) for d, g in ds.qrels[q].items()}) for q in ds.judged_queries]
    key, libs = next((k, v) for k, v in setups(chunks, name, root, "bm25").items() if k.startswith("split2+"))
    parts = {lib: library(cs, lib, "bm25").index.retriever for lib, cs in sorted(libs.items())}
    muted = dict(parts)
    for lib in (lib for lib in parts if lib.startswith("noise-")):
        muted[lib] = copy.copy(parts[lib])
        muted[lib].index = _Unranked(parts[lib].index)

    def run(ps: dict[str, Any], scoped: bool) -> tuple[Any, Any]:
        got = [rank_union(ps, text, None, DEPTH, language_scoped=scoped) for text, _ in queries]
        ndcg = [ndcg_at_k(dedupe_keep_best([h.hit.chunk.doc_id for h in hits]), qrels, 10)
                for hits, (_, qrels) in zip(got, queries, strict=True)]
        return np.array(ndcg), np.array([sum(h.library_id.startswith("noise-") for h in hits) for hits in got])

    one, _ = run({name: library(chunks, name, "bm25").index.retriever}, False)
    union, noise = run(parts, False)
    # The reference the union is meant to equal: every document of the setup in one library.
    every = [c for lib in sorted(libs) for c in libs[lib]]
    together, _ = run({"together": library(every, f"{name}-together", "bm25").index.retriever}, False)
    return {"setup": key, "one": float(one.mean()), "union": float(union.mean()),
            "one_collection": float(together.mean()),
            "union_vs_one_collection_max_query_diff": float(abs(union - together).max()),
            "stats_only": float(run(muted, False)[0].mean()), "scoped": float(run(parts, True)[0].mean()),
            "queries_with_unrelated": int((noise > 0).sum()), "unrelated_docs": int(noise.sum()),
            "worse": int((union < one - 1e-9).sum()), "better": int((union > one + 1e-9).sum())}


def record_choice(data: dict[str, Any], name: str, choice: Any) -> None:
    """The set's ``auto`` choice (model, fusion, why) under ``data["policy"][name]``."""
    entry = data.setdefault("policy", {}).setdefault(name, {})
    entry.update({"group": choice.group, "model": choice.model, "fusion": choice.fusion.to_dict(),
                  "reason": choice.reason})


def record_setup_choices(data: dict[str, Any], name: str, setup: str, libs: Mapping[str, Sequence[Any]],
                         choice: Any) -> dict[str, Any]:
    """What each library of ``setup`` would pick if resolved on its own: a split part should
    pick the set's choice (the bench gives it that choice either way); an extra library of
    another language may not (in the product its own model, and ``global`` would then fuse
    the two models' lists by rank: ``global_rank``'s ``rank_per_model``)."""
    own = {lib: policy_choice(cs) for lib, cs in sorted(libs.items())}
    entry = data.setdefault("policy", {}).setdefault(name, {})
    entry.setdefault("setups", {})[setup] = {
        "parts_agree": all(same_choice(c, choice) for lib, c in own.items() if not lib.startswith("noise-")),
        "own_choice": {lib: choice_text(c) for lib, c in own.items()}}
    return own


def embedded_counts() -> dict[str, dict[str, int]]:
    """Texts each model's backend embedded in this process (not read from the vector cache)."""
    return {m: dict(be.embedded) for m, be in sorted(_BACKEND.items())}


def note_embedded(data: dict[str, Any], name: str, channels: str,
                  start: Mapping[str, Mapping[str, int]] | None) -> None:
    """Texts embedded for set ``name``'s ``channels`` cells since ``start`` (the counts when
    they began): 0 is every vector from the cache. Nothing without a policy choice."""
    if start is None:
        return
    now = embedded_counts()
    data["policy"][name].setdefault("embedded_now", {})[channels] = {
        m: {k: n - start.get(m, {}).get(k, 0) for k, n in c.items()} for m, c in now.items()}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_io_args(ap)
    ap.add_argument("--sets", nargs="*", default=list(SETS))
    ap.add_argument("--hybrid-sets", nargs="*", default=["cranfield", "scifact"])
    ap.add_argument("--hybrid-model", choices=("minilm", "e5", "e5-int8", "auto"), default="minilm",
                    help="dense model of the hybrid cells (auto: minilm for English sets, e5 for the rest; "
                         "with --hybrid-fusion policy: the model auto_policy picks)")
    ap.add_argument("--hybrid-fusion", choices=HYBRID_FUSIONS, default="rrf",
                    help="how the hybrid cells fuse BM25 and dense: rrf (plain RRF, the index default) or policy "
                         "(model and fusion of RAGSPINE_EMBEDDING_BACKEND=auto for the set, channels hybrid-policy) "
                         "or policy-own (each library resolved on its own chunks); policy* needs --hybrid-model auto")
    ap.add_argument("--setups", nargs="*", choices=SETUPS, default=list(SETUPS))
    ap.add_argument("--modes", nargs="*", default=list(MODES))
    ap.add_argument("--label", default="after", help="results file suffix: multi_library[_LABEL].json")
    ap.add_argument("--limit", type=int, default=None, help="first N judged queries per set (smoke runs)")
    ap.add_argument("--fresh", action="store_true")
    ap.add_argument("--diagnose", action="store_true",
                    help="only the split2+A+B BM25 diagnosis of each set (statistics vs unrelated documents)")
    args = ap.parse_args(argv)
    if args.hybrid_fusion != "rrf" and args.hybrid_model != "auto":
        ap.error("--hybrid-fusion policy takes the model auto_policy picks: pass --hybrid-model auto")
    root = use_data(args.data)
    require_sets(root, set(args.sets) | set(NOISE_POOL))
    out = out_dir(args.out)
    stem = "multi_library" if args.label == "after" else f"multi_library_{args.label}"
    jpath, mpath = out / f"{stem}.json", out / f"{stem}.md"
    data: dict[str, Any] = {} if args.fresh or not jpath.exists() else json.loads(jpath.read_text())
    command = "python " + " ".join(sys.argv)
    machine = {"cpu_count": os.cpu_count(), "loadavg_at_start": [round(x, 2) for x in os.getloadavg()]}
    data["label"] = args.label
    if args.diagnose:
        data["diagnosis_command"] = command
    elif data.get("command", command) != command:
        # A later run adding cells (other sets, another hybrid model) keeps the first run's header
        # and is listed below it with its own code and load, so every cell's command is on the page.
        more = data.setdefault("more_commands", [])
        if not any(m["command"] == command for m in more):
            more.append({"command": command, "code": git_head(), "machine": machine})
    else:
        data["command"] = command
    data.setdefault("code", git_head())
    data.setdefault("machine", machine)
    data.setdefault("cells", {})
    data["top_k"] = DEPTH

    def save() -> None:
        jpath.write_text(json.dumps(data, indent=1), encoding="utf-8")
        write_md(mpath, data)

    if args.diagnose:
        for name in args.sets:
            data.setdefault("diagnosis", {})[name] = diagnose(root, name)
            save()
            print(name, data["diagnosis"][name], file=sys.stderr, flush=True)
        say_written([jpath, mpath])
        return 0
    plan = [(s, "bm25") for s in args.sets] + [(s, hybrid_channels(s, args.hybrid_model, args.hybrid_fusion))
                                                for s in args.sets if s in args.hybrid_sets]
    for name, channels in plan:
        chunks, ds = set_chunks(root, name)
        qids = ds.judged_queries[: args.limit] if args.limit else ds.judged_queries
        queries = [(ds.queries[q], {d: float(g) for d, g in ds.qrels[q].items()}) for q in qids]
        choice = policy_choice(chunks) if channels in (POLICY_CHANNELS, OWN_CHANNELS) else None
        start = None
        if choice is not None:
            record_choice(data, name, choice)
            start = embedded_counts()
        key = f"{name}|{channels}|one|-"
        if key not in data["cells"]:
            data["cells"][key] = score(library(chunks, name, channels, choice), queries)
            note_embedded(data, name, channels, start)
            save()
            print(key, data["cells"][key], file=sys.stderr, flush=True)
        todo = [(setup, mode) for setup in args.setups for mode in args.modes]
        if all(any(k.startswith(f"{name}|{channels}|{s}") and k.endswith(f"|{m}") for k in data["cells"])
               for s, m in todo):
            continue
        for setup, libs in setups(chunks, name, root, channels, args.setups).items():
            own = record_setup_choices(data, name, setup, libs, choice) if choice is not None else {}
            if channels != OWN_CHANNELS:
                own = dict.fromkeys(libs, choice)
            retrievers = {lib: library(cs, lib, channels, own[lib]) for lib, cs in sorted(libs.items())}
            note_embedded(data, name, channels, start)
            save()
            for mode in args.modes:
                key = f"{name}|{channels}|{setup}|{mode}"
                if key in data["cells"]:
                    continue
                os.environ[MULTI_FUSION_ENV] = mode.split("-")[0]
                try:
                    multi = MultiIndexRetriever(retrievers, router=None, **scope_arg(mode))
                finally:
                    os.environ.pop(MULTI_FUSION_ENV, None)
                data["cells"][key] = score(multi, queries)
                save()
                print(key, data["cells"][key], file=sys.stderr, flush=True)
    save()
    say_written([jpath, mpath])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
