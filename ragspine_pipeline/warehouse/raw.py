"""The ``raw_documents`` step: a library folder as an append-only table of document rows.

A refresh stats every file (and its metadata sidecar). A file whose signature (size,
mtime, ctime, inode of file and sidecar, the sidecar's bytes) differs from the row that
described it last is then compared by content (``content_key``: the document's bytes,
its sidecar's bytes, whether each can be read, where a link points): only a file whose
content changed is parsed and written, so a file touched back to identical content
publishes nothing. Files that vanished get a tombstone row. Those rows are appended as one new
segment on top of the previous version, so a refresh that touched 1% of the files
parses and writes 1% of the rows. Readers take the newest row per ``source_path``.

Unreadable files become rows with ``parse_error``: reported, checked, never silently
dropped and never fatal for the library. ``rescan=True`` parses everything again (after
a parser upgrade) and writes the table whole.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..ingest.documents import (
    SIDECAR_SUFFIX,
    CorpusError,
    Document,
    DocumentError,
    read_document,
    sidecar_path,
)
from ..ingest.parsers import (
    SUFFIXES,
    anchors_from_structure_json,
    max_file_bytes,
    structure_from_json,
    structure_to_json,
)
from ..ingest.sidecars import CorpusView, find_sidecars, fold_name, is_sidecar_name, sidecar_bases
from ..sensitivity import is_restricted
from .common import RAW, SNAPSHOT, CheckOutcome, StepResult, last_row_per_key
from .versioned import (
    Append,
    Published,
    VersionedTables,
    WarehouseError,
    library_step,
    read_segments,
)

RAW_COLUMNS = ("doc_id", "title", "text", "metadata", "sensitivity", "source_path", "content_hash",
               "parse_error", "file_sig", "deleted", "raw_version", "label_problem", "structure", "file_hash")
# Everything but the text: what change detection and the checks need.
STATE_COLUMNS = ["doc_id", "source_path", "content_hash", "parse_error", "file_sig", "sensitivity", "deleted",
                 "label_problem"]
# Text can be large (one 50 MB document, a library of them): 64-bit offsets.
_LARGE = frozenset({"text"})


def _sig(st: os.stat_result) -> str:
    # ctime and inode too: an edit that keeps size and mtime (``cp -p``, ``touch -r``)
    # still changes ctime, which no user tool can set back.
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}"


def _sidecar_state(path: str) -> tuple[str, str]:
    """(stat signature, content) of a sidecar; content is a hash of its bytes, or what
    stands in for them: ``unresolvable`` (dangling link), the file type (directory, FIFO,
    too large), ``unreadable``, or ``-`` when there is none. Sidecars are small and carry
    the labels, so they are read on every scan.

    Never raises and never blocks: a dangling link, a directory, a FIFO or an unreadable
    file gets a signature of what can be seen (the link itself), and the document reader
    then withholds that one document instead of the scan failing the whole library.
    """
    try:
        st = os.stat(path)
    except OSError:
        try:
            return _sig(os.lstat(path)), "unresolvable"
        except OSError:
            return "", "-"
    if not stat.S_ISREG(st.st_mode) or st.st_size > max_file_bytes():
        return _sig(st), f"{stat.S_IFMT(st.st_mode):o}"
    try:
        digest = hashlib.sha1(Path(path).read_bytes()).hexdigest()[:16]
    except OSError:
        digest = "unreadable"
    return _sig(st), digest


def _sidecar_sig(path: str) -> str:
    """Stat signature plus the content of a sidecar (``-``: none)."""
    sig, content = _sidecar_state(path)
    return f"{sig}:{content}" if sig else content


def _link_note(path: str, folder: Path) -> str:
    """Where a symlink points, relative to the library folder ('' for a plain file): the
    reader refuses a link leaving the library, so re-pointing one is a change of content."""
    if not os.path.islink(path):
        return ""
    return "->" + os.path.relpath(os.path.realpath(path), os.path.realpath(folder))


def _bytes_digest(path: str) -> str:
    """A hash of a document's bytes (streamed), or why they cannot be read."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"unresolvable:{exc.errno}"
    if not stat.S_ISREG(st.st_mode):
        return f"type:{stat.S_IFMT(st.st_mode):o}"
    if st.st_size > max_file_bytes():  # refused by the parser whatever it holds: not read
        return f"too_large:{st.st_size}"
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
    except OSError as exc:
        return f"unreadable:{exc.errno}"
    return h.hexdigest()


