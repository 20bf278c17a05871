"""``ragspine index``: a user's folder into the warehouse, one library per subfolder (or the
whole folder as one library), by the same engine steps the Dagster assets call.

Why here and not in the CLI: a plain install has no Dagster code location, so the steps
must run in-process from the engine (this module, no Dagster); in a checkout the CLI
materializes the assets instead (``definitions.index_libraries``) and both doors report
through the same ``LibraryReport``. The step order and pruning are the assets':
raw_documents -> chunks -> lexical_index, embeddings -> raptor_tree (opt-in) ->
relation_graph -> retrieval_snapshot -> catalog. Every step is incremental, so an
unchanged folder publishes nothing and writes no data file.

The corpus's own ``glossary.json`` and ``dimensions.json`` (at the indexed PATH) apply to
its libraries, or none: the demo's ACME files belong to the demo only. The warehouse
records where each library came from (``libraries.json``) and keeps the union of the
glossaries of its indexed libraries (``glossary.json``), so ``ragspine query`` rewrites
queries with the corpus's own synonyms, never the demo's, and needs no access to PATH.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import paths, settings
from .graph.step import RELATION_GRAPH, build_relation_graph
from .ingest.parsers import SUFFIXES
from .retrieval.lexical.analysis.glossary import load_glossary
from .retrieval.link.assembly import default_glossary_path
from .retrieval.link.narrative_link import NarrativeIndexRetriever
from .retrieval.raptor import raptor_enabled, raptor_settings
from .retrieval.vector.embedding_backends import embedding_spec_from_env, make_embedding_backend
from .scale.build import step_executor
from .warehouse import pipeline as P
from .warehouse.common import StepResult
from .warehouse.pipeline import published_libraries
from .warehouse.raptor_tables import RAPTOR, build_raptor_step, embeddings_for_raptor
from .warehouse.sources import SOURCES_FILE, WAREHOUSE_GLOSSARY, warehouse_glossary
from .warehouse.versioned import VersionedTables, write_json_atomic

KEEP_VERSIONS = 5  # as WarehouseResource.keep_versions
# What Dagster refuses in a partition key (dagster.._partitions.utils.base), plus what the
# warehouse cannot hold in a folder name or a doc id prefix.
_DAGSTER_INVALID = ("...", "\a", "\b", "\f", "\n", "\r", "\t", "\v", "\0")
_PATH_INVALID = ("/", "\\")
MAX_NAME_CHARS = 200
# The documented library name (README): letters and digits of any script, "_", "-", "." and
# single inner spaces. One name is then a Dagster partition key, a warehouse folder, a URL
# path segment and an API-key scope alike, with nothing to quote or escape in a shell.
_NAME_CHARS = re.compile(r"[^\W_]|[_\-.]|(?<! ) (?! )")

# ``ragspine index`` exit codes (README, docs/pipeline.md).
EXIT_OK = 0
EXIT_LIBRARY_FAILED = 1  # a library could not be built; the others were built
EXIT_INPUT_ERROR = 2  # nothing was indexed: no such folder, a library name that is not allowed
EXIT_CHECK_FAILED = 3  # every library was built, but an asset check failed (an unreadable file included)

Progress = Callable[[str], None]


class IndexInputError(ValueError):
    """The folder or a library name cannot be indexed; the message names the folder."""


@dataclass(frozen=True)
class LibrarySource:
    """One library to index: its name, its folder, and the root its symlinks may not leave."""

    name: str
    folder: Path
    corpus_root: Path

    @property
    def default_layout(self) -> bool:
        """Whether the folder is ``corpus_root / name`` (what the Dagster assets read)."""
        return self.folder == self.corpus_root / self.name


@dataclass
class LibraryReport:
    """What one library's build did, whichever door ran it."""

    name: str
    documents: int = 0
    parsed: int = 0
    failed_files: list[str] = field(default_factory=list)
    chunks: int = 0
    chunk_changes: dict[str, int] = field(default_factory=dict)
    embedding: str = "off"
    snapshot: str = ""
    published: bool = False
    checks: dict[str, bool] = field(default_factory=dict)
    error: str = ""

    def lines(self) -> list[str]:
        """The progress lines of this library: documents, chunks, embeddings, then checks."""
        if self.error:
            return [f"  {self.name}: FAILED ({self.error})"]
        ch = self.chunk_changes
        out = [f"  {self.name}: documents {self.documents} ({self.parsed} parsed this run, "
               f"{len(self.failed_files)} unreadable)"]
        out += [f"  {self.name}:   ! {f}" for f in self.failed_files]
        out.append(f"  {self.name}: chunks {self.chunks} active ({ch.get('new', 0)} new, {ch.get('changed', 0)} "
                   f"changed, {ch.get('unchanged', 0)} unchanged, {ch.get('withdrawn', 0)} withdrawn documents)")
        out.append(f"  {self.name}: embeddings {self.embedding}")
        failed = sorted(k for k, ok in self.checks.items() if not ok)
        out.append(f"  {self.name}: snapshot {self.snapshot} " + ("published" if self.published else
                   "unchanged (nothing published)") + f"; checks {len(self.checks) - len(failed)}/"
                   f"{len(self.checks)} passed" + (f" (FAILED: {', '.join(failed)})" if failed else ""))
        return out


