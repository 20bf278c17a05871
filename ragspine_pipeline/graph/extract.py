"""Deterministic metric-fact extraction from chunk text (zh and en).

A fact is a number with a unit that follows a metric name in the same sentence:
``营业收入48.6亿元`` (a value), ``同比下降12.4%`` (a change), ``gross margin fell from
38.2% to 35.9%`` (a prior-period value, then a value). Why rules and not a model: every
fact must cite the exact characters of its number, and the same text must always give
the same graph. What a rule cannot place (no metric before the number, a share such as
``占收入比重8.4%``, a forward-looking target) is left out: precision first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from .dimensions import Dimensions

KINDS = ("value", "change")
_SENTENCE = re.compile(r"[^。！？；;!?\n]+(?:[。！？；;!?]|\.(?=\s|$)|$)|[^\n]+")
_NUM = r"(\d+(?:,\d{3})*(?:\.\d+)?)"
_FIGURE = re.compile(
    rf"(?P<cur>RMB|CNY|USD|EUR|US\$|\$|€)\s?{_NUM}\s*(?P<scale>billion|million|bn|m)\b"
    rf"|(?P<cur2>RMB|CNY|USD|EUR)\s?{_NUM}(?!\s*(?:billion|million|bn))"
    rf"|{_NUM}\s*(?P<zh>亿元|万元|亿美元|亿欧元|元)"
    rf"|{_NUM}\s*(?P<pct>%|％|个百分点|percentage points?|pp\b)",
    re.IGNORECASE)
_CURRENCY = {"rmb": "CNY", "cny": "CNY", "usd": "USD", "us$": "USD", "$": "USD", "eur": "EUR", "€": "EUR"}
_SCALE = {"billion": 1e9, "bn": 1e9, "million": 1e6, "m": 1e6}
_ZH_UNIT = {"亿元": ("CNY", 1e8), "万元": ("CNY", 1e4), "元": ("CNY", 1.0), "亿美元": ("USD", 1e8),
            "亿欧元": ("EUR", 1e8)}
# Cues in the text before a number, nearest (last-ending) wins. "to" cues mark the level
# a change arrives at; "from" cues the prior-period level; the others a signed change.
_CUES: list[tuple[str, str]] = [
    (r"降至|升至|回升至|增至|减至|恢复到|达到|达|为|\bto\b|\breached\b|\bat\b|\bof\b", "to"),
    (r"由上年的|上年的|上年|较上年|由|\bfrom\b|compared with|versus|\bvs\.?", "from"),
    (r"同比下降|同比减少|同比下滑|下降|下滑|减少|降幅|\bfell\b|\bdeclined?\b|\bdown\b|\bdropped\b|\bdecreased?\b|"
     r"\blower\b", "down"),
    (r"同比增长|同比上升|增长|上升|增加|提高|\bgrew\b|\brose\b|\bup\b|\bincreased?\b|\bgrowth of\b", "up"),
]
_CUE_RE = [(re.compile(p, re.IGNORECASE), k) for p, k in _CUES]
_FORWARD = re.compile(r"目标|预计|展望|计划|指引|将会|\btarget|\bexpect(?:s|ed)?\b|\bguidance\b|\bforecast|\bwould\b|"
                      r"\bestimated\b|\bcould\b", re.IGNORECASE)
_PER_SHARE = re.compile(r"^\s*(?:per share|a share|/股)", re.IGNORECASE)
_CLAUSE = re.compile(r"[，,；;、：:]")
_YEAR = re.compile(r"(?:\b(?P<pre>H[12]|Q[1-4])\s+)?(20\d\d)\s*年?\s*(上半年|下半年|第([一二三四])季度|H1|H2|Q([1-4]))?")
_TRAILING_YEAR = re.compile(r"^\s*(?:in|for)\s+(20\d\d)\b", re.IGNORECASE)
_QZH = {"一": "1", "二": "2", "三": "3", "四": "4"}


class ExtractionError(ValueError):
    """A chunk handed to the extractor is malformed."""


@dataclass(frozen=True)
class MetricFact:
    """One cited number: ``text[start:end]`` of document ``doc_id`` is ``quote``."""

    entity: str
    metric: str
    period: str
    kind: str  # "value" or "change"
    value: float  # in base units (CNY, USD, EUR) or percent / percentage points
    unit: str  # CNY | USD | EUR | % | pp
    precision: float  # half a unit of the last stated digit, in the same base unit
    quote: str
    doc_id: str
    chunk_id: str
    start: int  # document offsets (source_locator coordinates)
    end: int
    segment: str = ""

    def key(self) -> str:
        return f"{self.doc_id}:{self.start}:{self.end}:{self.metric}:{self.kind}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _alias_re(aliases: Iterable[tuple[str, str]]) -> tuple[re.Pattern[str], dict[str, str]]:
    """A case-insensitive pattern of every alias (at a position, the longest that matches;
    one starting with an ASCII letter or digit only between non-letters) and alias -> target.

    Why a trie: as one alternative per alias, Python's ``re`` tried every alias at every
    character, ~250 us per sentence with the demo dimensions, which made the relation graph
    most of a 1% refresh (9.5 s of 10.8 s on SciFact). Factored by common prefixes, each
    character tries only the letters that can follow it; greedy groups still take the longest
    alias first, and the lookahead backtracks to a shorter one as the alternation did.
    Aliases with a cased non-ASCII letter (where two keys could match one character under
    IGNORECASE) keep the plain alternation."""
    table: dict[str, str] = {}
    for alias, target in aliases:
        table.setdefault(alias.lower(), target)
    if not table:
        return re.compile(r"(?!)"), table
    if "" in table or any(not ch.isascii() and ch.lower() != ch.upper() for a in table for ch in a):
        parts = [rf"(?<![A-Za-z]){re.escape(a)}(?![A-Za-z])" if _bounded(a) else re.escape(a)
                 for a in sorted(table, key=lambda s: (-len(s), s))]
        return re.compile("|".join(parts), re.IGNORECASE), table
    bounded = [a for a in table if _bounded(a)]
    free = [a for a in table if not _bounded(a)]
    groups = ([rf"(?<![A-Za-z]){_trie(bounded)}(?![A-Za-z])"] if bounded else []) + ([_trie(free)] if free else [])
    return re.compile("|".join(groups), re.IGNORECASE), table


def _bounded(alias: str) -> bool:
    return alias[:1].isascii() and alias[:1].isalnum()


def _trie(keys: list[str]) -> str:
    """A regex matching exactly ``keys`` (non-empty), longer continuations tried first."""
    root: dict[str, Any] = {}
    for key in keys:
        node = root
        for ch in key:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict[str, Any]) -> str:
        kids = sorted((ch for ch in node if ch), key=lambda ch: (-_depth(node[ch]), ch))
        alts = [re.escape(ch) + emit(node[ch]) for ch in kids]
        if not alts:
            return ""
        body = alts[0] if len(alts) == 1 and "" not in node else "(?:" + "|".join(alts) + ")"
        return body + "?" if "" in node else body

    return emit(root)


def _depth(node: dict[str, Any]) -> int:
    return max((1 + _depth(child) for ch, child in node.items() if ch), default=0)


def period_of(text: str) -> str:
    """The last period named in ``text`` (``2023``, ``2024H1``, ``2023Q3``), else ""."""
    found = ""
    for m in _YEAR.finditer(text):
        y, half, qzh, q = m.group(2), m.group(3) or "", m.group(4), m.group(5)
        pre = m.group("pre") or ""  # "H1 2024", "Q3 2023": the half or quarter before the year
        if pre and not (half or qzh or q):
            half, q = (pre, None) if pre[0] == "H" else ("", pre[1])
        if half in ("上半年", "H1"):
            found = f"{y}H1"
        elif half in ("下半年", "H2"):
            found = f"{y}H2"
        elif qzh or q:
            found = f"{y}Q{_QZH.get(qzh or '', q or '')}"
        else:
            found = y
    return found


def prior_period(period: str) -> str:
    m = re.match(r"(20\d\d)(.*)$", period)
    return f"{int(m.group(1)) - 1}{m.group(2)}" if m else ""


def _figure(m: re.Match[str]) -> tuple[float, str, float] | None:
    """(value in base units, unit, precision) of a figure match."""
    g = m.groupdict()
    nums = [x for x in m.groups() if x and re.fullmatch(r"\d+(?:,\d{3})*(?:\.\d+)?", x)]
    raw = nums[0].replace(",", "")
    decimals = len(raw.split(".")[1]) if "." in raw else 0
    half = 0.5 * 10 ** -decimals
    x = float(raw)
    if g.get("cur"):
        s = _SCALE[g["scale"].lower()]
        return x * s, _CURRENCY[g["cur"].lower()], half * s
    if g.get("cur2"):
        return x, _CURRENCY[g["cur2"].lower()], half
    if g.get("zh"):
        unit, s = _ZH_UNIT[g["zh"]]
        return x * s, unit, half * s
    if g.get("pct"):
        p = g["pct"].lower()
        return x, ("%" if p in ("%", "％") else "pp"), half
    return None


@dataclass
class Extractor:
    """Rules compiled from the dimensions (entity, metric and segment aliases)."""

    dims: Dimensions

    def __post_init__(self) -> None:
        self._ent, self._ent_map = _alias_re((a, e.id) for e in self.dims.entities for a in (*e.aliases, e.name_en,
                                                                                                 e.name_zh) if a)
        self._met, self._met_map = _alias_re((a, m.id) for m in self.dims.metrics for a in (*m.aliases, m.name_en,
                                                                                              m.name_zh) if a)
        self._seg, self._seg_map = _alias_re((s, s) for s in self.dims.segments)
        self._kinds = {m.id: m.kind for m in self.dims.metrics}

    def sentence_facts(self, text: str, *, entity: str = "", period: str = "", doc_id: str = "",
                       chunk_id: str = "", offset: int = 0) -> list[MetricFact]:
        """Facts of one sentence; ``entity``/``period`` are the fallbacks (chunk metadata)."""
        out: list[MetricFact] = []
        events: list[tuple[int, int, str, Any]] = []
        for m in self._ent.finditer(text):
            events.append((m.start(), m.end(), "entity", self._ent_map[m.group(0).lower()]))
        for m in self._met.finditer(text):
            events.append((m.start(), m.end(), "metric", self._met_map[m.group(0).lower()]))
        for m in _FIGURE.finditer(text):
            events.append((m.start(), m.end(), "figure", m))
        events.sort(key=lambda e: (e[0], -e[1]))
        cur_entity, cur_metric, cur_segment = "", "", ""
        cur_period = ""
        metric_at = -1
        last_end = 0
        taken_end = -1
        entity_end = 0
        for start, end, what, val in events:
            if start < taken_end:
                continue  # inside a longer match already used
            taken_end = end
            if what == "entity":
                cur_entity, entity_end = val, end
                continue
            if what == "metric":
                cur_metric, metric_at = val, start
                window = text[max(last_end, entity_end):start]
                segs = [self._seg_map[s.group(0).lower()] for s in self._seg.finditer(window)]
                cur_segment = segs[-1] if segs else ""
                continue
            fig = _figure(val)
            before = _CLAUSE.split(text[last_end:start])[-1]
            last_end = end
            same_clause = metric_at >= 0 and not _CLAUSE.search(text[metric_at:start])
            p = period_of(text[:start])
            cur_period = p or cur_period
            if fig is None or not cur_metric or _FORWARD.search(text[:start]) or _PER_SHARE.match(text[end:]) \
                    or "每股" in text[max(0, start - 6):start]:
                continue
            value, unit, prec = fig
            cue = ""
            best = (-1, 0)
            for rx, kind in _CUE_RE:
                for c in rx.finditer(before):
                    if (c.end(), c.end() - c.start()) > best:
                        best, cue = (c.end(), c.end() - c.start()), kind
            mkind = self._kinds.get(cur_metric, "money")
            fact_period = cur_period or period
            if cue in ("up", "down"):
                if unit not in ("%", "pp"):
                    continue  # a change stated in money: not modelled
                kind, value = "change", (value if cue == "up" else -value)
            else:
                if mkind == "money" and unit in ("%", "pp"):
                    continue  # a share or a rate of a money metric, not the metric itself
                if mkind == "ratio" and unit not in ("%",):
                    continue
                if not same_clause:
                    continue  # a level needs its metric named in its own clause
                kind = "value"
                trailing = _TRAILING_YEAR.match(text[end:])
                if trailing:
                    fact_period = trailing.group(1)
                elif cue == "from":
                    fact_period = prior_period(fact_period)
            out.append(MetricFact(cur_entity or entity, cur_metric, fact_period, kind, round(value, 6), unit,
                                  prec, text[start:end], doc_id, chunk_id, offset + start, offset + end,
                                  cur_segment))
        return out

    def text_facts(self, text: str, **kw: Any) -> list[MetricFact]:
        """Facts of a passage, sentence by sentence (offsets relative to ``kw['offset']``)."""
        base = int(kw.pop("offset", 0))
        out: list[MetricFact] = []
        for s in _SENTENCE.finditer(text):
            out.extend(self.sentence_facts(s.group(0), offset=base + s.start(), **kw))
        return out

    def chunk_facts(self, chunk: Any) -> list[MetricFact]:
        """Facts of a chunk; offsets are the chunk's source_locator (document) coordinates."""
        try:
            text, loc = chunk.text, chunk.source_locator
        except AttributeError as exc:
            raise ExtractionError(f"not a chunk: {type(chunk).__name__}") from exc
        period = period_of(getattr(chunk, "title", "") or "") or getattr(chunk, "period", "")
        return self.text_facts(text, entity=getattr(chunk, "entity", ""), period=period,
                               doc_id=chunk.doc_id, chunk_id=chunk.chunk_id, offset=loc.start)