def content_key(path: str, folder: Path, links: str = "", view: CorpusView | None = None) -> str:
    """What a document's row is built from, as one hash: the document's bytes (front
    matter and HTML meta labels included), its sidecar's bytes, whether each could be
    read, where a link points and, for a link, its target's sidecar (the link takes the
    stricter label). Equal keys parse to equal rows; any change of a label's source or
    of its readability changes the key, so it is never skipped as unchanged."""
    side = str(sidecar_path(Path(path)))
    parts = [_link_note(path, folder), _bytes_digest(path), _link_note(side, folder), _sidecar_state(side)[1]]
    # Issue 42: sidecars named in another case or as <file>.<ext>.meta.json, and the
    # sidecars of the file's other names (hard links), label it too.
    parts.extend(f"{o.name}={_sidecar_state(str(o))[1]}" for o in find_sidecars(Path(path), view).odd)
    parts.extend(_hard_link_notes(path, links))
    if os.path.islink(path):
        target = os.path.realpath(path)
        parts.append(_sidecar_state(os.path.splitext(target)[0] + SIDECAR_SUFFIX)[1])
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:32]


def _hard_link_notes(path: str, links: str) -> list[str]:
    """For a file with several names: its link count and ``links``, the scan's digest of
    its other names in the library and their sidecars (the reader gives every name the
    strictest label of all of them, and refuses a file linked from another library)."""
    try:
        st = os.lstat(path)
    except OSError:
        return []
    return [f"nlink:{st.st_nlink}", links] if stat.S_ISREG(st.st_mode) and st.st_nlink > 1 else []


def _link_target_sig(path: str) -> str:
    """The signature of a linked document's *target's* sidecar: the link takes the
    stricter of both labels, so relabelling the target must re-read the link too."""
    target = os.path.realpath(path)
    return _sidecar_sig(os.path.splitext(target)[0] + SIDECAR_SUFFIX)


def _doc_sig(entry: os.DirEntry) -> str:
    try:
        return _sig(entry.stat())
    except OSError as exc:  # gone or unreadable since the listing: the reader reports it
        return f"unreadable:{exc.errno}"


