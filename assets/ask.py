"""The ``ask`` job: a question from the UI's launchpad, answered with cited snippets."""

import json

import dagster as dg

from resources import RetrievalResource


class AskConfig(dg.Config):
    query: str
    filters: str = ""  # JSON, e.g. {"entity": "ACME_CN"} or {"period": {"gte": "2023"}}
    top_k: int = 5


@dg.op(description="Retrieve cited snippets for a question from the published snapshots (read-only).")
def ask_question(context: dg.OpExecutionContext, config: AskConfig, retrieval: RetrievalResource):
    try:
        filters = json.loads(config.filters) if config.filters.strip() else None
    except json.JSONDecodeError as exc:
        raise dg.Failure(f"filters is not valid JSON: {exc}") from None
    snippets = retrieval.ask(config.query, filters=filters, top_k=config.top_k)
    lines = [f"**Q:** {config.query}", ""]
    for s in snippets:
        loc = s["source_locator"]
        text = " ".join(s["text"].split())[:300]
        lines.append(f"{s['rank']}. **{s['title']}** — `{s['doc_id']}` chars {loc['start']}–{loc['end']} "
                     f"(v{s['version']}, {s['sensitivity']}, fused {s['scores']['fused']:.4f})  \n   {text}")
    return dg.Output(
        snippets,
        metadata={"answer": dg.MetadataValue.md("\n".join(lines) if snippets else "no matching snippets"),
                  "snippets": dg.MetadataValue.json(json.loads(json.dumps(snippets, default=str))),
                  "count": len(snippets)},
    )


@dg.job(description="Ask a question (op config: query, filters as JSON, top_k); snippets are the run's output metadata.")
def ask():
    ask_question()
