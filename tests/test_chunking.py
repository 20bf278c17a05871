import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragspine_pipeline.retrieval.chunking.chunking import (
    DEFAULT_CHUNK_CHARS,
    DEFAULT_OVERLAP_CHARS,
    chunk_document,
)

alphabet = st.sampled_from(list("abc xyz营收下滑。！？；.!?;，\n\n\t ＡＢ한カ") + ["\n\n", "\u3000", "é"])
texts = st.one_of(st.text(max_size=1500), st.lists(alphabet, max_size=1500).map("".join))


@given(texts, st.integers(1, 300), st.data())
def test_chunks_are_contiguous_bounded_and_cover_the_source(text, max_chars, data):
    overlap = data.draw(st.integers(0, max_chars - 1))
    chunks = chunk_document(text, doc_id="d", max_chars=max_chars, overlap_chars=overlap)
    covered = [False] * len(text)
    for c in chunks:
        assert text[c.start:c.end] == c.text
        assert 0 < len(c.text) <= max_chars
        assert c.text == c.text.strip()
        for i in range(c.start, c.end):
            covered[i] = True
    # No silent loss: every non-whitespace character lands in some chunk.
    assert all(covered[i] for i, ch in enumerate(text) if not ch.isspace())
    starts = [c.start for c in chunks]
    assert starts == sorted(starts)


@given(texts)
def test_chunk_ids_are_stable_and_unique(text):
    a = chunk_document(text, doc_id="doc", title="t")
    b = chunk_document(text, doc_id="doc", title="t")
    assert [c.chunk_id for c in a] == [c.chunk_id for c in b]
    assert len({c.chunk_id for c in a}) == len(a)


def test_defaults_and_metadata():
    assert (DEFAULT_CHUNK_CHARS, DEFAULT_OVERLAP_CHARS) == (480, 80)
    (c,) = chunk_document("一段。", doc_id="x", title="T",
                          metadata={"entity": "ACME_CN", "period": "2023", "sensitivity": "RESTRICTED"})
    assert (c.entity, c.period, c.sensitivity, c.title, c.doc_id) == ("ACME_CN", "2023", "RESTRICTED", "T", "x")


def test_paragraphs_pack_and_overlap_between_chunks():
    paras = [f"Paragraph {i} has some words in it. And another sentence." for i in range(8)]
    text = "\n\n".join(paras)
    chunks = chunk_document(text, max_chars=200, overlap_chars=50)
    assert len(chunks) > 1
    for a, b in zip(chunks, chunks[1:], strict=False):
        assert b.start < a.end  # the next chunk re-opens inside the previous one
        assert a.end - b.start <= 50


def test_oversize_paragraph_splits_at_sentences_without_overlap():
    s = "这是第一句话，内容比较长。" * 10 + "Second sentence here! Third one?"
    chunks = chunk_document(s, max_chars=60, overlap_chars=20)
    for a, b in zip(chunks, chunks[1:], strict=False):
        assert a.end <= b.start
    assert chunks[0].text.endswith("。")


def test_sentence_longer_than_max_is_hard_cut():
    chunks = chunk_document("x" * 250, max_chars=100, overlap_chars=10)
    assert [len(c.text) for c in chunks] == [100, 100, 50]


@pytest.mark.parametrize("max_chars,overlap", [(0, 0), (-1, 0), (10, -1), (10, 10), (10, 11)])
def test_invalid_parameters(max_chars, overlap):
    with pytest.raises(ValueError):
        chunk_document("text", max_chars=max_chars, overlap_chars=overlap)
