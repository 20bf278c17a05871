"""Unicode character classes and a cheap script detector for the index analyzer.

Python's ``re`` has no ``\\p{...}`` classes, and its ``\\w`` leaves out combining marks, so
``\\w+`` cuts Devanagari (हिन्दी → ह, न, द) and Thai at every vowel sign. The analyzer
instead matches runs that start with a letter or digit (categories L*, N*) and go on
through letters, digits and spacing/non-spacing marks (Mn, Mc). Enclosing marks (Me:
keycaps, circles) and variation selectors are left out so that emoji sequences such as
``❤️`` or ``1️⃣`` do not leave stray mark tokens behind.

The category ranges come from a table generated from ``unicodedata`` (``unicode_ranges``)
because scanning all 1.1M code points costs ~0.3 s per process; when the running Python
has another Unicode version than the table, the scan is redone at import instead of using
stale data.

``script_of`` maps a character to the script that decides its language rule (Latin,
Cyrillic, Greek, Arabic, Devanagari, ...). Only the first letter of a word is looked at:
the tokenizer already splits CJK and the scripts written without spaces into their own
runs, and a word that mixes Latin and Cyrillic letters is too rare to pay for more.
"""

from __future__ import annotations

import bisect
import re
import unicodedata
from collections.abc import Iterable

from . import unicode_ranges

Ranges = list[tuple[int, int]]

_VARIATION_SELECTORS: Ranges = [(0xFE00, 0xFE0F), (0xE0100, 0xE01EF)]


def scan_ranges(categories: Iterable[str]) -> Ranges:
    """Inclusive code point ranges whose general category is one of ``categories``."""
    wanted = frozenset(categories)
    cat = unicodedata.category
    out: Ranges = []
    start = -1
    for cp in range(0x110000):
        if cat(chr(cp)) in wanted:
            if start < 0:
                start = cp
        elif start >= 0:
            out.append((start, cp - 1))
            start = -1
    if start >= 0:
        out.append((start, 0x10FFFF))
    return out


HEAD_CATEGORIES = ("Lu", "Ll", "Lt", "Lm", "Lo", "Nd", "Nl", "No")
MARK_CATEGORIES = ("Mn", "Mc")


def _load_tables() -> tuple[Ranges, Ranges]:
    if unicodedata.unidata_version == unicode_ranges.UNIDATA_VERSION:
        return list(unicode_ranges.HEAD), list(unicode_ranges.MARK)
    return scan_ranges(HEAD_CATEGORIES), scan_ranges(MARK_CATEGORIES)


HEAD_RANGES, MARK_RANGES = _load_tables()


def subtract(ranges: Ranges, remove: Ranges) -> Ranges:
    """``ranges`` minus ``remove`` (both inclusive, sorted, non-overlapping within each)."""
    out: Ranges = []
    remove = sorted(remove)
    for lo, hi in ranges:
        cur = lo
        for rlo, rhi in remove:
            if rhi < cur or rlo > hi:
                continue
            if rlo > cur:
                out.append((cur, rlo - 1))
            cur = max(cur, rhi + 1)
            if cur > hi:
                break
        if cur <= hi:
            out.append((cur, hi))
    return out


def intersect(ranges: Ranges, keep: Ranges) -> Ranges:
    out: Ranges = []
    for lo, hi in ranges:
        for klo, khi in keep:
            a, b = max(lo, klo), min(hi, khi)
            if a <= b:
                out.append((a, b))
    return sorted(out)


def char_class(ranges: Ranges) -> str:
    """The inside of a ``re`` character class for ``ranges``."""
    def esc(cp: int) -> str:
        return f"\\U{cp:08x}"

    return "".join(esc(lo) if lo == hi else f"{esc(lo)}-{esc(hi)}" for lo, hi in ranges)


