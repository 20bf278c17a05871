"""LayeredRetriever: the query-time layers around any base retriever.

    question ─▶ gate ─▶ auto filters ─▶ Adaptive route ─▶ legs (question [+ sub-questions])
      each leg: transform variants ─▶ gate each ─▶ base.retrieve (rerank, exits #1/#2)
                ─▶ rrf_fuse ─▶ CRAG grade → act (≤ 2 rounds)
      legs ─▶ deterministic merge (rrf_fuse, de-dup by chunk) ─▶ post-processors ─▶ result

The base is a ``NarrativeIndexRetriever`` or a ``MultiIndexRetriever``: every variant and
sub-question runs its whole guarded path, so the layers only ever see exit-filtered
snippets and no layer can weaken RESTRICTED isolation; the pipeline re-applies
``is_restricted`` to its output as well. ``retrieve`` returns a ``RetrievalResult`` — a
``list[dict]`` as the spec says, carrying ``.report`` (refusals, status, route,
variants, filters, CRAG rounds, degraded layers; see ``result.py``).

Fan-out ceilings (documented in docs/spec-names.md): at most
``MAX_SUBQUESTIONS`` (8) sub-questions, ``MAX_VARIANTS`` (8) variants besides the original
per leg, ``MAX_ROUNDS`` (2) CRAG rounds, and ``MAX_SEARCHES`` (64) base searches per
question in all; what a layer returns past a ceiling is dropped and listed under
``degraded``, so no layer, built in or injected, can fan one question out without bound.

A failing or garbage-answering LLM never raises out of ``retrieve``: the layer is
reported under ``degraded`` and the plain path stands in for it. Input errors (a bad
filter, an over-long query) are still the caller's typed errors.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from ...sensitivity import is_restricted
from ..hybrid.fusion import DEFAULT_RRF_K, rrf_fuse
from ..limits import check_query
from ..postprocess.base import LAYERS_KEY
from .adaptive import DECOMPOSE, SINGLE
from .decompose import MAX_SUBQUESTIONS
from .gate import SecurityGate
from .llm_text import LayerFailure
from .result import CURRENT_PROBE, CURRENT_REPORT, RetrievalResult, new_report
from .transforms import MAX_VARIANTS, Variant

DEFAULT_DEPTH = 20
#: Ceiling on the base searches one question may run, all layers together (legs x
#: variants x CRAG rounds, and the unfiltered re-run); the searches past it are skipped.
MAX_SEARCHES = 64
WEAK = "refused_weak_context"


def _key(s: dict[str, Any]) -> tuple[str, str]:
    return (str(s.get("library_id", "")), str(s.get("chunk_id", "")))


def _with_layers(s: dict[str, Any], names: Sequence[str], **updates: Any) -> dict[str, Any]:
    out = dict(s)
    if names:
        out[LAYERS_KEY] = [*s.get(LAYERS_KEY, []), *names]
    out.update(updates)
    return out


def _fuse(lists: Sequence[list[dict[str, Any]]], labels: Sequence[str], label_key: str,
          k: int) -> list[dict[str, Any]]:
    """RRF over snippet lists (ties by key); each snippet lists the labels that found it."""
    first: dict[tuple[str, str], dict[str, Any]] = {}
    found: dict[tuple[str, str], list[str]] = {}
    for lst, label in zip(lists, labels, strict=True):
        for s in lst:
            first.setdefault(_key(s), s)
            found.setdefault(_key(s), [])
            if label not in found[_key(s)]:
                found[_key(s)].append(label)
    scores = rrf_fuse([[_key(s) for s in lst] for lst in lists], k=k)
    out = []
    for rank, (key, score) in enumerate(scores.items(), start=1):
        s = dict(first[key])
        s["rank"] = rank
        s["scores"] = {**s.get("scores", {}), f"{label_key}_fused": score}
        s[label_key] = list(found[key])
        out.append(s)
    return out


class LayeredRetriever:
    """Query layers over a base retriever (see the module docstring)."""

    def __init__(self, base: Any, *, gate: SecurityGate | None = None, transform: Any = None,
                 decomposer: Any = None, adaptive: Any = None, corrective: Any = None,
                 auto_filters: Any = None, postprocessor: Any = None, depth: int = DEFAULT_DEPTH,
                 rrf_k: int = DEFAULT_RRF_K) -> None:
        if not callable(getattr(base, "retrieve", None)):
            raise TypeError(f"{type(base).__name__} is not a retriever: it needs retrieve(query, *, filters, top_k)")
        for label, obj, method in (("transform", transform, "variants"), ("decomposer", decomposer, "decompose"),
                                   ("adaptive", adaptive, "classify"), ("auto_filters", auto_filters, "extract"),
                                   ("postprocessor", postprocessor, "process")):
            if obj is not None and not callable(getattr(obj, method, None)):
                raise TypeError(f"{label} {type(obj).__name__} needs a {method}() method")
        if corrective is not None and not callable(getattr(corrective, "rewrite", None)):
            raise TypeError("corrective must be a CorrectiveConfig")
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError("depth must be a positive integer")
        self.base = base
        self.gate = gate if gate is not None else SecurityGate()
        self.transform = transform
        self.decomposer = decomposer
        self.adaptive = adaptive
        self.corrective = corrective
        self.auto_filters = auto_filters
        self.postprocessor = postprocessor
        self.depth = depth
        self.rrf_k = rrf_k
        # CRAG replaces the base's single retry-without-filters: the base searches with
        # the filters it is given, and the loop decides (and reports) any relaxation.
        self._relax_allowed = bool(getattr(base, "retry_without_filters", False))
        self._search_base = base
        if corrective is not None and self._relax_allowed:
            self._search_base = copy.copy(base)
            self._search_base.retry_without_filters = False

    def __getattr__(self, name: str) -> Any:
        # index / retrievers / reranker ... of the base, for code that inspects a retriever.
        if name == "base" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.base, name)

    @property
    def layer_names(self) -> list[str]:
        names = ["security_gate"]
        for obj in (self.auto_filters, self.adaptive, self.decomposer, self.transform, self.corrective):
            if obj is not None:
                names.append(getattr(obj, "name", type(obj).__name__))
        if self.postprocessor is not None:
            names += list(getattr(self.postprocessor, "names", [getattr(self.postprocessor, "name", "postprocess")]))
        return names

    # ---------------------------------------------------------------- one leg
    def _variants(self, question: str, report: dict[str, Any]) -> list[Variant]:
        if self.transform is None:
            return [Variant("original", question)]
        try:
            variants = list(self.transform.variants(question))
        except LayerFailure as exc:
            report["degraded"].append({"layer": self.transform.name, "reason": str(exc)})
            return [Variant("original", question)]
        if len(variants) > 1 + MAX_VARIANTS:
            report["degraded"].append({"layer": self.transform.name, "reason": f"{len(variants) - 1} variants: "
                                       f"the first {MAX_VARIANTS} kept (MAX_VARIANTS)"})
            variants = variants[:1 + MAX_VARIANTS]
        return variants or [Variant("original", question)]

    def _search(self, question: str, filters: Any, top_k: int, report: dict[str, Any],
                leg: str) -> list[dict[str, Any]]:
        lists, labels, kinds = [], [], []
        for v in self._variants(question, report):
            if v.kind != "original":
                refusal = self.gate.check_text(v.text, v.kind)
                if refusal is not None:
                    shown = v.shown() if v.probe else refusal.variant
                    report["refused"].append({**refusal.to_dict(), "variant": shown})
                    continue
            if len(report["variants"]) >= MAX_SEARCHES:  # every search is listed there
                if not any(d.get("layer") == "fan_out" for d in report["degraded"]):
                    report["degraded"].append({"layer": "fan_out", "reason": f"the ceiling of {MAX_SEARCHES} "
                                               "searches per question (MAX_SEARCHES) was reached; the rest skipped"})
                break
            report["variants"].append({"kind": v.kind, "variant": v.shown(), "leg": leg})
            token = CURRENT_PROBE.set(v.kind) if v.probe else None
            try:
                lists.append(self._search_base.retrieve(v.text, filters=filters, top_k=top_k))
            finally:
                if token is not None:
                    CURRENT_PROBE.reset(token)
            labels.append(v.kind)
            kinds.append(v.kind)
        if len(lists) == 1 and self.transform is None:
            return list(lists[0])
        name = getattr(self.transform, "name", "transform")
        return [_with_layers(s, [name]) for s in _fuse(lists, labels, "query_variants", self.rrf_k)]

    def _leg(self, question: str, filters: Any, report: dict[str, Any], leg: str,
             may_drop_filters: bool, depth: int) -> list[dict[str, Any]]:
        snippets = self._search(question, filters, depth, report, leg)
        crag = self.corrective
        if crag is None:
            return snippets
        actions = (["drop_filters"] if filters and may_drop_filters else []) + ["rewrite"]
        rounds: list[dict[str, Any]] = []
        q, f, relaxed = question, filters, False
        grade = crag.grader.grade(question, snippets)
        for round_no in range(1, crag.max_rounds + 1):
            if grade.ok or not actions:
                break
            action = actions.pop(0)
            entry: dict[str, Any] = {"leg": leg, "round": round_no, "grade": grade.to_dict(), "action": action}
            if action == "drop_filters":
                f, relaxed = None, True
            else:
                rw = crag.rewrite(question)
                refusal = self.gate.check_text(rw, "crag_rewrite")
                if refusal is not None:
                    report["refused"].append(refusal.to_dict())
                    entry["action"] = "rewrite_refused"
                    rounds.append(entry)
                    break
                q = rw
                entry["rewrite"] = rw
            rounds.append(entry)
            snippets = self._search(q, f, depth, report, leg)
            if relaxed:
                snippets = [{**s, "filters_relaxed": True} for s in snippets]
            grade = crag.grader.grade(question, snippets)
        rounds.append({"leg": leg, "round": len(rounds) + 1, "grade": grade.to_dict(),
                       "action": "accept" if grade.ok else "refuse"})
        report.setdefault("corrective", []).extend(rounds)
        if not grade.ok:
            return []
        return [_with_layers(s, [crag.name]) for s in snippets]

    # ------------------------------------------------------------- the query
    def retrieve(self, query: str, *, filters: Any = None, top_k: int = 50) -> RetrievalResult:
        check_query(query)
        report = new_report(self.layer_names)
        if top_k <= 0:
            return RetrievalResult([], report)
        token = CURRENT_REPORT.set(report)
        try:
            return self._retrieve(query, filters, top_k, report)
        finally:
            CURRENT_REPORT.reset(token)

    def _retrieve(self, query: str, filters: Any, top_k: int, report: dict[str, Any]) -> RetrievalResult:
        depth = max(self.depth, top_k)  # per call: the retriever holds no per-query state
        self.gate.check_filters(filters, filters)  # the user's own filters must compile (FilterError)
        refusal = self.gate.check_text(query, "original")
        if refusal is not None:
            report["refused"].append(refusal.to_dict())
            report["status"] = "refused"
            return RetrievalResult([], report)

        effective, source = (filters if filters else None), ("user" if filters else "none")
        if self.auto_filters is not None and not filters:
            try:
                extracted, notes = self.auto_filters.extract(query)
            except Exception as exc:  # noqa: BLE001 - a failed extraction never narrows or widens
                extracted, notes = {}, []
                report["degraded"].append({"layer": "auto_filters", "reason": f"{type(exc).__name__}: {exc}"})
            report["filters_extracted"] = extracted
            if notes:
                report["filter_notes"] = notes
            if extracted:
                refusal = self.gate.check_filters(None, extracted, "extracted_filter")
                if refusal is not None:
                    report["refused"].append(refusal.to_dict())
                else:
                    effective, source = extracted, "extracted"
        report["filters"], report["filters_source"] = effective, source
        # Extracted filters may always fall back to the unfiltered set (the user's scope);
        # the user's own filters only when the base allowed relaxation.
        may_drop = source == "extracted" or self._relax_allowed

        legs = [query]
        route = None
        if self.adaptive is not None:
            route = self.adaptive.classify(query)
            report["route"] = route.to_dict()
        want_decompose = self.decomposer is not None and (route is None or route.route == DECOMPOSE)
        if route is not None and route.route == DECOMPOSE and self.decomposer is None:
            report["degraded"].append({"layer": "adaptive", "reason": "route decompose but no decomposer "
                                       "configured (RAGSPINE_QUERY_DECOMPOSE); single-shot"})
        if want_decompose:
            try:
                subs = self.decomposer.decompose(query)
            except LayerFailure as exc:
                subs = []
                report["degraded"].append({"layer": getattr(self.decomposer, "name", "decompose"),
                                           "reason": str(exc)})
            if len(subs) > MAX_SUBQUESTIONS:
                report["degraded"].append({"layer": getattr(self.decomposer, "name", "decompose"),
                                           "reason": f"{len(subs)} sub-questions: the first {MAX_SUBQUESTIONS} "
                                                     "kept (MAX_SUBQUESTIONS)"})
                subs = list(subs)[:MAX_SUBQUESTIONS]
            for sq in subs:
                refusal = self.gate.check_text(sq, "sub_question")
                if refusal is not None:
                    report["refused"].append(refusal.to_dict())
                elif sq not in legs:
                    legs.append(sq)
        report["sub_questions"] = legs[1:]
        if route is not None:
            report["route"]["taken"] = DECOMPOSE if len(legs) > 1 else SINGLE

        results = [self._leg(q, effective, report, q, may_drop, depth) for q in legs]
        if source == "extracted" and not any(results) and self.corrective is None:
            # Extracted filters that match nothing never narrow the answer to nothing.
            report["filters_dropped"] = True
            results = [self._leg(q, None, report, q, False, depth) for q in legs]
        if len(legs) > 1:
            merged = [_with_layers(s, [getattr(self.decomposer, "name", "decompose")])
                      for s in _fuse(results, legs, "sub_questions", self.rrf_k)]
        else:
            merged = results[0]
        if self.corrective is not None and not any(results):
            report["status"] = WEAK
        snippets = [s for s in merged if not is_restricted(s.get("sensitivity"))][:top_k]
        if self.postprocessor is not None:
            snippets = [s for s in self.postprocessor.process(query, snippets)
                        if not is_restricted(s.get("sensitivity"))]
        return RetrievalResult(snippets, report)