def validate_library_name(name: str, folder: Path) -> str:
    """``name`` when it is a documented library name (see ``_NAME_CHARS``), else an
    IndexInputError naming the folder (and, for a subfolder, ``--library`` as the way out).
    Both doors call it: ``ragspine index`` before anything is built, the code location's
    ``raw_documents`` asset for a partition a sensor or a user added."""
    bad = [s for s in (*_DAGSTER_INVALID, *_PATH_INVALID) if s in name]
    other = sorted({c for i, c in enumerate(name) if not _NAME_CHARS.match(name, i)} - set("".join(bad)))
    why = ("is empty" if not name.strip() else
           f"contains {', '.join(repr(s) for s in bad)}" if bad else
           "starts with '.'" if name.startswith(".") else
           "has leading or trailing spaces" if name != name.strip() else
           "has control characters" if any(ord(c) < 32 or ord(c) == 127 for c in name) else
           f"is longer than {MAX_NAME_CHARS} characters" if len(name) > MAX_NAME_CHARS else
           f"contains {', '.join(repr(c) for c in other)}" if other else "")
    if why:
        raise IndexInputError(f"library name {name!r} of folder {folder} {why}: a library name is letters, digits, "
                              "'_', '-', '.' and single inner spaces (a Dagster partition key, a warehouse folder "
                              "and an API-key scope); rename the folder or pass --library NAME")
    return name


def plan_libraries(path: str | os.PathLike[str], library: str | None = None) -> list[LibrarySource]:
    """The libraries of ``path``: each visible subfolder one library, or with ``library``
    the whole folder one library of that name."""
    root = Path(path).expanduser().resolve()
    if not root.is_dir():
        raise IndexInputError(f"no folder at {path}")
    if library is not None:
        return [LibrarySource(validate_library_name(library, root), root, root)]
    subs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not subs:
        raise IndexInputError(f"{root} has no subfolder: each subfolder is one library; to index the folder "
                              "itself as one library pass --library NAME")
    return [LibrarySource(validate_library_name(p.name, p), p, root) for p in subs]


def loose_files(path: str | os.PathLike[str]) -> list[str]:
    """Supported files directly in ``path``: in one-library-per-subfolder mode they belong
    to no library, which the CLI says rather than skipping them silently."""
    root = Path(path)
    return sorted(p.name for p in root.iterdir() if p.is_file() and p.suffix.lower() in SUFFIXES)


# --------------------------------------------------------------- corpus settings
def corpus_settings(path: str | os.PathLike[str]) -> dict[str, str]:
    """The ``RAGSPINE_*`` values a build of ``path`` runs under: its own glossary and graph
    dimensions, or none (never the demo's). A variable the user set wins."""
    root = Path(path).expanduser().resolve()
    out = {}
    if settings.raw("RAGSPINE_GLOSSARY") is None:
        out["RAGSPINE_GLOSSARY"] = str(paths.corpus_glossary(root) or "none")
    if settings.raw("RAGSPINE_GRAPH_DIMENSIONS") is None:
        out["RAGSPINE_GRAPH_DIMENSIONS"] = str(paths.corpus_dimensions(root) or "none")
    return out


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the duration (the code location reads them)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _write_if_changed(path: Path, payload: dict[str, Any]) -> bool:
    """Write ``payload`` atomically unless the file already holds it (a rerun writes nothing)."""
    try:
        if json.loads(path.read_text(encoding="utf-8")) == payload:
            return False
    except (OSError, ValueError):
        pass
    write_json_atomic(path, payload)
    return True


def prior_glossary() -> Path | None:
    """The glossary a query of an unrecorded library got until now (the default chain's:
    ``RAGSPINE_GLOSSARY``, else the corpus root's): recorded for the libraries a warehouse
    already serves when ``ragspine index`` first writes ``libraries.json`` (a demo warehouse
    keeps its demo glossary)."""
    return default_glossary_path()


