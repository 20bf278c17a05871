"""The result of a layered retrieval: still ``list[dict]``, plus a report.

``retrieve(...)`` keeps the spec's return type: ``RetrievalResult`` *is* a list of
snippet dicts (``json.dump`` writes it as a plain list, ``==`` compares it as a list).
The query layers' account rides along on ``result.report`` — a plain dict, so it can be
logged or serialised next to the snippets:

* ``refused``: ``[{"variant", "reason", "kind"}]`` — every generated query variant (or
  extracted filter) the security gate refused; never hidden;
* ``status``: ``"ok"``, ``"refused"`` (the question itself was refused) or
  ``"refused_weak_context"`` (CRAG judged the context too weak to answer from);
* ``route`` (Adaptive-RAG), ``variants`` (kind + text of each variant searched; a HyDE
  probe is listed by kind and length only, never by its text), ``sub_questions``,
  ``filters`` / ``filters_source`` / ``filters_extracted`` (automatic filters),
  ``corrective`` (each CRAG round's grade and action), ``degraded`` (a layer whose LLM
  failed or answered garbage and was skipped: ``[{"layer", "reason"}]``), ``layers``.

The report is per call (no state on the retriever), so concurrent queries never mix.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Refusal:
    """One refused variant: what was refused, why, and which layer generated it."""

    variant: str
    reason: str
    kind: str = "variant"

    def to_dict(self) -> dict[str, str]:
        return {"variant": self.variant, "reason": self.reason, "kind": self.kind}


class RetrievalResult(list):
    """A ``list`` of snippet dicts carrying the layers' ``report``."""

    def __init__(self, snippets: Any = (), report: dict[str, Any] | None = None) -> None:
        super().__init__(snippets)
        self.report: dict[str, Any] = report if report is not None else new_report()

    @property
    def refused(self) -> list[dict[str, str]]:
        return self.report.get("refused", [])

    @property
    def status(self) -> str:
        return self.report.get("status", "ok")


def new_report(layers: list[str] | None = None) -> dict[str, Any]:
    return {"status": "ok", "refused": [], "degraded": [], "variants": [], "layers": list(layers or [])}


# The report of the retrieve() call running in this context: layers that run deep inside
# the base retriever (the gated glossary rewriter) add their refusals to it. A ContextVar,
# so concurrent queries (threads, asyncio tasks) each see their own.
CURRENT_REPORT: ContextVar[dict[str, Any] | None] = ContextVar("ragspine_query_report", default=None)

# Set while a search probe (a HyDE document) is being searched: anything derived from its
# text (a refused glossary variant) is reported by kind only, never by its text.
CURRENT_PROBE: ContextVar[str | None] = ContextVar("ragspine_query_probe", default=None)
