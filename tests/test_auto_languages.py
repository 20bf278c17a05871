"""``auto`` sees every language of a library (issue 43, item 6): languages are detected per
document (and per chunk for non-Latin scripts), and a library holding any non-English text
never gets an English-only model; the choice and why are recorded in the embeddings
metadata."""

from __future__ import annotations

import shutil

from ragspine_pipeline.retrieval.vector.auto_policy import (
    AutoEmbeddingBackend,
    choose,
    english_only,
)
from ragspine_pipeline.retrieval.vector.embedding_backends import DeterministicHashBackend
from ragspine_pipeline.retrieval.vector.language_profile import profile

EN = ["The plant in Lyon was closed because the energy costs tripled and the building was old.",
      "Revenue fell in the second half of the year as the price war with the competitors went on.",
      "The board approved a new policy on travel expenses and on the use of company cars.",
      "Gross margin decreased because of higher input costs and of the weaker demand in Europe."]
JA = "このライブラリには日本語のメモが一つだけ含まれています。会議は来週の火曜日に延期されました。"
DE = "Der Vorstand hat die neue Richtlinie für Dienstreisen und Firmenwagen genehmigt, und die Kosten sind gestiegen."


def _policy():
    def c(m, meth, w):
        return {"model": m, "method": meth, "weight": w, "reason": "test"}
    return {"choices": {"en": c("minilm", "convex", 0.5), "cjk": c("e5", "convex", 0.5),
                        "latin": c("e5", "convex", 0.7), "other": c("e5", "rrf", 1.0),
                        "mixed": c("e5", "convex", 0.5)}}


def _english_library(n_docs: int = 30) -> list[tuple[str, str | None, str]]:
    return [(EN[i % len(EN)], None, f"lib/en{i:02d}") for i in range(n_docs)]


def test_one_japanese_note_in_an_english_library_rules_out_the_english_only_model():
    items = [*_english_library(), (JA, None, "lib/note_ja")]
    prof = profile(items)
    assert prof.dominant == "en" and prof.dominant_share > 0.95  # the old rule alone picked MiniLM
    assert prof.languages == ["cjk", "en"] and prof.documents == {"en": 30, "cjk": 1}
    choice = choose(prof, _policy())
    assert not english_only(choice.model) and choice.model == "e5" and choice.group == "mixed"
    assert "cjk" in choice.reason and "minilm is English-only" in choice.reason
    assert choice.evidence["profile"]["languages"] == ["cjk", "en"]


def test_without_doc_ids_a_japanese_chunk_still_counts():
    """The query-side caller (HybridRetriever) passes (text, language) pairs only."""
    choice = choose(profile([(t, None) for t, _, _ in _english_library()] + [(JA, None)]), _policy())
    assert choice.model == "e5"


def test_a_japanese_paragraph_inside_an_english_document_counts():
    items = [*_english_library(), (JA, None, "lib/en00")]  # same document as English chunks
    assert choose(profile(items), _policy()).model == "e5"


def test_a_german_document_is_detected_per_document():
    items = [*_english_library(), (DE, None, "lib/de"), (DE, None, "lib/de")]
    prof = profile(items)
    assert prof.documents.get("latin") == 1
    assert choose(prof, _policy()).model == "e5"


def test_an_english_library_keeps_its_english_model_even_with_titles_and_tables():
    items = [*_english_library(), ("Quarterly Revenue Table", None, "lib/en01"), ("2023 | 12.4 | 7.1", None, "lib/t")]
    choice = choose(profile(items), _policy())
    assert choice.model == "minilm" and choice.group == "en"


def test_declared_language_counts_per_document():
    items = [*_english_library(), ("Meeting notes moved to Tuesday.", "ja", "lib/declared")]
    assert "cjk" in profile(items).languages and choose(profile(items), _policy()).model == "e5"


def test_the_embeddings_step_records_the_choice_and_every_language(tmp_path):
    from ragspine_pipeline.paths import DEMO_ROOT
    from ragspine_pipeline.warehouse import pipeline as P
    from ragspine_pipeline.warehouse.versioned import VersionedTables

    lib = "acme_policies"  # English policies and Chinese ones
    shutil.copytree(DEMO_ROOT / lib, tmp_path / "corpus" / lib)
    wh = VersionedTables(tmp_path / "wh")
    P.build_raw_documents(wh, tmp_path / "corpus", lib)
    P.build_chunks(wh, lib)
    made: list[str] = []

    def factory(model: str):
        made.append(model)
        b = DeterministicHashBackend(dim=16)
        b.model_id = f"test-{model}"
        return b

    pol = _policy()
    pol["choices"]["en"]["weight"] = 0.5
    res = P.build_embeddings(wh, lib, AutoEmbeddingBackend(factory, pol), "auto")
    auto = res.metadata["auto"]
    assert "cjk" in auto["profile"]["languages"] and auto["profile"]["documents"]["cjk"] >= 1
    assert not english_only(auto["model"]) and auto["reason"]
    assert made == [auto["model"]]
