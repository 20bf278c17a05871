"""The MCP result budget (mcp_format.py) as a property: whatever the snippets and the budget,
a result never passes the budget, shows snippets in rank order from the first, cuts only
texts that do not fit (each cut marked), and says how many snippets it left out."""

from __future__ import annotations

import json
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from ragspine_pipeline.service.mcp_format import MIN_TEXT, render_lines, render_search

snippet_st = st.builds(
    lambda i, text, title: {"text": text, "title": title, "doc_id": f"lib/doc{i}", "chunk_id": f"lib/doc{i}#{i}",
                            "source_locator": {"start": i, "end": i + len(text), "source_path": f"doc{i}.md"},
                            "scores": {"fused": 0.5, "bm25": 1.25, "vector": None}, "library_id": "lib"},
    st.integers(0, 10_000), st.text(min_size=1, max_size=3000), st.text(max_size=80))


@settings(max_examples=300, deadline=None)
@given(st.lists(snippet_st, max_size=12), st.integers(300, 12_000), st.booleans())
def test_a_result_never_passes_its_budget(snippets, budget, detail):
    out = {"snippets": snippets, "versions": {"lib": "v000003"}, "mode": "bm25"}
    text = render_search(out, detail=detail, budget=budget)
    assert len(text) <= budget
    heads = re.findall(r"^\[(\d+)\] .*\| lib/doc\d+ chars \d+-\d+ \| chunk lib/doc\d+#\d+$", text, flags=re.M)
    shown = [int(h) for h in heads]
    assert shown == list(range(1, len(shown) + 1))  # from the first, in rank order
    assert bool(shown) == bool(snippets) or budget < 1000
    if snippets and len(shown) < len(snippets) and text.endswith("top_k)"):
        assert f"{len(snippets) - len(shown)} more snippet(s) left out" in text
    flat = [" ".join(s["text"].split()) for s in snippets]
    if sum(map(len, flat)) + 300 * len(snippets) + 100 <= budget and not detail:
        assert all(f in text for f in flat) and "…[+" not in text  # everything fits: nothing cut


def test_cuts_are_even_and_marked():
    long, short = "a" * 5000, "short text"
    out = {"snippets": [{"text": long, "title": "L", "doc_id": "l/1", "chunk_id": "c1",
                         "source_locator": {"start": 0, "end": 5000}},
                        {"text": short, "title": "S", "doc_id": "l/2", "chunk_id": "c2",
                         "source_locator": {"start": 0, "end": 10}}], "versions": {"l": "v1"}, "mode": "bm25"}
    text = render_search(out, detail=False, budget=1200)
    assert len(text) <= 1200 and short in text and re.search(r"…\[\+\d+ chars\]", text)
    assert text.count("a") > MIN_TEXT


def test_rows_past_the_budget_are_left_out_and_counted():
    rows = [{"kind": "fact", "value": i, "citations": [{"doc_id": "d", "chunk_id": f"c{i}"}]} for i in range(200)]
    text = render_lines(rows, "versions: lib=v1 | 200 rows", budget=2000, what="rows")
    assert len(text) <= 2000
    shown = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    assert shown == rows[:len(shown)] and f"({200 - len(shown)} more rows left out" in text
