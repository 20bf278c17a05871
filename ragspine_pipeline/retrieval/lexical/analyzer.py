"""Tokenization and the pluggable index analyzer.

``tokenize`` is the spec's tokenizer, kept exact so that every layer (index, reference
scorer, peers in the benchmark) can be fed the same tokens:

* NFKC first (full-width ＡＢＣ１２３ becomes abc123), then lowercase;
* ASCII alphanumeric runs are words;
* CJK runs (Han, Hiragana, Katakana, Hangul) give every unigram, then every adjacent
  bigram of the run.

Anything else (punctuation, other scripts) separates tokens. ``Analyzer`` sits on top and
optionally removes English stop words and applies the Snowball English stemmer to the
ASCII words only; CJK tokens pass through untouched.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

_CJK_CLASS = (
    "\u1100-\u11ff"  # Hangul Jamo
    "\u2e80-\u2fdf"  # CJK radicals, Kangxi radicals
    "\u3005-\u3007"  # 々 〆 〇
    "\u3040-\u309f"  # Hiragana
    "\u30a0-\u30ff"  # Katakana
    "\u3130-\u318f"  # Hangul compatibility Jamo
    "\u31f0-\u31ff"  # Katakana phonetic extensions
    "\u3400-\u4dbf"  # CJK extension A
    "\u4e00-\u9fff"  # CJK unified ideographs
    "\ua960-\ua97f"  # Hangul Jamo extended A
    "\uac00-\ud7af"  # Hangul syllables
    "\ud7b0-\ud7ff"  # Hangul Jamo extended B
    "\uf900-\ufaff"  # CJK compatibility ideographs
    "\U00020000-\U0003134f"  # CJK extensions B..G
)
_TOKEN_RE = re.compile(f"[a-z0-9]+|[{_CJK_CLASS}]+")
_CJK_RUN_RE = re.compile(f"[{_CJK_CLASS}]")


def normalize(text: str) -> str:
    """NFKC + lowercase: the normal form every token is taken from."""
    return unicodedata.normalize("NFKC", text).lower()


def tokenize(text: str) -> list[str]:
    """Spec tokenizer: lowercase ASCII words; CJK unigrams followed by adjacent bigrams."""
    out: list[str] = []
    append = out.append
    for run in _TOKEN_RE.findall(normalize(text)):
        if run[0] < "\x80":
            append(run)
            continue
        out.extend(run)
        for i in range(len(run) - 1):
            append(run[i : i + 2])
    return out


def is_cjk_token(token: str) -> bool:
    return bool(token) and _CJK_RUN_RE.match(token) is not None


# A conventional English stop list (articles, pronouns, auxiliaries, prepositions,
# conjunctions). Negations such as "not"/"no" are kept: they matter for "why" questions.
ENGLISH_STOP_WORDS: frozenset[str] = frozenset(
    ["a", "about", "above", "after", "again", "against", "all", "am", "an", "and", "any", "are", "as", "at", "be", "because", "been", "before", "being", "below", "between", "both", "but", "by", "can", "could", "did", "do", "does", "doing", "down", "during", "each", "few", "for", "from", "further", "had", "has", "have", "having", "he", "her", "here", "hers", "herself", "him", "himself", "his", "how", "i", "if", "in", "into", "is", "it", "its", "itself", "just", "me", "more", "most", "my", "myself", "of", "off", "on", "once", "only", "or", "other", "our", "ours", "ourselves", "out", "over", "own", "same", "she", "should", "so", "some", "such", "than", "that", "the", "their", "theirs", "them", "themselves", "then", "there", "these", "they", "this", "those", "through", "to", "too", "under", "until", "up", "very", "was", "we", "were", "what", "when", "where", "which", "while", "who", "whom", "why", "will", "with", "would", "you", "your", "yours", "yourself", "yourselves", "s", "t", "d", "ll", "m", "o", "re", "ve", "y"]
)


@dataclass(frozen=True)
class Analyzer:
    """Index/query analyzer: spec tokens, optionally stop-filtered and stemmed.

    ``name`` identifies the configuration in metadata and benchmark reports. The same
    analyzer must be applied to documents and queries; indexes record it.
    """

    stem: bool = False
    stop_words: frozenset[str] = field(default_factory=frozenset)
    name: str = "spec"

    @cached_property
    def _stemmer(self):  # type: ignore[no-untyped-def]
        import Stemmer  # PyStemmer: maintained C Snowball stemmers

        return Stemmer.Stemmer("english")

    def __call__(self, text: str) -> list[str]:
        return self.analyze_tokens(tokenize(text))

    def analyze_tokens(self, tokens: Sequence[str]) -> list[str]:
        if not self.stem and not self.stop_words:
            return list(tokens)
        stop = self.stop_words
        kept = [t for t in tokens if t not in stop] if stop else list(tokens)
        if not self.stem:
            return kept
        # Stem ASCII words only; CJK tokens are returned as they are.
        ascii_idx = [i for i, t in enumerate(kept) if t[0] < "\x80"]
        if ascii_idx:
            stemmed = self._stemmer.stemWords([kept[i] for i in ascii_idx])
            for i, s in zip(ascii_idx, stemmed, strict=True):
                kept[i] = s
        return kept

    def analyze_many(self, texts: Iterable[str]) -> list[list[str]]:
        return [self(t) for t in texts]


ANALYZERS: dict[str, Analyzer] = {
    "spec": Analyzer(name="spec"),
    "stop": Analyzer(stop_words=ENGLISH_STOP_WORDS, name="stop"),
    "stem": Analyzer(stem=True, name="stem"),
    "english": Analyzer(stem=True, stop_words=ENGLISH_STOP_WORDS, name="english"),
}

# Chosen by measured nDCG@10 on ../shared/eval (see README "Analyzer choice").
DEFAULT_ANALYZER_NAME = "english"


def make_analyzer(spec: str | Analyzer | None = None) -> Analyzer:
    """Factory: ``spec`` (plain tokens), ``stop``, ``stem``, ``english`` (stem + stop)."""
    if isinstance(spec, Analyzer):
        return spec
    name = (spec or DEFAULT_ANALYZER_NAME).strip().lower()
    try:
        return ANALYZERS[name]
    except KeyError:
        raise ValueError(
            f"unknown analyzer {spec!r}; choose one of {sorted(ANALYZERS)}"
        ) from None