def scan_library(folder: Path, folder_errors: list[str] | None = None) -> dict[str, str]:
    """source_path -> signature of every supported file under ``folder`` (recursive).

    The signature is size, mtime, ctime and inode of the file, and of its ``.meta.json``
    sidecar plus a hash of the sidecar's bytes (for a linked file, of its target's sidecar
    too): one ``scandir`` pass, one stat per file, and only the (small) sidecars are read. A subfolder that cannot be listed is skipped
    (its documents count as gone, so none of them is served) and named in
    ``folder_errors``: one unreadable folder must not stop the library's build.
    """
    if not folder.is_dir():
        raise WarehouseError(f"library folder not found: {folder}")
    found: dict[str, str] = {}
    inodes: dict[tuple[int, int], list[str]] = {}
    suffixes = frozenset(SUFFIXES)
    stack = [str(folder)]
    while stack:
        d = stack.pop()
        docs, sidecars, odd_sidecars = [], {}, {}
        try:
            with os.scandir(d) as it:
                entries = list(it)
        except OSError as exc:
            if d == str(folder):
                raise
            if folder_errors is not None:
                folder_errors.append(f"{relative_name(d, folder)}/: cannot list folder "
                                     f"({exc.strerror or type(exc).__name__}); its documents are withheld")
            continue
        for e in entries:
            name = e.name
            if name[0] == ".":
                continue
            dot = name.rfind(".")
            ext = name[dot:].lower() if dot > 0 else ""
            if ext in suffixes and e.is_file():
                docs.append((e, name[:dot]))
            elif ext == ".json" and name.endswith(SIDECAR_SUFFIX):
                sidecars[name[: -len(SIDECAR_SUFFIX)]] = e
            elif is_sidecar_name(name):  # K8.META.JSON: read as k8's sidecar, and reported
                odd_sidecars[fold_name(name)] = e
            elif e.is_dir(follow_symlinks=False):
                stack.append(e.path)
        by_fold = dict(odd_sidecars)
        by_fold.update({fold_name(stem + SIDECAR_SUFFIX): e for stem, e in sidecars.items()})
        owned: set[str] = set()
        for e, stem in docs:
            side = sidecars.get(stem)
            sig = f"{_doc_sig(e)}|{_sidecar_sig(side.path) if side is not None else '-'}"
            bases = sidecar_bases(Path(e.path))
            owned.update(bases)
            odd = [by_fold[b] for b in bases if b in by_fold and by_fold[b] is not side]
            if odd:
                sig += "|" + ",".join(f"{o.name}={_sidecar_sig(o.path)}" for o in odd)
            found[e.path] = f"{sig}|{_link_target_sig(e.path)}" if e.is_symlink() else sig
            _note_inode(e, found, inodes)
        if folder_errors is not None:
            folder_errors.extend(f"{relative_name(x.path, folder)}: metadata sidecar of no document (orphan)"
                                 for key, x in sorted(by_fold.items()) if key not in owned)
    for names in inodes.values():  # one file, several names: each takes every name's label
        if len(names) > 1:
            joined = "|".join(f"{n}:{found[n]}" for n in sorted(names))
            for n in names:
                found[n] = f"{found[n]}{_LINKS}{hashlib.sha1(joined.encode()).hexdigest()[:16]}"
    return dict(sorted(found.items()))


_LINKS = "|links:"  # the part of a scan signature that digests a file's other names


def _note_inode(e: os.DirEntry, found: dict[str, str], inodes: dict[tuple[int, int], list[str]]) -> None:
    """Group the names of a multiply-linked file (the entry's cached stat: no extra call)."""
    try:
        st = e.stat(follow_symlinks=False)
    except OSError:
        return
    if st.st_nlink > 1 and stat.S_ISREG(st.st_mode):
        inodes.setdefault((st.st_dev, st.st_ino), []).append(e.path)


def raw_state(pub: Published | None, *, columns: list[str] | None = None) -> pa.Table | None:
    """The current rows (newest per source_path, tombstones removed) of a raw version."""
    if pub is None:
        return None
    cols = list(columns) if columns is not None else None
    if cols is not None:
        for c in ("source_path", "deleted"):
            if c not in cols:
                cols.append(c)
    table = _read_present(pub, cols) if cols is not None else read_segments(pub, "documents")
    if "deleted" not in table.column_names:  # a table written before tombstones existed
        return table
    return _current_rows(table)


def _read_present(pub: Published, cols: list[str]) -> pa.Table:
    """``cols`` of every segment, each read with the columns it has: a column added later
    (``file_hash``, ``structure``) reads as null in the segments written before it."""
    paths = pub.table_paths("documents")
    if not paths or not all(p.exists() for p in paths):
        return read_segments(pub, "documents", columns=cols)  # its error names what is missing
    parts = []
    for p in paths:
        have = set(pq.read_schema(p).names)
        parts.append(pq.read_table(p, columns=[c for c in cols if c in have]))
    return parts[0] if len(parts) == 1 else pa.concat_tables(parts, promote_options="permissive")


def _row(doc: Document | None, error: DocumentError | None, *, doc_id: str, source_path: str, sig: str,
         version: str, key: str | None = None, deleted: bool = False) -> dict:
    return {"doc_id": doc_id, "title": doc.title if doc else "", "text": doc.text if doc else None,
            "metadata": json.dumps(doc.metadata, ensure_ascii=False, sort_keys=True) if doc else "{}",
            "sensitivity": doc.metadata["sensitivity"] if doc else None,
            "source_path": source_path, "content_hash": doc.content_hash if doc else None,
            "parse_error": error.error if error else None, "file_sig": sig, "file_hash": key, "deleted": deleted,
            "raw_version": version, "label_problem": (doc.label_problem or None) if doc else None,
            # Parser structure marks as JSON; rows written before this column read as ().
            "structure": structure_to_json(doc.structure, doc.anchors) if doc else None}


