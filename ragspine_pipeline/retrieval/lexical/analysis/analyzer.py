"""Tokenization and the pluggable index analyzer.

``tokenize`` is the spec's tokenizer (public API, pinned by the conformance tests):

* NFKC first (full-width ＡＢＣ１２３ becomes abc123), then lowercase;
* ASCII alphanumeric runs are words;
* CJK runs (Han, Hiragana, Katakana, Hangul) give every unigram, then every adjacent
  bigram of the run.

Anything else (punctuation, other scripts) separates tokens, so it cannot index Russian,
Arabic, Thai or an accented Latin word. The index analyzer (what the BM25 index, the
pipeline and the CLI use) is therefore ``UnicodeAnalyzer`` (``unicode``, the default):
words of every script, CJK exactly as ``tokenize``, Thai/Lao/Khmer/Myanmar as character
bigrams, and a Snowball stem + stop rule per script, recorded in its name. ``Analyzer``
is the earlier family on spec tokens (``spec``, ``stop``, ``stem``, ``english``), still
built by name so that lexical indexes recorded with one of them keep loading.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import Stemmer  # PyStemmer: maintained C Snowball stemmers

from .... import settings
from .scripts import KIND_CACHE as _KIND_CACHE
from .scripts import kind_of, token_patterns
from .stopwords import stop_words_for

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

    def analyze(self, text: str, language: str | None = None) -> list[str]:
        """Same seam as ``UnicodeAnalyzer.analyze``; spec tokens have no language rule."""
        del language
        return self(text)

    def analyze_query(self, text: str, languages: Iterable[str | None] = ()) -> list[str]:
        del languages
        return self(text)



# --------------------------------------------------------------------------- Unicode analyzer

# Snowball languages (PyStemmer names) and the scripts their words are written in. A
# language not listed here is written in Latin letters.
LANGUAGE_SCRIPTS: dict[str, tuple[str, ...]] = {
    "russian": ("cyrillic",), "serbian": ("cyrillic", "latin"), "greek": ("greek",),
    "arabic": ("arabic",), "persian": ("arabic",), "hindi": ("devanagari",), "nepali": ("devanagari",),
    "armenian": ("armenian",), "tamil": ("tamil",), "yiddish": ("hebrew",),
}
SNOWBALL_LANGUAGES: tuple[str, ...] = (
    "arabic", "armenian", "basque", "catalan", "czech", "danish", "dutch", "english", "esperanto",
    "estonian", "finnish", "french", "german", "greek", "hindi", "hungarian", "indonesian", "irish",
    "italian", "lithuanian", "nepali", "norwegian", "persian", "polish", "portuguese", "romanian",
    "russian", "serbian", "sesotho", "spanish", "swedish", "tamil", "turkish", "yiddish",
)
# ISO 639-1 codes (what a document's ``language`` metadata usually holds) -> Snowball name.
ISO_LANGUAGES: dict[str, str] = {
    "ar": "arabic", "hy": "armenian", "eu": "basque", "ca": "catalan", "cs": "czech", "da": "danish",
    "nl": "dutch", "en": "english", "eo": "esperanto", "et": "estonian", "fi": "finnish", "fr": "french",
    "de": "german", "el": "greek", "hi": "hindi", "hu": "hungarian", "id": "indonesian", "ga": "irish",
    "it": "italian", "lt": "lithuanian", "ne": "nepali", "no": "norwegian", "nb": "norwegian",
    "nn": "norwegian", "fa": "persian", "pl": "polish", "pt": "portuguese", "ro": "romanian",
    "ru": "russian", "sr": "serbian", "st": "sesotho", "es": "spanish", "sv": "swedish", "ta": "tamil",
    "tr": "turkish", "yi": "yiddish",
}
# Languages with no Snowball stemmer that the analyzer still knows, with the scripts whose
# words such a document keeps unstemmed and unfiltered (a Vietnamese "to" or "do" is not
# the English stop word). CJK and the no-space scripts have no stemmer anyway, so Chinese
# or Thai metadata leaves the rule for the document's Latin words in place (the demo's
# Chinese reports quote English names).
UNSTEMMED_LANGUAGES: dict[str, tuple[str, ...]] = {
    "zh": (), "ja": (), "ko": (), "th": (), "lo": (), "km": (), "my": (), "ka": (), "bn": (),
    "chinese": (), "japanese": (), "korean": (), "thai": (), "lao": (), "khmer": (), "burmese": (),
    "georgian": (), "bengali": (), "none": (),
    "vi": ("latin",), "vietnamese": ("latin",), "uk": ("cyrillic",), "ukrainian": ("cyrillic",),
    "bg": ("cyrillic",), "bulgarian": ("cyrillic",), "he": ("hebrew",), "iw": ("hebrew",), "hebrew": ("hebrew",),
}
# The default rule: one Snowball language per script. Latin words default to English
# (the project's measured default); a library pins another with ``unicode:<language>``.
DEFAULT_SCRIPT_RULE: dict[str, str] = {
    "latin": "english", "cyrillic": "russian", "greek": "greek", "arabic": "arabic",
    "devanagari": "hindi", "armenian": "armenian", "tamil": "tamil",
}


class LanguageError(ValueError):
    """An analyzer name or document language that names no known language."""


def _language_key(language: str) -> tuple[str, str]:
    key = language.strip().lower().replace("_", "-")
    return key, key.split("-", 1)[0]


def resolve_language(language: str | None) -> str | None:
    """Snowball name for ``language`` ("de", "de-AT", "German", "german"), else None.

    None means "no stemmer for this language" (empty metadata, Chinese, Thai,
    Vietnamese, ...). A string that names no language at all raises ``LanguageError``:
    a typo in metadata must not silently index a library with the wrong rule.
    """
    if language is None:
        return None
    key, primary = _language_key(language)
    if not key:
        return None
    if key in SNOWBALL_LANGUAGES:
        return key
    if primary in ISO_LANGUAGES:
        return ISO_LANGUAGES[primary]
    if key in UNSTEMMED_LANGUAGES or primary in UNSTEMMED_LANGUAGES:
        return None
    raise LanguageError(f"unknown language {language!r}; use an ISO 639-1 code or one of {list(SNOWBALL_LANGUAGES)}")


def language_overrides(language: str | None) -> dict[str, str]:
    """Script -> Snowball language ("" = words kept as they are) that ``language`` sets."""
    lang = resolve_language(language)
    if lang is not None:
        return {script: lang for script in LANGUAGE_SCRIPTS.get(lang, ("latin",))}
    if not language:
        return {}
    key, primary = _language_key(language)
    return {script: "" for script in UNSTEMMED_LANGUAGES.get(key, UNSTEMMED_LANGUAGES.get(primary, ()))}


_UNI_BMP_RE, _UNI_FULL_RE = token_patterns()
_ASCII_WORD_RE = re.compile("[a-z0-9]+")
_ASTRAL_RE = re.compile("[\U00010000-\U0010ffff]")
_LATIN_FOLD = str.maketrans({"ø": "o", "đ": "d", "ł": "l", "æ": "ae", "œ": "oe", "ð": "d", "þ": "th", "ı": "i",
                             "ħ": "h", "ŧ": "t", "ŋ": "n"})


def fold_latin(token: str) -> str:
    """ASCII-fold a Latin word (as Lucene's ASCIIFoldingFilter): é → e, ø → o, æ → ae."""
    if token.isascii():
        return token
    base = "".join(c for c in unicodedata.normalize("NFD", token) if not unicodedata.combining(c))
    return unicodedata.normalize("NFC", base.translate(_LATIN_FOLD))


def normalize_unicode(text: str) -> str:
    """NFKC + casefold (ß → ss, final ς → σ): the form the Unicode analyzer reads."""
    return text.lower() if text.isascii() else unicodedata.normalize("NFKC", text).casefold()


def unicode_runs(text: str) -> list[tuple[str, str]]:
    """(run, kind) pairs of ``text`` after NFKC + casefold.

    ``kind`` is ``cjk``, ``nospace`` (Thai, Lao, Khmer, Myanmar) or the script of a word
    (``latin``, ``cyrillic``, ...; ``other`` for scripts without a rule).
    """
    if text.isascii():
        return [(w, "latin") for w in _ASCII_WORD_RE.findall(text.lower())]
    norm = normalize_unicode(text)
    pattern = _UNI_FULL_RE if _ASTRAL_RE.search(norm) else _UNI_BMP_RE
    kinds = _KIND_CACHE
    return [(run, kinds.get(run[0]) or kind_of(run[0])) for run in pattern.findall(norm)]


def _bigrams(run: str) -> list[str]:
    return [run] if len(run) < 2 else [run[i : i + 2] for i in range(len(run) - 1)]


@dataclass(frozen=True)
class UnicodeAnalyzer:
    """The index analyzer for every script.

    Tokens: NFKC + casefold; words are runs of letters, digits and combining marks of any
    script; CJK runs give unigrams then adjacent bigrams (as ``tokenize``); Thai, Lao,
    Khmer and Myanmar runs, written without spaces, give character bigrams.

    Language rule: every word is stemmed (Snowball, PyStemmer) and stop-filtered in the
    language its script maps to in ``rule`` — by default Latin → English, Cyrillic →
    Russian, Greek → Greek, Arabic → Arabic, Devanagari → Hindi, Armenian, Tamil. The rule
    is part of ``name`` (``unicode`` or ``unicode:<language>`` for a pinned Latin-script
    or other language), so the lexical index records which one it was built with.

    ``analyze(text, language=...)`` applies a document's ``language`` metadata instead of
    the rule for the scripts of that language; ``analyze_query(text, languages=...)``
    stems each query word in the rule's language and in every document language of its
    script, so that documents routed by metadata still match.
    """

    rule: tuple[tuple[str, str], ...] = tuple(DEFAULT_SCRIPT_RULE.items())
    stem: bool = True
    stop: bool = True
    fold_accents: bool = False
    name: str = "unicode"

    @cached_property
    def _rule(self) -> dict[str, str]:
        return dict(self.rule)

    @cached_property
    def _stemmers(self) -> dict[str, object]:
        return {}

    @cached_property
    def _memo(self) -> dict[str, dict[str, str]]:
        return {}

    def _stemmer(self, language: str):  # type: ignore[no-untyped-def]
        st = self._stemmers.get(language)
        if st is None:
            # PyStemmer's own cache costs more than it saves here; _stem_words memoizes.
            st = self._stemmers[language] = Stemmer.Stemmer(language, 0)
        return st

    def _stem_words(self, language: str, words: list[str]) -> list[str]:
        """Snowball stems of ``words``, memoized per language (Zipf: most words repeat)."""
        memo = self._memo.get(language)
        if memo is None:
            memo = self._memo[language] = {}
        got = [memo.get(w) for w in words]
        missing = [w for w, s in zip(words, got, strict=True) if s is None]
        if not missing:
            return got  # type: ignore[return-value]
        if len(memo) > _MEMO_MAX:
            memo.clear()
        for w, s in zip(missing, self._stemmer(language).stemWords(missing), strict=True):
            memo[w] = s
        return [memo.get(w) or self._stemmer(language).stemWord(w) for w in words]

    def language_rule(self, language: str | None = None) -> dict[str, str]:
        """Script -> Snowball language used for a text with this ``language`` metadata."""
        return {**self._rule, **language_overrides(language)}

    def __call__(self, text: str, language: str | None = None) -> list[str]:
        return self.analyze(text, language)

    def analyze(self, text: str, language: str | None = None) -> list[str]:
        rule = self._rule if not language else self.language_rule(language)
        if text.isascii():
            return self._ascii(text, rule.get("latin"))
        return self._analyze(unicode_runs(text), {s: (lang,) for s, lang in rule.items()})

    def analyze_query(self, text: str, languages: Iterable[str | None] = ()) -> list[str]:
        """Query tokens matching documents analyzed by the rule or by any of ``languages``.

        A word whose script several languages share (Latin: the rule's English and a
        German document's metadata) gives each distinct stem once; it is dropped as a
        stop word only when it is one in every such language.
        """
        per_script: dict[str, tuple[str, ...]] = {s: (lang,) for s, lang in self._rule.items()}
        for language in languages:
            for script, lang in language_overrides(language).items():
                have = per_script.get(script, ())
                if lang not in have:
                    per_script[script] = (*have, lang)
        return self._analyze(unicode_runs(text), per_script)

    def analyze_many(self, texts: Iterable[str]) -> list[list[str]]:
        return [self.analyze(t) for t in texts]

    def _ascii(self, text: str, lang: str | None) -> list[str]:
        """Fast path for ASCII text: every word is Latin, one language, nothing to fold."""
        words = _ASCII_WORD_RE.findall(text.lower())
        if not lang:
            return words
        if self.stop:
            stop = stop_words_for(lang)
            words = [w for w in words if w not in stop]
        return self._stem_words(lang, words) if self.stem else words

    def _actions(self, langs: dict[str, tuple[str, ...]]) -> dict[str, tuple[int, object, frozenset[str]]]:
        """Per kind of run: (mode, stemmer or languages, stop words)."""
        acts: dict[str, tuple[int, object, frozenset[str]]] = {"cjk": (_CJK, None, frozenset()),
                                                                "nospace": (_NOSPACE, None, frozenset())}
        for script, ls in langs.items():
            st = stop_words_for(ls[0]) if self.stop else frozenset()
            for lang in ls[1:]:
                st = st & stop_words_for(lang)
            if ls == ("",):  # a language without a stemmer: words as they are
                acts[script] = (_PLAIN, None, frozenset())
            elif not self.stem:
                acts[script] = (_PLAIN, None, st)
            elif len(ls) == 1:
                acts[script] = (_STEM, ls[0], st)
            else:
                acts[script] = (_STEM_MANY, ls, st)
        return acts

    def _analyze(self, runs: list[tuple[str, str]], langs: dict[str, tuple[str, ...]]) -> list[str]:
        acts = self._actions(langs)
        plain = (_PLAIN, None, frozenset())
        out: list[str] = []
        append = out.append
        # Words waiting for their language's stemmer: language -> (positions in out, words).
        pending: dict[str, tuple[list[int], list[str]]] = {}
        folded: list[int] = []
        fold = self.fold_accents
        for run, kind in runs:
            mode, arg, stop = acts.get(kind, plain)
            if mode == _CJK:
                out.extend(run)
                out.extend([run[i : i + 2] for i in range(len(run) - 1)])
                continue
            if mode == _NOSPACE:
                out.extend(_bigrams(run))
                continue
            if run in stop:
                continue
            if fold and kind == "latin" and not run.isascii():
                folded.append(len(out))
            if mode == _STEM:
                slot = pending.get(arg)  # type: ignore[arg-type]
                if slot is None:
                    slot = pending[arg] = ([], [])  # type: ignore[index]
                slot[0].append(len(out))
                slot[1].append(run)
                append(run)
            elif mode == _STEM_MANY:
                # Query side, several languages share the script: every distinct stem once.
                stems = list(dict.fromkeys(self._stemmer(lang).stemWord(run) if lang else run
                                           for lang in arg))  # type: ignore[attr-defined]
                if folded and folded[-1] == len(out):
                    folded.pop()
                    stems = list(dict.fromkeys(fold_latin(t) for t in stems))
                out.extend(stems)
            else:
                append(run)
        for lang, (positions, words) in pending.items():
            for i, s in zip(positions, self._stem_words(lang, words), strict=True):
                out[i] = s
        for i in folded:
            out[i] = fold_latin(out[i])
        return out


_PLAIN, _STEM, _STEM_MANY, _CJK, _NOSPACE = range(5)
_MEMO_MAX = 1_000_000  # words per language kept in the stem memo before it is emptied


# --------------------------------------------------------------------------- factory

# The spec-token analyzers of earlier releases: still built by name so that snapshots
# whose lexical index records one of them keep loading with the tokens they were built with.
ANALYZERS: dict[str, Analyzer] = {
    "spec": Analyzer(name="spec"),
    "stop": Analyzer(stop_words=ENGLISH_STOP_WORDS, name="stop"),
    "stem": Analyzer(stem=True, name="stem"),
    "english": Analyzer(stem=True, stop_words=ENGLISH_STOP_WORDS, name="english"),
}
UNICODE_FLAGS = ("fold", "nostem", "nostop")

# Chosen by measured nDCG@10 on ../shared/eval (see README "Analyzer choice").
DEFAULT_ANALYZER_NAME = "unicode"
ANALYZER_ENV = "RAGSPINE_ANALYZER"

IndexAnalyzer = Analyzer | UnicodeAnalyzer


@lru_cache(maxsize=64)
def unicode_analyzer(spec: str) -> UnicodeAnalyzer:
    """Parse ``unicode[:<language>][+fold][+nostem][+nostop]`` into its analyzer.

    ``unicode:<language>`` pins the rule for that language's scripts (``unicode:de`` and
    ``unicode:german`` are the same analyzer, named ``unicode:german``). Instances are
    shared per spec (they are immutable), so retrievers share one stem memo.
    """
    base, *flags = spec.strip().lower().split("+")
    head, _, pin = base.partition(":")
    if head != "unicode":
        raise ValueError(f"not a unicode analyzer: {spec!r}")
    bad = [f for f in flags if f not in UNICODE_FLAGS]
    if bad:
        raise ValueError(f"unknown analyzer option(s) {bad} in {spec!r}; options: {list(UNICODE_FLAGS)}")
    rule = dict(DEFAULT_SCRIPT_RULE)
    name = "unicode"
    if pin:
        lang = resolve_language(pin)
        if lang is None:
            raise LanguageError(f"{spec!r}: {pin!r} has no Snowball stemmer to pin")
        for script in LANGUAGE_SCRIPTS.get(lang, ("latin",)):
            rule[script] = lang
        name = f"unicode:{lang}"
    opts = sorted(set(flags))
    return UnicodeAnalyzer(rule=tuple(sorted(rule.items())), stem="nostem" not in opts, stop="nostop" not in opts,
                           fold_accents="fold" in opts, name="+".join([name, *opts]))


def make_analyzer(spec: str | IndexAnalyzer | None = None) -> IndexAnalyzer:
    """Factory for the index analyzer.

    ``None`` takes ``$RAGSPINE_ANALYZER`` if set, else the default ``unicode``. Names:
    ``unicode[:<language>][+fold][+nostem][+nostop]`` (every script, per-script
    Snowball rule, see ``UnicodeAnalyzer``) and the legacy spec-token analyzers ``spec``,
    ``stop``, ``stem``, ``english`` (ASCII + CJK only).
    """
    if isinstance(spec, Analyzer | UnicodeAnalyzer):
        return spec
    if spec is None or not spec.strip():
        spec = str(settings.get(ANALYZER_ENV))  # the variable (stripped), else "unicode"
    name = spec.strip().lower()
    if name.startswith("unicode"):
        return unicode_analyzer(name)
    try:
        return ANALYZERS[name]
    except KeyError:
        raise ValueError(
            f"unknown analyzer {spec!r}; choose unicode[:<language>][+fold|+nostem|+nostop] or one of {sorted(ANALYZERS)}"
        ) from None
