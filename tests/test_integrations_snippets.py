"""The adapters' last RESTRICTED guard and flat metadata, without any framework: a snippet
whose label is restricted, odd or missing never leaves a source (whatever a service sends),
and the metadata every framework object gets is flat and carries the citation.
"""

from __future__ import annotations

import pytest

from ragspine_pipeline.integrations.client import SearchResult
from ragspine_pipeline.integrations.snippets import citation, open_snippets, snippet_metadata
from ragspine_pipeline.integrations.source import HttpSource, make_source


def _snippet(doc: str, label: object) -> dict:
    return {"text": f"text of {doc}", "doc_id": doc, "chunk_id": f"{doc}#0", "title": doc, "sensitivity": label,
            "source_locator": {"doc_id": doc, "start": 3, "end": 17, "source_path": f"/c/{doc}.md"},
            "scores": {"bm25": 1.5, "vector": None, "fused": 0.03}, "entity": "E", "rank": 1}


class _LeakyClient:
    """A service that (wrongly) sends restricted and oddly labelled snippets."""

    def search(self, query, **_):
        labels = ["PUBLIC", "RESTRICTED", "restricted ", "PUBLIC\u200b", None, ["PUBLIC"], " internal "]
        snippets = [_snippet(f"lib/d{i}", label) for i, label in enumerate(labels)]
        snippets.append({k: v for k, v in _snippet("lib/nolabel", "PUBLIC").items() if k != "sensitivity"})
        return SearchResult(snippets=snippets, versions={"lib": "3"})


def test_restricted_odd_or_missing_labels_never_leave_a_source():
    got = HttpSource(_LeakyClient()).search("q", top_k=10)
    assert [s["doc_id"] for s in got] == ["lib/d0", "lib/d6"]  # PUBLIC and the canonical " internal "
    assert all(s["library_id"] == "lib" for s in got)  # one library read: named on each snippet
    assert open_snippets([{"text": "x"}, "not a dict"]) == []


def test_flat_metadata_with_the_citation():
    meta = snippet_metadata(_snippet("lib/a", "PUBLIC"))
    assert meta["citation"] == citation(_snippet("lib/a", "PUBLIC")) == "lib/a chars 3-17"
    assert (meta["start_char"], meta["end_char"], meta["source_path"]) == (3, 17, "/c/lib/a.md")
    assert (meta["score_fused"], meta["score_bm25"], meta["score_vector"]) == (0.03, 1.5, None)
    assert all(not isinstance(v, (dict, list)) for v in meta.values())
    assert "text" not in meta


def test_exactly_one_door():
    for kwargs in ({}, {"warehouse": "w", "base_url": "http://127.0.0.1:1"}, {"warehouse": "w", "api_key": "k"}):
        with pytest.raises(ValueError, match="warehouse=|api_key="):
            make_source(**kwargs)
