"""Which libraries' BM25 statistics a query is weighed against (issue 43, item 1).

Why: ranking several libraries as one collection (``global_rank``) sums their BM25
statistics. A library written in another language than the query holds almost none of its
words, yet its documents raise N and move the average length, so every idf of the query
grows by about log(N_union / N) and the contrast between its rare and common words
flattens: the same documents are ranked by a different function. Measured on the shared
sets (``benchmarks/results/multi_library.md``, 2-way split plus two unrelated sets as
libraries): xquad-de -0.040 nDCG@10, xquad-th -0.030, cmrc2018-trial -0.006, and all of
it from the statistics (the original libraries alone, ranked with the union's statistics,
lose the same; the other-language documents that enter the top 10 cost < 0.0003).

BM25's idf estimates how common a word is in the collection the question is asked of. A
document in another language is not a draw from that collection, so the statistics are
taken over the libraries that hold the query's language (``scope``): each of them scores
with their summed statistics, exactly as one index over them would. A library outside the
scope is still ranked (nothing is dropped): it scores with the scope's statistics plus
its own part (the two-phase kernel needs its own documents inside the totals), so a
relevant document in it still competes on its BM25 score.

Language groups are ``language_profile``'s: ``en``, ``latin`` (other Latin-script
languages), ``cyrillic``, ``arabic``, ``thai``, ``cjk``, ``other``.

* A query's groups (``query_groups``): the script group holding most of its letters
  (``LETTER_WEIGHT``), and every other non-Latin one holding at least a quarter of them (script is reliable on a
  few characters). Latin words in a question written mostly in another script are names
  and acronyms borrowed into it ("NFL", "iPhone" in a Chinese question: 54 of cmrc2018's
  1,002 questions hold Latin letters, one a majority) unless they hold a quarter of the
  letters and a function word ("who is 毛泽东" is English too). Latin letters are told apart by
  function words (``latin_groups``): more function words of one other Latin language
  (German, French, ...) than English ones of any kind gives ``latin``; English-only
  function words ahead of any other language's gives ``en``; otherwise both. How it
  fails: a Latin query without function words ("Tesla patents") is both groups, so its
  statistics are every Latin library's (the union, as without this module); a query of
  one Latin language whose few function words are another's ("die casting of alloys":
  Dutch "die", "of") may be put in the wrong Latin group, and then the libraries of its
  own language are scored with the other group's statistics plus their own (a shifted
  idf, never a dropped library).
* A library's groups (``library_groups``): the groups of a deterministic sample of its
  open chunks (never a RESTRICTED one), each group that holds at least ``MIN_SHARE`` of
  the sampled chunks with letters. The share keeps a few misread chunks (a table, a list
  of names) from putting an English library in a German query's scope.
* Fallback: a query whose groups cannot be told (no letters) or that no library holds is
  weighed against every library, the union of ``global_rank``.
"""

from __future__ import annotations

import contextlib
import re
import weakref
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from ..lexical.analysis.stopwords import latin_function_words

LATIN_GROUPS = frozenset({"en", "latin"})
QUERY_MIN_SHARE = 0.25  # a script group must hold this share of a query's letters to count
MIN_SHARE = 0.02  # a library holds a group when this share of its sampled chunks is in it
SAMPLE_CHUNKS = 500  # chunks sampled per library (evenly spaced positions)
SAMPLE_CHARS = 500  # characters read per sampled chunk
# A query's letters are weighed by how much each carries: a Han, kana or Hangul character
# about as much as three Latin letters (an English word has ~4.7 letters, a Chinese one
# ~1.5 characters), so "MonoDevelop主要是用来开发什么的" is a Chinese question.
LETTER_WEIGHT = {"cjk": 3}

# Letters of each script group (the same blocks as ``language_profile``'s groups).
_SCRIPTS = {
    "cjk": re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]"),
    "thai": re.compile(r"[\u0e00-\u0e7f]"),
    "arabic": re.compile(r"[\u0600-\u06ff\u0750-\u077f\u08a0-\u08ff\ufb50-\ufdff\ufe70-\ufeff]"),
    "cyrillic": re.compile(r"[\u0400-\u052f]"),
    "latin": re.compile(r"[A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f\u1e00-\u1eff]"),
}
_LETTER = re.compile(r"[^\W\d_]")
_LATIN_WORD = re.compile(r"[A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f\u1e00-\u1eff]+")


