"""No bare headings (issue 43, item 4): a chunk that is only a heading, or holds fewer than
``MIN_CONTENT_CHARS`` letters and digits, is merged with the text it heads at chunking
time, in every chunker, and the span stays exact (``source[start:end] == text``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ragspine_pipeline.corpus import make_chunker
from ragspine_pipeline.ingest.documents import Document
from ragspine_pipeline.retrieval.chunking.chunking import chunk_document
from ragspine_pipeline.retrieval.chunking.headings import (
    MIN_CONTENT_CHARS,
    MIN_SENTENCE_CONTENT_CHARS,
    absorb_bare,
    bare_span,
    content_chars,
    is_bare,
    is_heading_line,
)
from ragspine_pipeline.retrieval.chunking.sentences import SemanticChunker
from ragspine_pipeline.retrieval.vector.embedding_backends import DeterministicHashBackend
from ragspine_pipeline.text_structure import text_structure

# The Apache License 2.0 as its .txt ships it (sections 2 and 3): section 3's first sentence
# is longer than the default budget, so its title used to close a chunk of its own.
APACHE = """   2. Grant of Copyright License. Subject to the terms and conditions of
      this License, each Contributor hereby grants to You a perpetual,
      worldwide, non-exclusive, no-charge, royalty-free, irrevocable
      copyright license to reproduce, prepare Derivative Works of,
      publicly display, publicly perform, sublicense, and distribute the
      Work and such Derivative Works in Source or Object form.

   3. Grant of Patent License. Subject to the terms and conditions of
      this License, each Contributor hereby grants to You a perpetual,
      worldwide, non-exclusive, no-charge, royalty-free, irrevocable
      (except as stated in this section) patent license to make, have made,
      use, offer to sell, sell, import, and otherwise transfer the Work,
      where such license applies only to those patent claims licensable
      by such Contributor that are necessarily infringed by their
      Contribution(s) alone or by combination of their Contribution(s)
      with the Work to which such Contribution(s) was submitted. If You
      institute patent litigation against any entity (including a
      cross-claim or counterclaim in a lawsuit) alleging that the Work
      or a Contribution incorporated within the Work constitutes direct
      or contributory patent infringement, then any patent licenses
      granted to You under this License for that Work shall terminate
      as of the date such litigation is filed.