# Scripts written without spaces between words (besides CJK): the analyzer indexes them
# as character bigrams.
NO_SPACE_RANGES: Ranges = [
    (0x0E00, 0x0E7F),  # Thai
    (0x0E80, 0x0EFF),  # Lao
    (0x1000, 0x109F),  # Myanmar
    (0x1780, 0x17FF),  # Khmer
    (0x19E0, 0x19FF),  # Khmer symbols
    (0xA9E0, 0xA9FF),  # Myanmar extended B
    (0xAA60, 0xAA7F),  # Myanmar extended A
]

# Ranges of the spec tokenizer's CJK class (Han, kana, Hangul): unigrams + bigrams.
CJK_RANGES: Ranges = [
    (0x1100, 0x11FF), (0x2E80, 0x2FDF), (0x3005, 0x3007), (0x3040, 0x309F), (0x30A0, 0x30FF),
    (0x3130, 0x318F), (0x31F0, 0x31FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xA960, 0xA97F),
    (0xAC00, 0xD7AF), (0xD7B0, 0xD7FF), (0xF900, 0xFAFF), (0x20000, 0x3134F),
]

# Script blocks that pick a language rule. Anything not listed (digits, symbols, Hebrew,
# Georgian, Ethiopic, ...) has no Snowball stemmer and is indexed as it is.
SCRIPT_BLOCKS: list[tuple[int, int, str]] = sorted([
    (0x0000, 0x024F, "latin"), (0x1E00, 0x1EFF, "latin"), (0x2C60, 0x2C7F, "latin"),
    (0xA720, 0xA7FF, "latin"), (0xAB30, 0xAB6F, "latin"),
    (0x0370, 0x03FF, "greek"), (0x1F00, 0x1FFF, "greek"),
    (0x0400, 0x052F, "cyrillic"), (0x1C80, 0x1C8F, "cyrillic"), (0x2DE0, 0x2DFF, "cyrillic"),
    (0xA640, 0xA69F, "cyrillic"),
    (0x0530, 0x058F, "armenian"),
    (0x0590, 0x05FF, "hebrew"),
    (0x0600, 0x06FF, "arabic"), (0x0750, 0x077F, "arabic"), (0x08A0, 0x08FF, "arabic"),
    (0xFB50, 0xFDFF, "arabic"), (0xFE70, 0xFEFF, "arabic"),
    (0x0900, 0x097F, "devanagari"), (0xA8E0, 0xA8FF, "devanagari"),
    (0x0B80, 0x0BFF, "tamil"),
    (0x0E00, 0x0E7F, "thai"), (0x0E80, 0x0EFF, "lao"), (0x1000, 0x109F, "myanmar"),
    (0x1780, 0x17FF, "khmer"),
])
_BLOCK_STARTS = [lo for lo, _, _ in SCRIPT_BLOCKS]
_SCRIPT_CACHE: dict[str, str] = {}


def script_of(ch: str) -> str:
    """The script of one character: ``latin``, ``cyrillic``, ... or ``other``."""
    s = _SCRIPT_CACHE.get(ch)
    if s is None:
        cp = ord(ch)
        i = bisect.bisect_right(_BLOCK_STARTS, cp) - 1
        s = SCRIPT_BLOCKS[i][2] if i >= 0 and cp <= SCRIPT_BLOCKS[i][1] else "other"
        _SCRIPT_CACHE[ch] = s
    return s


def _bmp_class(ranges: Ranges) -> str:
    return char_class([(lo, min(hi, 0xFFFF)) for lo, hi in ranges if lo <= 0xFFFF])


# Combining marks of the Inherited script (accents written after a base letter of any
# script that NFKC could not compose).
INHERITED_MARKS: Ranges = [(0x0300, 0x036F), (0x1AB0, 0x1AFF), (0x1DC0, 0x1DFF), (0x20D0, 0x20FF), (0xFE20, 0xFE2F)]
# Scripts often glued to Latin letters in one word (PPARγ, TNFα, Windows-версия): a change
# between them is a token boundary, as in ICU's script-run segmentation.
SPLIT_SCRIPTS = ("latin", "greek", "cyrillic")


