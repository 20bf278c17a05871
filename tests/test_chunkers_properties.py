"""Property tests of every chunker: each chunk is ``source[start:end]``, the windows and
parent locators index the same source, nothing of the text is lost, and the budgets hold
— for generated structured documents (zh / en headings, articles, questions, pages) and
for arbitrary text with arbitrary (even nonsensical) structure marks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragspine_pipeline.corpus import make_chunker
from ragspine_pipeline.ingest.documents import Document
from ragspine_pipeline.retrieval.chunking.sentences import SemanticChunker
from ragspine_pipeline.retrieval.vector.embedding_backends import DeterministicHashBackend
from ragspine_pipeline.text_structure import MARK_KINDS, StructureMark, text_structure

SPECS = ["paragraph:120:30", "layout:120:30", "laws:120:30", "qa:120:30", "book:120:30",
         "parent_child:300:90:20", "sentence_window:2:80"]
BUDGET = {"paragraph": 120, "layout": 120, "laws": 120, "qa": 120, "book": 120, "parent_child": 90,
          "sentence_window": 80, "semantic": 100}
CHUNKERS = {s: make_chunker(s) for s in SPECS}
CHUNKERS["semantic:60:100"] = SemanticChunker(DeterministicHashBackend(dim=16), 60, 100)

_words = st.sampled_from(["revenue", "policy", "营收", "合同", "员工", "data", "3.5%", "e.g.x", "Zürich", "第三方"])
_ends = st.sampled_from([".", "。", "!", "？", "?", "；", "", ". ", "。 "])
sentence = st.builds(lambda ws, e: " ".join(ws) + e, st.lists(_words, min_size=1, max_size=12), _ends)
paragraph = st.builds("".join, st.lists(sentence, min_size=1, max_size=6))
heading = st.one_of(
    st.builds(lambda n, t: "#" * n + " " + t, st.integers(1, 4), _words),
    st.builds(lambda n, t: f"第{n}章 {t}", st.sampled_from(["一", "二", "十二", "3"]), _words),
    st.builds(lambda n, p: f"第{n}条 {p}", st.sampled_from(["一", "五", "十二", "一百"]), paragraph),
    st.builds(lambda a, b, t: f"{a}.{b} {t}", st.integers(1, 9), st.integers(1, 9), _words),
    st.builds(lambda t: f"Article 7 {t}", _words),
    st.builds(lambda t: f"Q: {t}?", _words),
    st.builds(lambda t: f"问：{t}？", _words),
)
block = st.one_of(paragraph, heading)
sep = st.sampled_from(["\n\n", "\n", "\n \n", "\r\n\r\n", "  \n\n\t", "\n\n\n"])


@st.composite
def structured_text(draw) -> str:
    blocks = draw(st.lists(block, min_size=1, max_size=14))
    out = draw(st.sampled_from(["", "\n", "  "]))
    for b in blocks:
        out += b + draw(sep)
    return out


@st.composite
def arbitrary_marks(draw, text: str) -> tuple[StructureMark, ...]:
    n = len(text)
    marks = []
    for _ in range(draw(st.integers(0, 6))):
        s = draw(st.integers(0, n))
        e = draw(st.integers(s, n))
        marks.append(StructureMark(s, e, draw(st.integers(0, 9)), draw(st.sampled_from(MARK_KINDS))))
    return tuple(sorted(marks, key=lambda m: m.start))


def check_chunks(spec: str, text: str, chunks) -> None:
    name = spec.split(":")[0]
    assert [c.ordinal for c in chunks] == list(range(len(chunks)))
    assert len({c.chunk_id for c in chunks}) == len(chunks)
    covered = [False] * len(text)
    for c in chunks:
        assert c.chunk_id.startswith("lib/doc#") and c.doc_id == "lib/doc"
        assert 0 <= c.start < c.end <= len(text)
        assert text[c.start:c.end] == c.text, (spec, c)
        assert c.text.strip() == c.text and c.text
        assert len(c.text) <= BUDGET[name], (spec, len(c.text))
        loc = c.parent_locator
        if loc is not None:
            assert loc.doc_id == "lib/doc" and loc.start <= c.start and c.end <= loc.end <= len(text)
        if c.window_text:
            assert loc is not None and c.window_text == text[loc.start:loc.end]
        if c.parent_id:
            assert loc is not None
        for i in range(c.start, c.end):
            covered[i] = True
    lost = [ch for ch, cov in zip(text, covered, strict=True) if not cov and not ch.isspace()]
    assert not lost, (spec, "".join(lost)[:50])
    # Children of one parent share one parent locator.
    parents: dict[str, object] = {}
    for c in chunks:
        if c.parent_id:
            assert parents.setdefault(c.parent_id, c.parent_locator) == c.parent_locator


@pytest.mark.parametrize("spec", list(CHUNKERS))
@settings(max_examples=60, deadline=None)
@given(text=structured_text(), md=st.booleans())
def test_every_chunker_keeps_spans_on_structured_documents(spec, text, md):
    d = Document("lib/doc", "Doc", text, {}, structure=text_structure(text, markdown=md))
    check_chunks(spec, text, CHUNKERS[spec](d))


@pytest.mark.parametrize("spec", list(CHUNKERS))
@settings(max_examples=40, deadline=None)
@given(data=st.data(), text=st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=400))
def test_every_chunker_keeps_spans_on_arbitrary_text_and_marks(spec, data, text):
    marks = data.draw(arbitrary_marks(text))
    check_chunks(spec, text, CHUNKERS[spec](Document("lib/doc", "Doc", text, {}, structure=marks)))


@pytest.mark.parametrize("spec", list(CHUNKERS))
@settings(max_examples=25, deadline=None)
@given(text=structured_text())
def test_chunking_is_deterministic(spec, text):
    d = Document("lib/doc", "Doc", text, {}, structure=text_structure(text))
    assert CHUNKERS[spec](d) == CHUNKERS[spec](d)