def _setting_file(value: str | None) -> str | None:
    return None if (value or "none").strip().lower() in ("none", "off") else str(Path(value or "").resolve())


def record_sources(warehouse: str | os.PathLike[str], sources: list[LibrarySource], path: str | os.PathLike[str],
                   *, others_glossary: Path | None = None) -> None:
    """Record each library's folder, glossary and dimensions in ``libraries.json`` (the
    warehouse's published libraries not recorded yet with ``others_glossary``), and the
    union of the recorded glossaries in ``glossary.json`` (removed when none has one).
    Each file is written only when its content changes: a rerun writes nothing."""
    wh = Path(warehouse)
    file = wh / SOURCES_FILE
    try:
        known = json.loads(file.read_text(encoding="utf-8")).get("libraries", {})
    except (OSError, ValueError):
        known = {}
    for lib in published_libraries(VersionedTables(wh)):
        known.setdefault(lib, {"folder": None, "glossary": _setting_file(str(others_glossary or "none")),
                               "dimensions": None})
    values = {**{k: settings.raw(k) for k in ("RAGSPINE_GLOSSARY", "RAGSPINE_GRAPH_DIMENSIONS")},
              **corpus_settings(path)}
    for s in sources:
        known[s.name] = {"folder": str(s.folder), "glossary": _setting_file(values["RAGSPINE_GLOSSARY"]),
                         "dimensions": _setting_file(values["RAGSPINE_GRAPH_DIMENSIONS"])}
    wh.mkdir(parents=True, exist_ok=True)
    _write_if_changed(file, {"format": 1, "libraries": dict(sorted(known.items()))})
    groups: list[dict[str, Any]] = []
    for rec in known.values():
        if rec.get("glossary") and Path(rec["glossary"]).is_file():
            for g in load_glossary(rec["glossary"]):
                item = {"kind": g.kind, "terms": list(g.terms)}
                if item not in groups:
                    groups.append(item)
    if groups:
        _write_if_changed(wh / WAREHOUSE_GLOSSARY, {"groups": groups})
    else:
        (wh / WAREHOUSE_GLOSSARY).unlink(missing_ok=True)


def record_corpus_if_indexed(warehouse: str | os.PathLike[str], corpus_root: str | os.PathLike[str]) -> None:
    """After a build of ``corpus_root`` by another door (``ragspine demo``): record its
    published libraries when ``ragspine index`` already records this warehouse's sources,
    so the demo's libraries keep the demo glossary in a warehouse they share."""
    wh = Path(warehouse)
    if not (wh / SOURCES_FILE).is_file():
        return
    published = set(published_libraries(VersionedTables(wh)))
    sources = [s for s in plan_libraries(corpus_root) if s.name in published]
    if sources:
        record_sources(wh, sources, corpus_root)


# --------------------------------------------------------------- in-process steps
def _prune(wh: VersionedTables, asset: str, library: str, protect: set[str]) -> None:
    """As the assets prune: never a version a published snapshot (of any chunking) names."""
    keep = set(protect) | P.snapshot_protected(wh, library, asset)
    wh.prune(asset, library, keep=KEEP_VERSIONS, protect=keep, retain_for=settings.get("RAGSPINE_RETAIN_FOR_S"))


def _snapshot_named(wh: VersionedTables, library: str, key: str) -> set[str]:
    snap = wh.latest(P.SNAPSHOT, library)
    value = snap.manifest["metadata"].get(key) if snap is not None else None
    return {str(value)} if value else set()


def _checks(into: dict[str, bool], res: StepResult | None) -> None:
    for name, outcome in (res.checks if res is not None else {}).items():
        into[name] = bool(outcome.passed)


def _embedding_text(md: dict[str, Any] | None, spec: str) -> str:
    """``12 embedded at 85.3 items/s (model)``, ``reused`` or ``off``."""
    if md is None:
        return f"off (backend {spec or 'none'}: the library serves BM25)"
    if md.get("reused") or not md.get("embedded"):
        return f"unchanged ({md.get('count', 0)} vectors, {md.get('model_id', '')})"
    rate = md.get("sentences_per_s")
    return f"{md['embedded']} embedded" + (f" at {rate} items/s" if rate else "") + f" ({md.get('model_id', '')})"


def _once(entry: str) -> str:
    """``a.pdf: unreadable PDF`` of the step's ``a.pdf: a.pdf: unreadable PDF`` (the reader's
    error names the file too)."""
    name, sep, rest = entry.partition(": ")
    base = Path(name).name
    return f"{name}: {rest[len(base) + 2:]}" if sep and base and rest.startswith(f"{base}: ") else entry


