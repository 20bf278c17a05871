"""The alias trie matches exactly what one alternative per alias matched (graph extraction)."""

from __future__ import annotations

import random
import re

from ragspine_pipeline.corpus import DEMO_ROOT
from ragspine_pipeline.graph.extract import _alias_re
from ragspine_pipeline.graph.step import resolve_dimensions


def _alternation(table: dict[str, str]) -> re.Pattern[str]:
    """The pattern as it was: every alias an alternative, longest first."""
    parts = []
    for a in sorted(table, key=lambda s: (-len(s), s)):
        esc = re.escape(a)
        parts.append(rf"(?<![A-Za-z]){esc}(?![A-Za-z])" if a[:1].isascii() and a[:1].isalnum() else esc)
    return re.compile("|".join(parts) or r"(?!)", re.IGNORECASE)


def _spans(rx: re.Pattern[str], text: str) -> list[tuple[int, int, str]]:
    return [(m.start(), m.end(), m.group(0)) for m in rx.finditer(text)]


def _dimension_aliases():
    dims = resolve_dimensions(None, None)
    return [
        [(a, e.id) for e in dims.entities for a in (*e.aliases, e.name_en, e.name_zh) if a],
        [(a, m.id) for m in dims.metrics for a in (*m.aliases, m.name_en, m.name_zh) if a],
        [(s, s) for s in dims.segments],
    ]


def _noise(table: dict[str, str], rng: random.Random, n: int) -> list[str]:
    """Texts stitched from alias pieces, case flips, letters and separators around them."""
    keys = sorted(table)
    out = []
    for _ in range(n):
        bits = []
        for _ in range(rng.randint(1, 12)):
            k = rng.choice(keys)
            k = k[: rng.randint(1, len(k))] if rng.random() < 0.3 else k
            k = "".join(c.upper() if rng.random() < 0.3 else c for c in k)
            bits.append(k + rng.choice(["", " ", "s", "x", "-", "1", "。", "a ", "的"]))
        out.append("".join(bits))
    return out


def test_the_trie_finds_the_same_aliases_as_the_alternation():
    rng = random.Random(7)
    texts = [p.read_text(encoding="utf-8") for p in sorted(DEMO_ROOT.rglob("*")) if p.is_file()
             and p.suffix in (".md", ".txt")]
    assert texts
    for aliases in _dimension_aliases():
        rx, table = _alias_re(aliases)
        assert table and "(?:" in rx.pattern or len(table) == 1  # the trie form, not the fallback
        ref = _alternation(table)
        for text in texts + _noise(table, rng, 400):
            assert _spans(rx, text) == _spans(ref, text), text[:80]


def test_shared_prefixes_lookarounds_and_fallbacks():
    aliases = [("Net Sales", "a"), ("net", "b"), ("net income", "c"), ("NI", "d"), ("营收", "e"), ("营业收入", "f"),
               ("$m", "g"), ("3M", "h"), ("Ärger", "i"), ("ärger-x", "j")]
    rng = random.Random(3)
    for subset in ([a for a in aliases if a[1] not in "ij"], aliases, [("x", "x")], []):
        rx, table = _alias_re(subset)
        ref = _alternation(table)
        samples = ["net income rose; Net Sales fell", "planet net", "NIce NI, ni.", "营业收入和营收", "US$m 3M 3MM",
                   "ÄRGER-X ärger", ""] + (_noise(table, rng, 200) if table else [])
        for text in samples:
            assert _spans(rx, text) == _spans(ref, text), (subset, text)