def script_counts(text: str) -> Counter[str]:
    """Letters per script group (``other``: letters of no listed script)."""
    counts: Counter[str] = Counter({g: len(rx.findall(text)) for g, rx in _SCRIPTS.items()})
    counts["other"] = max(0, len(_LETTER.findall(text)) - sum(counts.values()))
    return +counts


def latin_groups(text: str) -> frozenset[str]:
    """``{"en"}``, ``{"latin"}`` or both (cannot tell) for the Latin words of ``text``."""
    en_any, en_only, other_only = latin_function_words(w.casefold() for w in _LATIN_WORD.findall(text))
    if other_only > en_any:
        return frozenset({"latin"})
    if en_only > other_only:
        return frozenset({"en"})
    return LATIN_GROUPS


def query_groups(text: str) -> frozenset[str] | None:
    """The groups ``text`` may be written in (see the module docstring); None: no letters."""
    counts = script_counts(text)
    for g, w in LETTER_WEIGHT.items():
        if g in counts:
            counts[g] *= w
    letters = sum(counts.values())
    if not letters:
        return None
    top = max(counts, key=lambda k: (counts[k], k))
    groups: set[str] = set()
    for g, n in counts.items():
        if g != "latin" and (g == top or n >= QUERY_MIN_SHARE * letters):
            groups.add(g)
    if "latin" in counts:
        latin = latin_groups(text)
        # Latin words beside another script count when they are a sentence (they hold a
        # function word), not a borrowed name or acronym.
        if top == "latin" or (counts["latin"] >= QUERY_MIN_SHARE * letters and latin != LATIN_GROUPS):
            groups |= latin
    return frozenset(groups)


def text_groups(text: str) -> frozenset[str]:
    """The group of one chunk (a sample of it): its dominant script, Latin told apart."""
    counts = script_counts(text[:SAMPLE_CHARS])
    if not counts:
        return frozenset()
    g = max(counts, key=lambda k: (counts[k], k))
    return latin_groups(text[:SAMPLE_CHARS]) if g == "latin" else frozenset({g})


_LIBRARY_GROUPS: weakref.WeakKeyDictionary[Any, frozenset[str]] = weakref.WeakKeyDictionary()


def library_groups(part: Any) -> frozenset[str]:
    """The groups a library (a ``HybridRetriever``) holds, from a sample of its open chunks;
    empty when it has no chunk with letters. Cached per retriever (its snapshot is fixed)."""
    try:
        return _LIBRARY_GROUPS[part]
    except (KeyError, TypeError):
        pass
    chunks, restricted = part.chunks, getattr(part, "restricted", None)
    n = len(chunks)
    step = max(1, n // SAMPLE_CHUNKS)
    counts: Counter[str] = Counter()
    seen = 0
    for pos in range(0, n, step):
        if restricted is not None and bool(restricted[pos]):
            continue
        gs = text_groups(chunks[pos].text)
        if gs:
            seen += 1
            counts.update(gs)
    held = frozenset(g for g, c in counts.items() if c >= MIN_SHARE * seen) if seen else frozenset()
    with contextlib.suppress(TypeError):  # an unhashable retriever is profiled per query
        _LIBRARY_GROUPS[part] = held
    return held


def stats_scope(parts: Mapping[str, Any], text: str, libs: Iterable[str]) -> list[str]:
    """The libraries (of ``libs``) whose summed statistics weigh the query ``text``: those
    holding one of its groups; every one of ``libs`` when that is none of them, or when
    the query's groups cannot be told."""
    libs = list(libs)
    groups = query_groups(text)
    if not groups:
        return libs
    scope = [lib for lib in libs if library_groups(parts[lib]) & groups]
    return scope or libs


__all__ = ["latin_groups", "library_groups", "query_groups", "script_counts", "stats_scope", "text_groups"]