def report_from_metadata(name: str, md: dict[str, dict[str, Any]], checks: dict[str, bool], spec: str = ""
                         ) -> LibraryReport:
    """A LibraryReport from each asset's metadata (either door: plain values by asset name)."""
    raw, ch, snap = md.get("raw_documents", {}), md.get("chunks", {}), md.get("retrieval_snapshot", {})
    emb = md.get("embeddings")
    if emb is not None and emb.get("backend") == "none":
        emb = None
    return LibraryReport(
        name, documents=int(raw.get("documents", 0)), parsed=int(raw.get("parsed", 0)),
        failed_files=[_once(f) for f in raw.get("failed_files") or []], chunks=int(ch.get("active_chunks", 0)),
        chunk_changes={k: int(ch.get(k, 0)) for k in ("new", "changed", "unchanged", "withdrawn")},
        embedding=_embedding_text(emb, spec), snapshot=str(snap.get("version", "")),
        published=str(snap.get("reused", "False")) != "True", checks=dict(checks))


def index_library(wh: VersionedTables, source: LibrarySource, *, progress: Progress | None = None) -> LibraryReport:
    """Every step of one library in-process, in the assets' order and with their pruning."""
    lib, say = source.name, progress or (lambda _line: None)  # say: the embedding step's live progress
    md: dict[str, dict[str, Any]] = {}
    checks: dict[str, bool] = {}
    with wh.lock(lib):
        raw = P.build_raw_documents(wh, source.corpus_root, lib, folder=source.folder)
        _prune(wh, P.RAW, lib, _snapshot_named(wh, lib, "raw_documents"))
        md["raw_documents"] = raw.metadata
        _checks(checks, raw)
        say(step_line(lib, "raw_documents", raw.metadata))
        executor = step_executor()  # RAGSPINE_EXECUTOR: Ray's, or None (here), as the resource passes it
        chunks = P.build_chunks(wh, lib, None, executor=executor)
        _prune(wh, P.CHUNKS, lib, _snapshot_named(wh, lib, "chunks"))
        md["chunks"] = chunks.metadata
        _checks(checks, chunks)
        say(step_line(lib, "chunks", chunks.metadata))
        lex = P.build_lexical_index(wh, lib, None)
        _prune(wh, P.LEXICAL, lib, _snapshot_named(wh, lib, "lexical_index"))
        say(step_line(lib, "lexical_index", lex.metadata))
        spec = embedding_spec_from_env("auto")
        emb = P.build_embeddings(wh, lib, make_embedding_backend(spec), spec, log=say, executor=executor)
        if emb is not None:
            _prune(wh, P.EMBEDDINGS, lib, _snapshot_named(wh, lib, "embeddings"))
            md["embeddings"] = emb.metadata
            say(step_line(lib, "embeddings", emb.metadata))
        checks["restricted_never_embedded"] = emb is None or bool(emb.checks["restricted_never_embedded"].passed)
        if raptor_enabled(None):
            _, depth, threshold = raptor_settings(None, None, None)
            backend, leaf_vectors = embeddings_for_raptor(wh, lib)
            rt = build_raptor_step(wh, lib, threshold=threshold, max_depth=depth, embedding_backend=backend,
                                   leaf_vectors=leaf_vectors)
            _prune(wh, RAPTOR, lib, {rt.published.version})
            _checks(checks, rt)
        graph = build_relation_graph(wh, lib)
        _prune(wh, RELATION_GRAPH, lib, {graph.published.version})
        _checks(checks, graph)
        checks.setdefault("facts_cite_served_chunks", True)  # reused: checked when that version was written
        snap = P.publish_snapshot(wh, lib)
        _prune(wh, P.SNAPSHOT, lib, set())
        md["retrieval_snapshot"] = snap.metadata
        say(step_line(lib, "retrieval_snapshot", snap.metadata))
        served = P.snapshot_summary(wh, lib)
        if served["restricted_chunks"]:  # probe every RESTRICTED chunk by its own words, as the asset does
            retriever = NarrativeIndexRetriever(P.load_snapshot_index(wh, lib))
            checks["restricted_never_served"] = bool(P.restricted_leak_check(wh, lib, retriever).passed)
        else:
            checks["restricted_never_served"] = True
    return report_from_metadata(lib, md, checks, spec)


_STEP_COUNTS = {"raw_documents": ("documents", "parsed", "parse_failures"),
                "chunks": ("active_chunks", "new", "changed", "unchanged", "withdrawn"),
                "lexical_index": ("chunks_indexed", "chunks_analyzed"),
                "embeddings": ("embedded", "count", "sentences_per_s"),
                "retrieval_snapshot": ("version",)}