"""
# The same section as a markdown heading over its paragraph.
APACHE_MD = "## 3. Grant of Patent License.\n\n" + APACHE.split("3. Grant of Patent License. ", 1)[1]

SPECS = ["paragraph", "layout", "laws", "qa", "book", "parent_child", "sentence_window", "paragraph:200:40",
         "layout:200:40", "parent_child:600:200:40", "sentence_window:2:200"]
CHUNKERS = {s: make_chunker(s) for s in SPECS}
CHUNKERS["semantic:60:300"] = SemanticChunker(DeterministicHashBackend(dim=16), 60, 300)


def _least(spec: str) -> int:
    """The content minimum a chunker keeps (one sentence is sentence_window's unit)."""
    return MIN_SENTENCE_CONTENT_CHARS if spec.startswith("sentence_window") else MIN_CONTENT_CHARS


def _doc(text: str, path: str = "lib/doc.txt") -> Document:
    return Document("lib/doc", "Doc", text, {}, source_path=path,
                    structure=text_structure(text, markdown=path.endswith(".md")))


def test_the_heading_rule():
    assert is_heading_line("3. Grant of Patent License.") and is_heading_line("## Scope")
    assert is_heading_line("第三章 总则") and is_heading_line("Article 7 Termination")
    assert not is_heading_line("3. Grant of Patent License. Subject to the terms and conditions of")
    assert not is_heading_line("Revenue fell in 2023.")
    assert is_bare("3.") and is_bare("## 1.2 Scope\n\n1.2.1 Purpose")
    assert not is_bare("Revenue fell in 2023 because the price war went on.")
    assert MIN_CONTENT_CHARS == 20
    assert is_heading_line("Preamble") and is_heading_line("TERMS AND CONDITIONS")
    assert not is_heading_line("Section 6 states terms for distribution of such executables.")
    assert not is_heading_line("Yes, it is.") and not is_heading_line("the plant was closed")
    assert is_bare("1. Definitions\n--------------")  # a setext underline says nothing
    assert content_chars("第二句。") == 9 and content_chars("and") == 3
    assert is_bare("and", MIN_SENTENCE_CONTENT_CHARS) and not is_bare("第二句。", MIN_SENTENCE_CONTENT_CHARS)


@pytest.mark.parametrize("spec", list(CHUNKERS))
@pytest.mark.parametrize("text,path", [(APACHE, "lib/LICENSE.txt"), (APACHE_MD, "lib/LICENSE.md")])
def test_grant_of_patent_license_opens_its_paragraph_in_every_chunker(spec, text, path):
    chunks = CHUNKERS[spec](_doc(text, path))
    for c in chunks:
        assert text[c.start:c.end] == c.text
        assert not bare_span(text, c.start, c.end, _least(spec)) or len(chunks) == 1, (spec, c.text)
    title = next(c for c in chunks if "Grant of Patent License." in c.text)
    assert "Subject to the terms" in title.text, (spec, title.text)  # the heading kept its body
    assert title.text.strip() not in ("3. Grant of Patent License.", "## 3. Grant of Patent License.")


def test_paragraph_chunker_at_the_default_budget_keeps_the_title_with_its_sentence():
    chunks = chunk_document(APACHE, doc_id="lib/LICENSE")
    lengths = [len(c.text) for c in chunks]
    assert all(n <= 480 for n in lengths)
    assert chunks[1].text.startswith("3. Grant of Patent License. Subject to the terms")


def test_a_trailing_heading_joins_the_chunk_before_and_a_lone_heading_stays():
    text = "The plant in Lyon was closed because the energy costs tripled.\n\n## Appendix"
    (c,) = chunk_document(text, doc_id="d")
    assert c.text == text
    (only,) = chunk_document("## Appendix", doc_id="d")  # nothing to merge with: kept, not lost
    assert only.text == "## Appendix"


def test_absorb_bare_respects_the_budget():
    text = "## Title\n\n" + "word " * 11
    spans = [(0, 8), (10, len(text) - 1)]
    assert absorb_bare(text, spans, 100) == [(0, len(text) - 1)]  # fits: one chunk
    out = absorb_bare(text, spans, 60)  # does not fit: the heading opens a chunk with what does
    assert all(e - s <= 60 for s, e in out) and out[0][0] == 0 and out[0][1] > 8 and len(out) == 2
    assert not is_bare(text[out[0][0]:out[0][1]]) and out[1][1] == len(text) - 1


_words = st.sampled_from(["revenue", "policy", "营收", "合同", "licence", "data", "patent", "Zürich", "第三方",
                          "grant", "contributor", "warranty"])
_sentence = st.builds(lambda ws, e: " ".join(ws) + e, st.lists(_words, min_size=3, max_size=14),
                      st.sampled_from([".", "。", "!", "？", ";"]))
_body = st.builds(" ".join, st.lists(_sentence, min_size=1, max_size=8))
_heading = st.one_of(
    st.builds(lambda n, t: f"{n}. {t.title()} License.", st.integers(1, 20), _words),
    st.builds(lambda n, t: "#" * n + " " + t, st.integers(1, 3), _words),
    st.builds(lambda n, t: f"第{n}章 {t}", st.sampled_from(["一", "二", "十二"]), _words),
    st.builds(lambda a, b, t: f"{a}.{b} {t}", st.integers(1, 9), st.integers(1, 9), _words),
    st.builds(lambda t: f"Article 7 {t}", _words),
)


@st.composite
def headed_text(draw) -> str:
    """Sections, each a heading over the text it heads (so every heading has a body)."""
    out = ""
    for _ in range(draw(st.integers(1, 6))):
        sep = draw(st.sampled_from(["\n\n", "\n", "\n\n\n"]))
        out += draw(_heading) + sep + draw(_body) + "\n\n"
    return out


@pytest.mark.parametrize("spec", list(CHUNKERS))
@settings(max_examples=40, deadline=None)
@given(text=headed_text(), md=st.booleans())
# A heading whose short paragraph is a scrap too, before a section over budget: the paragraph
# chunker closed on the heading alone (layout:200:40 emitted '1. Revenue License.').
@example(text="1. Revenue License.\n\nrevenue revenue grant.\n\n1. Revenue License.\nrevenue revenue revenue. "
              + "revenue " * 13 + "revenue.\n\n", md=False)
def test_no_chunk_is_a_bare_heading_and_spans_stay_exact(spec, text, md):
    chunks = CHUNKERS[spec](_doc(text, "lib/doc.md" if md else "lib/doc.txt"))
    covered = [False] * len(text)
    for c in chunks:
        assert text[c.start:c.end] == c.text
        lines = [ln.strip() for ln in c.text.splitlines() if ln.strip()]
        assert not all(is_heading_line(ln) for ln in lines), (spec, c.text)
        for i in range(c.start, c.end):
            covered[i] = True
    assert all(covered[i] for i, ch in enumerate(text) if not ch.isspace())


LICENSES = Path("/usr/share/common-licenses")


@pytest.mark.parametrize("name", ["Apache-2.0", "GPL-3", "MPL-2.0", "LGPL-2.1"])
def test_licenses_debian_ships_have_no_bare_heading_in_any_chunker(name):
    """The issue's corpus: licence texts as Debian ships them (skipped where absent)."""
    path = LICENSES / name
    if not path.is_file():
        pytest.skip(f"{path} not on this system")
    text = path.read_text(encoding="utf-8", errors="replace")
    for spec, chunker in CHUNKERS.items():
        if ":" in spec:
            continue  # the shipped defaults (a 200-character budget cannot lift a heading out of an ASCII box)
        chunks = chunker(_doc(text, f"lib/{name}.txt"))
        for c in chunks:
            assert text[c.start:c.end] == c.text
            assert not bare_span(text, c.start, c.end, _least(spec)), (spec, c.text)
        if name == "Apache-2.0":
            title = next(c for c in chunks if "3. Grant of Patent License." in c.text)
            assert "Subject to the terms" in title.text, (spec, title.text)
