"""The ``ask`` job: a question from the UI's launchpad, answered with cited snippets.

The launchpad opens with an example question filled in. ``filters`` is structured (a
list of ``{field, op, value | values}`` clauses, all of which must hold), so the UI shows
each part with its description instead of a JSON string to get right by hand. A value
that no served document has, or an operand of the wrong shape, fails the run with a
message naming the clause instead of silently answering without the filter.
"""

import json

import dagster as dg
from pydantic import Field

from ragspine_pipeline.filter_input import check_filter_values, coerce_operand
from ragspine_pipeline.retrieval.filters import OPERATORS, FilterError
from ragspine_pipeline.retrieval.hybrid.retriever import FILTER_FIELDS
from ragspine_pipeline.snippet_format import snippet_markdown
from resources import RetrievalResource
from resources.retrieval import LAYER_FIELDS

EXAMPLE_QUERY = "why close the Lyon plant"
_LIST_OPS = ("in", "nin", "between")


class FilterClause(dg.Config):
    """One metadata condition; the clauses of a question are AND-combined."""

    field: str = Field(description="Metadata field: " + ", ".join(sorted(FILTER_FIELDS)) + ".")
    op: str = Field(default="eq", description="Operator: " + ", ".join(OPERATORS)
                    + ". Ordered operators compare as the field's type (period is text, version a number).")
    value: str = Field(default="", description="Operand of eq, ne, gt, gte, lt, lte, e.g. ACME_CN or 2023.")
    values: list[str] = Field(default=[], description="Operands of in / nin (any number) or between (exactly lo, hi).")

    def as_triple(self) -> tuple:
        if self.field not in FILTER_FIELDS:
            raise FilterError(f"unknown field {self.field!r}; known fields: {', '.join(sorted(FILTER_FIELDS))}")
        if self.op not in OPERATORS:
            raise FilterError(f"unknown operator {self.op!r}; use one of {', '.join(OPERATORS)}")
        if self.op in _LIST_OPS:
            if self.value:
                raise FilterError(f"{self.op} takes 'values' (a list), not 'value'")
            if self.op == "between" and len(self.values) != 2:
                raise FilterError("between needs exactly two values: lo, hi")
            return (self.field, self.op, [coerce_operand(self.field, v) for v in self.values])
        if self.values or not self.value.strip():
            raise FilterError(f"{self.op} takes one 'value' (a string), not 'values'")
        return (self.field, self.op, coerce_operand(self.field, self.value))


class AskConfig(dg.Config):
    query: str = Field(description=f"The question, in any language of the corpus, e.g. {EXAMPLE_QUERY!r} "
                       "or '为什么营收下滑'.")
    filters: list[FilterClause] = Field(
        default=[], description="Metadata conditions, all must hold, e.g. [{field: entity, value: ACME_CN}, "
        "{field: period, op: gte, value: '2023'}]. Empty: search everything. When valid filters leave "
        "nothing, the question is retried without them and every snippet says filters_relaxed.")
    top_k: int = Field(default=5, description="How many cited snippets to return (at least 1).")
    # Query layers for this run (empty: the RetrievalResource's setting / its RAGSPINE_* variable).
    transform: str = Field(default="", description="none, rag_fusion, hyde or step_back (RAGSPINE_QUERY_TRANSFORM).")
    decompose: str = Field(default="", description="none or llm[:N] (RAGSPINE_QUERY_DECOMPOSE).")
    adaptive: str = Field(default="", description="off, on or llm (RAGSPINE_ADAPTIVE).")
    corrective: str = Field(default="", description="off, on or llm: CRAG grade -> act loop (RAGSPINE_CORRECTIVE).")
    auto_filters: str = Field(default="", description="off, on or llm (RAGSPINE_AUTO_FILTERS).")
    postprocessor: str = Field(default="", description="Chain such as 'mmr,lost_in_middle' (RAGSPINE_POSTPROCESSOR).")


@dg.op(description="Retrieve cited snippets for a question from the published snapshots (read-only).")
def ask_question(context: dg.OpExecutionContext, config: AskConfig, retrieval: RetrievalResource):
    if config.top_k < 1:
        raise dg.Failure(f"top_k must be at least 1 (got {config.top_k})")
    triples = []
    for i, clause in enumerate(config.filters):
        try:
            triples.append(clause.as_triple())
            check_filter_values(retrieval.retriever(), [triples[-1]])
        except FilterError as exc:
            raise dg.Failure(f"filters[{i}] ({clause.field} {clause.op}): {exc}") from None
    layers = {f: getattr(config, f) for f in LAYER_FIELDS if getattr(config, f)}
    snippets = retrieval.ask(config.query, filters=triples or None, top_k=config.top_k, **layers)
    report = getattr(snippets, "report", None)  # refusals and routes of the query layers, when any ran
    lines = [f"**Q:** {config.query}", ""]
    lines += [snippet_markdown(s) for s in snippets]
    return dg.Output(
        snippets,
        metadata={"answer": dg.MetadataValue.md("\n".join(lines) if snippets else "no matching snippets"),
                  "snippets": dg.MetadataValue.json(json.loads(json.dumps(snippets, default=str))),
                  "count": len(snippets),
                  **({"layers_report": dg.MetadataValue.json(json.loads(json.dumps(report, default=str)))}
                     if report else {})},
    )


@dg.job(description="Ask a question (op config: query, filters as field/op/value clauses, top_k); "
        "the snippets are the run's output metadata.",
        config={"ops": {"ask_question": {"config": {"query": EXAMPLE_QUERY, "filters": [], "top_k": 5}}}})
def ask():
    ask_question()