def step_line(library: str, step: str, md: dict[str, Any] | None) -> str:
    """``  LIB: STEP done in S s: count, count`` -- the line either door prints as a step ends."""
    md = md or {}
    parts = [f"{k.replace('_', ' ')} {md[k]}" for k in _STEP_COUNTS.get(step, ()) if md.get(k) is not None]
    secs = md.get("seconds")
    return (f"  {library}: {step} done" + (f" in {secs:.1f} s" if isinstance(secs, int | float) else "")
            + (f": {', '.join(parts)}" if parts else ""))


def building_line(library: str) -> str:
    """The line either door prints as a library starts (its progress lines follow)."""
    return f"  {library}: building (raw_documents, chunks, lexical_index, embeddings, snapshot) ..."


def index_in_process(warehouse: str | os.PathLike[str], sources: list[LibrarySource], *,
                     progress: Progress | None = None) -> list[LibraryReport]:
    """Index ``sources`` into ``warehouse`` without Dagster, then refresh the catalog over
    every published library (the others are left as they are). A library that fails is
    reported and the next one still runs."""
    wh = VersionedTables(Path(warehouse))
    reports = []
    for source in sources:
        if progress is not None:
            progress(building_line(source.name))
        try:
            report = index_library(wh, source, progress=progress)
        except Exception as exc:  # noqa: BLE001 - reported per library, the others still build
            report = LibraryReport(source.name, error=f"{type(exc).__name__}: {str(exc)[:300]}")
        reports.append(report)
        for line in report.lines() if progress is not None else ():
            progress(line)
    P.build_catalog(wh, P.published_libraries(wh), Path(warehouse) / "catalog.duckdb")
    return reports


REPORTED_CHECKS = frozenset({"parse_failures_zero", "sensitivity_labels_valid"})
"""Checks whose failures are files the summary names one by one (withheld until they parse)."""


def exit_code(reports: list[LibraryReport]) -> int:
    """``EXIT_LIBRARY_FAILED`` when a library failed, else ``EXIT_CHECK_FAILED`` when any
    check did not pass (the per-file ones included: a withheld file is not served), else 0.
    Decided after every library ran: one failure never stops the rest."""
    if any(r.error for r in reports):
        return EXIT_LIBRARY_FAILED
    if any(not ok for r in reports for ok in r.checks.values()):
        return EXIT_CHECK_FAILED
    return EXIT_OK


def any_failed(reports: list[LibraryReport]) -> bool:
    """A library that failed, or a check that did not pass."""
    return exit_code(reports) != EXIT_OK


def summary_lines(reports: list[LibraryReport], warehouse: str | os.PathLike[str]) -> list[str]:
    """The closing summary: what was published, the checks, the unreadable files."""
    ok = [r for r in reports if not r.error]
    checks = [v for r in ok for v in r.checks.values()]
    unreadable = [f"{r.name}/{f}" for r in ok for f in r.failed_files]
    out = [f"summary: {len(ok)}/{len(reports)} {'library' if len(reports) == 1 else 'libraries'} indexed into "
           f"{warehouse}; "
           f"{sum(r.published for r in ok)} published a new snapshot, {sum(not r.published for r in ok)} unchanged; "
           f"{sum(r.documents for r in ok)} documents, {sum(r.chunks for r in ok)} chunks; "
           f"checks {sum(checks)}/{len(checks)} passed"]
    if unreadable:
        out.append(f"unreadable files ({len(unreadable)}), withheld until they parse: {', '.join(unreadable)}")
    failed = [r.name for r in reports if r.error]
    if failed:
        out.append(f"libraries that failed: {', '.join(failed)}")
    bad = [f"{r.name}/{k}" for r in ok for k, v in sorted(r.checks.items()) if not v]
    if bad:
        out.append(f"checks that failed: {', '.join(bad)}")
    code = exit_code(reports)
    if code:
        out.append(f"exit code {code}: " + ("a library failed" if code == EXIT_LIBRARY_FAILED else
                                            "a check failed") + " (the rest was built)")
    return out


__all__ = ["EXIT_CHECK_FAILED", "EXIT_INPUT_ERROR", "EXIT_LIBRARY_FAILED", "EXIT_OK", "REPORTED_CHECKS", "SOURCES_FILE", "WAREHOUSE_GLOSSARY", "IndexInputError", "LibraryReport",
           "LibrarySource", "any_failed", "corpus_settings", "exit_code", "building_line", "step_line", "prior_glossary", "environment", "index_in_process", "index_library", "loose_files", "plan_libraries",
           "record_corpus_if_indexed", "record_sources", "report_from_metadata", "summary_lines", "validate_library_name", "warehouse_glossary"]