def _rows_table(rows: list[dict]) -> pa.Table:
    def typ(c: str) -> pa.DataType:
        return pa.bool_() if c == "deleted" else pa.large_string() if c in _LARGE else pa.string()
    return pa.table({c: pa.array([r[c] for r in rows], typ(c)) for c in RAW_COLUMNS})


def relative_name(path: str, folder: Path) -> str:
    """A file's path relative to its library folder: how messages name it."""
    try:
        return Path(path).relative_to(folder).as_posix()
    except ValueError:
        return Path(path).name


class _Known(NamedTuple):
    """What the current row of one file says (the fields change detection and the metadata need)."""

    doc_id: str
    sig: str
    error: str | None
    sensitivity: str | None
    label_problem: str | None
    key: str | None  # content_key when the row was written (None: a row from before content keys)


def _current_map(pub: Published | None) -> dict[str, _Known] | None:
    """source_path -> what the current row of that file says, for a raw version."""
    state = raw_state(pub, columns=[*STATE_COLUMNS, "file_hash"])
    if state is None or "file_sig" not in state.column_names or "label_problem" not in state.column_names:
        return None  # nothing yet, or a table written before signatures/labels: parse everything once
    n = state.num_rows
    cols = [state.column(c).to_pylist() if c in state.column_names else [None] * n
            for c in ("source_path", "doc_id", "file_sig", "parse_error", "sensitivity", "label_problem",
                      "file_hash")]
    # One tuple per file through _make (no per-row star-unpacking list): half the time at 50k files.
    return dict(zip(cols[0], map(_Known._make, zip(*cols[1:], strict=True)), strict=True))


@dataclass
class RawPlan:
    """What a refresh of one library must (re)parse, from the disk and the current rows."""

    files: dict[str, str]  # source_path -> signature (scan_library)
    todo: list[str]  # new files and files whose content changed: parsed and written
    gone: list[str]  # files that vanished: a tombstone each
    keys: dict[str, str]  # content_key of each file whose signature changed
    touched: int  # files whose signature changed but content did not: nothing written
    folder_errors: list[str] = field(default_factory=list)


def plan_refresh(folder: Path, known: dict[str, _Known]) -> RawPlan:
    """Compare the folder with the current rows: the cheap signature first, then, only for
    files whose signature changed, the content key. A file only touched (same bytes, same
    sidecar, same readability) is left as it is: it publishes nothing."""
    folder_errors: list[str] = []
    files = scan_library(folder, folder_errors)
    stale = [p for p, sig in files.items() if p not in known or known[p].sig != sig]
    view = CorpusView(folder, SUFFIXES)  # each folder listed once for the odd sidecars
    keys = {p: content_key(p, folder, files[p].rpartition(_LINKS)[2] if _LINKS in files[p] else "", view)
            for p in stale}
    todo = [p for p in stale if p not in known or known[p].key is None or known[p].key != keys[p]]
    gone = [p for p in known if p not in files]
    return RawPlan(files, todo, gone, keys, len(stale) - len(todo), folder_errors)


def refresh_reason(wh: VersionedTables, corpus_root: Path, library: str) -> str | None:
    """Why a refresh of ``library`` would publish something, or None when the warehouse
    already serves what is on disk (the sensor's test on its first look at a library).

    ``not built``: no raw version yet; ``files changed``: a file is new, gone, or changed
    in content; ``not published``: the latest raw version is not the one the latest
    snapshot names (a refresh stopped half way)."""
    prev = wh.latest(RAW, library)
    known = _current_map(prev)
    if prev is None or known is None:
        return "not built"
    plan = plan_refresh(Path(corpus_root) / library, known)
    if plan.todo or plan.gone:
        return "files changed"
    snap = wh.latest(SNAPSHOT, library)
    if snap is None or snap.manifest["metadata"].get("raw_documents") != prev.version:
        return "not published"
    return None


