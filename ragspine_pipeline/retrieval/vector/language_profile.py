"""Which language group a chunk (and a library) belongs to, for ``auto``'s model choice.

The groups are the ones the evaluation table measures: ``en`` (English), ``latin`` (other
Latin-script languages; measured on German), ``cyrillic`` (Russian), ``arabic``, ``thai``,
``cjk`` (Chinese, Japanese, Korean; measured on Chinese) and ``other``. A chunk's declared
``language`` metadata wins; without one, the dominant script of its letters decides, and
Latin text counts as English when English function words make up a sizeable share of its
words, or, when they are fewer, as long as no other listed language's own function words
outnumber them and they are not all but absent (``lexical.analysis.stopwords.
latin_function_words``, the counts a query's language is told by too): German, French, ...
use other ones, and a dense English abstract of terms still holds some.

A library's *languages* are every group its documents are in (a document's declared
``language``, else the group of a sample of its text), plus every non-Latin script group
a single chunk is written in (a Japanese paragraph inside an English file): script is a
reliable signal on a chunk, the English stop-word share is not (a table or a list of
titles has none). ``auto`` never gives a library with a non-English language an
English-only model (``auto_policy.choose``).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..lexical.analysis.scripts import script_of
from ..lexical.analysis.stopwords import latin_function_words

GROUPS = ("en", "latin", "cyrillic", "arabic", "thai", "cjk", "other")

_DECLARED = {
    "en": "en", "english": "en", "eng": "en",
    "zh": "cjk", "chinese": "cjk", "ja": "cjk", "japanese": "cjk", "ko": "cjk", "korean": "cjk",
    "ru": "cyrillic", "russian": "cyrillic", "uk": "cyrillic", "bg": "cyrillic", "sr": "cyrillic",
    "ar": "arabic", "arabic": "arabic", "fa": "arabic", "ur": "arabic",
    "th": "thai", "thai": "thai",
}
_LATIN_CODES = {"de", "german", "fr", "french", "es", "spanish", "it", "italian", "pt", "portuguese",
                "nl", "dutch", "sv", "swedish", "da", "no", "fi", "pl", "cs", "ro", "hu", "tr", "id",
                "vi", "ca"}
_CJK_RANGES = ((0x3040, 0x30FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xAC00, 0xD7AF), (0xF900, 0xFAFF))
_WORD = re.compile(r"[^\W\d_]+")
SAMPLE_CHARS = 2000
ENGLISH_STOPWORD_SHARE = 0.2
UNLISTED_LATIN_SHARE = 0.05  # under this share of English function words, and no other list's: not English


def _is_cjk(ch: str) -> bool:
    cp = ord(ch)
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


def declared_group(language: str | None) -> str | None:
    """The group of a declared language code/name (``en``, ``zh-TW``, ``german``); None if unset."""
    if not language or not language.strip():
        return None
    code = language.strip().lower().replace("_", "-")
    base = code.split("-")[0]
    if code in _DECLARED:
        return _DECLARED[code]
    if base in _DECLARED:
        return _DECLARED[base]
    if base in _LATIN_CODES or code in _LATIN_CODES:
        return "latin"
    return "other"


def text_group(text: str) -> str:
    """The group of a text from its letters (first ``SAMPLE_CHARS`` characters)."""
    sample = text[:SAMPLE_CHARS]
    counts: Counter[str] = Counter()
    for ch in sample:
        if not ch.isalpha():
            continue
        counts["cjk" if _is_cjk(ch) else script_of(ch)] += 1
    if not counts:
        return "other"
    script, _ = counts.most_common(1)[0]
    if script == "latin":
        words = [w.casefold() for w in _WORD.findall(sample)]
        en_any, en_only, other_only = latin_function_words(words)
        share = en_any / max(len(words), 1)
        if share >= ENGLISH_STOPWORD_SHARE:
            return "en"
        # Few English function words: another language when its own function words
        # outnumber English's, or when English's are all but absent (a language without a
        # stop list); else English written densely (titles, abstracts of terms: SciFact and
        # Cranfield hold such documents, which gave an English library a multilingual model).
        return "latin" if other_only > en_only or share < UNLISTED_LATIN_SHARE else "en"
    return script if script in GROUPS else "other"


def chunk_group(text: str, language: str | None = None) -> str:
    return declared_group(language) or text_group(text)


@dataclass(frozen=True)
class LanguageProfile:
    """Share of a library's chunks per group; ``dominant`` is the largest one.
    ``documents``: documents per group; ``script_chunks``: chunks per non-Latin script
    group (see the module docstring)."""

    counts: dict[str, int]
    documents: dict[str, int] = field(default_factory=dict)
    script_chunks: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def dominant(self) -> str:
        if not self.counts:
            return "other"
        return min(self.counts, key=lambda g: (-self.counts[g], g))

    @property
    def dominant_share(self) -> float:
        return self.counts.get(self.dominant, 0) / self.total if self.total else 0.0

    @property
    def languages(self) -> list[str]:
        """Every group the library holds text in (documents and non-Latin chunks)."""
        return sorted(set(self.documents) | set(self.script_chunks))

    def non_english(self) -> list[str]:
        return [g for g in self.languages if g != "en"]

    def to_dict(self) -> dict[str, object]:
        return {"groups": dict(sorted(self.counts.items())), "dominant": self.dominant,
                "dominant_share": round(self.dominant_share, 4), "languages": self.languages,
                "documents": dict(sorted(self.documents.items())),
                "script_chunks": dict(sorted(self.script_chunks.items()))}


def _has_letters(text: str) -> bool:
    return any(ch.isalpha() for ch in text[:SAMPLE_CHARS])


def profile(items: Iterable[tuple[str, str | None] | tuple[str, str | None, str]]) -> LanguageProfile:
    """Profile of ``(text, declared language)`` or ``(text, declared language, doc_id)``
    items (one per chunk). Without doc ids only the chunks' scripts name languages."""
    counts: Counter[str] = Counter()
    scripts: Counter[str] = Counter()
    docs: dict[str, tuple[str | None, list[str], int]] = {}
    for item in items:
        text, lang = item[0], item[1]
        g = chunk_group(text, lang)
        counts[g] += 1
        if _has_letters(text):
            sg = text_group(text)  # the script the chunk is written in, whatever was declared
            if sg not in ("en", "latin"):
                scripts[sg] += 1
        if len(item) > 2:
            doc = str(item[2])  # type: ignore[misc]
            declared, sample, size = docs.setdefault(doc, (lang, [], 0))
            if size < SAMPLE_CHARS:
                sample.append(text)
                docs[doc] = (declared, sample, size + len(text))
    documents: Counter[str] = Counter()
    for declared, sample, _ in docs.values():
        joined = "\n".join(sample)
        if declared_group(declared) or _has_letters(joined):
            documents[declared_group(declared) or text_group(joined)] += 1
    return LanguageProfile(dict(counts), dict(documents), dict(scripts))