def token_patterns() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """(BMP-only, full) tokenizer patterns.

    Alternatives, in order: a CJK run | a no-space-script run | a Latin, Greek or
    Cyrillic word (letters, ASCII digits and marks of that script: "pparγ" gives "ppar"
    and "γ"; digits go with them) | any other word, which starts with a letter or digit of
    none of these (``[^\\W_...]``: Python's alphanumerics) and goes on through such
    letters, digits and combining marks. ``re`` tests a class of BMP characters with a bitmap but walks a
    class holding astral ranges range by range (10x slower on long texts), so the marks
    outside the BMP (Brahmi, Chakma, ...) are only in the full pattern, used for a text
    holding an astral character.
    """
    marks = subtract(MARK_RANGES, _VARIATION_SELECTORS)
    word_chars = _merge(HEAD_RANGES + marks)
    no_space = intersect(word_chars, NO_SPACE_RANGES)
    cjk = char_class(CJK_RANGES)
    ns = char_class(no_space)
    split_classes = []
    split_blocks: Ranges = []
    for script in SPLIT_SCRIPTS:
        blocks = [(lo, hi) for lo, hi, name in SCRIPT_BLOCKS if name == script]
        split_blocks += blocks
        own = intersect(word_chars, subtract(blocks, INHERITED_MARKS))
        split_classes.append(_bmp_class(_merge(own + intersect(marks, INHERITED_MARKS) + [(0x30, 0x39)])))
    astral_cjk = "\\U00020000-\\U0003134f"
    taken = CJK_RANGES + no_space + intersect(word_chars, subtract(split_blocks, INHERITED_MARKS))
    other = f"[^\\W_{_bmp_class(_merge(taken))}{astral_cjk}]"
    split = "|".join(f"[{c}]+" for c in split_classes)
    out = []
    for mark_class in (_bmp_class(marks), char_class(marks)):
        out.append(re.compile(f"[{cjk}]+|[{ns}]+|{split}|{other}+(?:[{mark_class}]+{other}*)*"))
    return out[0], out[1]


_KIND_BLOCKS = sorted([(lo, hi, "cjk") for lo, hi in CJK_RANGES] + [(lo, hi, "nospace") for lo, hi in NO_SPACE_RANGES])
_KIND_STARTS = [lo for lo, _, _ in _KIND_BLOCKS]
# First character of a run -> its kind; Latin-1 and Latin Extended-A/B are filled up front.
KIND_CACHE: dict[str, str] = {chr(c): "latin" for c in range(0x250)}


def kind_of(ch: str) -> str:
    """``cjk``, ``nospace`` (Thai, Lao, Khmer, Myanmar) or the script of ``ch``."""
    k = KIND_CACHE.get(ch)
    if k is None:
        cp = ord(ch)
        i = bisect.bisect_right(_KIND_STARTS, cp) - 1
        k = _KIND_BLOCKS[i][2] if i >= 0 and cp <= _KIND_BLOCKS[i][1] else script_of(ch)
        KIND_CACHE[ch] = k
    return k


def _merge(ranges: Ranges) -> Ranges:
    out: Ranges = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def write_tables(path: str) -> None:
    """Regenerate ``unicode_ranges.py`` (run when Python's Unicode version moves)."""
    head, mark = scan_ranges(HEAD_CATEGORIES), scan_ranges(MARK_CATEGORIES)

    def fmt(rs: Ranges) -> str:
        return "".join(f"    (0x{a:X}, 0x{b:X}),\n" for a, b in rs)

    with open(path, "w", encoding="utf-8") as fh:
        fh.write('"""Generated by ``scripts.write_tables``: code point ranges by general category."""\n\n')
        fh.write(f"UNIDATA_VERSION = {unicodedata.unidata_version!r}\n\n")
        fh.write(f"# Letters and numbers ({', '.join(HEAD_CATEGORIES)}).\nHEAD = (\n{fmt(head)})\n\n")
        fh.write(f"# Combining marks ({', '.join(MARK_CATEGORIES)}).\nMARK = (\n{fmt(mark)})\n")