@library_step
def build_raw_documents(wh: VersionedTables, corpus_root: Path, library: str, *, rescan: bool = False,
                        folder: Path | None = None) -> StepResult:
    """``folder``: the library's folder when it is not ``corpus_root / library`` (``ragspine
    index PATH --library NAME``: PATH is library NAME; symlinks stay bounded by ``corpus_root``)."""
    t0 = time.perf_counter()
    folder = Path(folder) if folder is not None else Path(corpus_root) / library
    prev = wh.latest(RAW, library)
    known = None if rescan else _current_map(prev)
    whole = known is None
    known = known or {}
    plan = plan_refresh(folder, known)
    files, todo, gone = plan.files, plan.todo, plan.gone
    version_hint = f"v{(int(prev.version[1:]) + 1) if prev else 1:06d}"
    owner = {v.doc_id: p for p, v in known.items() if not v.error and p not in gone}
    rows: list[dict] = []
    n_new = n_changed = 0
    view = CorpusView(Path(corpus_root), SUFFIXES)  # folders listed once; the corpus walked once if a file has several names
    for p in todo:
        path = Path(p)
        doc_id = f"{library}/{path.stem}"
        n_changed += p in known
        n_new += p not in known
        cell = {"source_path": p, "sig": files[p], "key": plan.keys[p], "version": version_hint}
        try:
            doc = read_document(path, library, root=Path(corpus_root), folder=folder, view=view)
        except CorpusError as exc:
            rows.append(_row(None, DocumentError(p, str(exc)), doc_id=doc_id, **cell))
            continue
        other = owner.get(doc.doc_id)
        if other is not None and other != p and other in files:
            err = DocumentError(p, f"duplicate document id {doc.doc_id!r}: {relative_name(other, folder)} "
                                   f"already has it")
            rows.append(_row(None, err, doc_id=doc_id, **cell))
            continue
        owner[doc.doc_id] = p
        rows.append(_row(doc, None, doc_id=doc.doc_id, **cell))
    for p in gone:
        rows.append(_row(None, None, doc_id=known[p].doc_id, source_path=p, sig="", version=version_hint,
                         deleted=True))
    # The library's current state after this refresh, for the metadata (no re-read).
    current = {p: v for p, v in known.items() if p in files}
    for r in rows:
        if not r["deleted"]:
            current[r["source_path"]] = _Known(r["doc_id"], r["file_sig"], r["parse_error"], r["sensitivity"],
                                               r["label_problem"], r["file_hash"])
    errors = sorted((p, v.error) for p, v in current.items() if v.error)
    failed = [f"{relative_name(p, folder)}: {e}" for p, e in errors] + plan.folder_errors
    label_problems = sorted((relative_name(p, folder), v.label_problem) for p, v in current.items()
                            if not v.error and v.label_problem)
    counts = {"documents": len(current) - len(errors), "parse_failures": len(failed),
              "restricted_documents": _count_restricted(v.sensitivity for v in current.values() if not v.error),
              "label_problems": len(label_problems)}
    meta = {"parsed": len(todo), "new_files": n_new, "changed_files": n_changed, "deleted_files": len(gone),
            "touched_unchanged": plan.touched, **counts, "failed_files": failed[:100],
            "invalid_labels": [f"{p}: {e}" for p, e in label_problems[:100]]}
    if prev is not None and not rows and not rescan:
        pub = prev  # nothing changed in content: keep the published version
    elif prev is None or whole:
        pub = wh.write(RAW, library, {"documents": _rows_table([r for r in rows if not r["deleted"]])}, meta)
    else:
        pub = wh.write(RAW, library, {"documents": Append(_rows_table(rows), compact=_current_rows)}, meta, parent=prev)
    md = {**meta, "failed_files": failed,
          "invalid_labels": [f"{p}: {e}" for p, e in label_problems],
          "previous_version": prev.version if prev else None, "version": pub.version,
          "reused": prev is not None and pub.version == prev.version,
          "bytes_written": 0 if pub is prev else pub.manifest.get("bytes_written", 0),
          "seconds": round(time.perf_counter() - t0, 3)}
    checks = {
        # A file that fails to parse is withheld from serving until it parses again (see
        # chunk_tables): the check names every such file.
        "parse_failures_zero": CheckOutcome(not failed, {"failures": len(failed), "files": md["failed_files"]}),
        "sensitivity_labels_valid": CheckOutcome(not label_problems, {"invalid": len(label_problems),
                                                                      "files": md["invalid_labels"]}),
    }
    return StepResult(pub, md, checks)


def _count_restricted(labels: Iterable[str | None]) -> int:
    """How many of ``labels`` are restricted, ``is_restricted`` judged once per distinct
    label (a library has a handful; it was a call per document on every refresh)."""
    counts = Counter(labels)
    return sum(n for label, n in counts.items() if is_restricted(label))


def _current_rows(t: pa.Table) -> pa.Table:
    """Compaction of the documents table: the newest row per file, tombstones dropped."""
    cur = last_row_per_key(t, "source_path")
    return cur.filter(pc.invert(pc.fill_null(cur.column("deleted"), False)))


def raw_delta(pub: Published, since: list[str] | None) -> tuple[pa.Table, bool]:
    """The current-state rows a consumer has not seen yet, and whether that is a delta.

    ``since`` is the segment list of the raw version the consumer last read. When the
    current version only appended segments to it, the unseen rows are exactly those
    segments' rows (newest per file; tombstones kept, so withdrawals are seen); otherwise
    (a rescan, a compaction, no previous read) every current row is returned.
    """
    segs = pub.segments("documents")
    if since is not None and len(since) <= len(segs) and segs[: len(since)] == since:
        paths = pub.table_paths("documents")[len(since):]
        if not paths:
            return pa.table({c: pa.array([], pa.bool_() if c == "deleted" else pa.string()) for c in STATE_COLUMNS}), True
        parts = [pq.read_table(p, columns=STATE_COLUMNS) for p in paths]
        return last_row_per_key(pa.concat_tables(parts, promote_options="permissive"), "source_path"), True
    return raw_state(pub, columns=STATE_COLUMNS), False


def table_documents(t: pa.Table) -> tuple[list[Document], list[DocumentError]]:
    """Rows of the documents table (current rows) as Documents and parse failures."""
    docs, errors = [], []
    for r in t.to_pylist():
        if r.get("deleted"):
            continue
        if r["parse_error"]:
            errors.append(DocumentError(r["source_path"], r["parse_error"]))
        else:
            docs.append(Document(r["doc_id"], r["title"], r["text"], json.loads(r["metadata"]), r["source_path"],
                                 r.get("label_problem") or "", structure_from_json(r.get("structure")),
                                 anchors_from_structure_json(r.get("structure"))))
    return docs, errors


def fetch_documents(pub: Published, source_paths: set[str]) -> list[Document]:
    """The current Documents for ``source_paths``, reading segments newest first and only
    the segments that hold one of them (after a 1% refresh: just the newest segment)."""
    wanted = set(source_paths)
    found: dict[str, dict] = {}
    for path in reversed(pub.table_paths("documents")):
        if not wanted:
            break
        keys = pq.read_table(path, columns=["source_path"]).column("source_path").to_pylist()
        hit = [i for i, k in enumerate(keys) if k in wanted]
        if not hit:
            continue
        rows = pq.read_table(path).take(pa.array(hit, pa.int64())).to_pylist()
        for r in reversed(rows):  # a segment holds one row per path; newest wins anyway
            if r["source_path"] in wanted:
                found[r["source_path"]] = r
                wanted.discard(r["source_path"])
    # Every row with every column: a row from a segment written before a column existed
    # must not make from_pylist drop that column for the others.
    rows = [{**dict.fromkeys(RAW_COLUMNS), **r} for r in found.values()]
    docs, _ = table_documents(pa.Table.from_pylist(rows)) if rows else ([], [])
    return docs
