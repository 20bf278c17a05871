"""The ``raw_documents`` step: a library folder as an append-only table of document rows.

A refresh stats every file (and its metadata sidecar) and parses only the files whose
signature (size, mtime_ns of file and sidecar) differs from the row that described them
last; files that vanished get a tombstone row. Those rows are appended as one new
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
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..ingest.documents import SIDECAR_SUFFIX, CorpusError, Document, DocumentError, read_document
from ..ingest.parsers import SUFFIXES, max_file_bytes, structure_from_json, structure_to_json
from ..sensitivity import is_restricted
from .common import RAW, CheckOutcome, StepResult, last_row_per_key
from .versioned import (
    Append,
    Published,
    VersionedTables,
    WarehouseError,
    library_step,
    read_segments,
)

RAW_COLUMNS = ("doc_id", "title", "text", "metadata", "sensitivity", "source_path", "content_hash",
               "parse_error", "file_sig", "deleted", "raw_version", "label_problem", "structure")
# Everything but the text: what change detection and the checks need.
STATE_COLUMNS = ["doc_id", "source_path", "content_hash", "parse_error", "file_sig", "sensitivity", "deleted",
                 "label_problem"]
# Text can be large (one 50 MB document, a library of them): 64-bit offsets.
_LARGE = frozenset({"text"})


def _sig(st: os.stat_result) -> str:
    # ctime and inode too: an edit that keeps size and mtime (``cp -p``, ``touch -r``)
    # still changes ctime, which no user tool can set back.
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}"


def _sidecar_sig(path: str) -> str:
    """Stat signature plus a hash of the content: sidecars are small and carry the labels.

    Never raises and never blocks: a dangling link, a directory, a FIFO or an unreadable
    file gets a signature of what can be seen (the link itself), and the document reader
    then withholds that one document instead of the scan failing the whole library.
    """
    try:
        st = os.stat(path)
    except OSError:
        try:
            return f"{_sig(os.lstat(path))}:unresolvable"
        except OSError:
            return "-"
    if not stat.S_ISREG(st.st_mode) or st.st_size > max_file_bytes():
        return f"{_sig(st)}:{stat.S_IFMT(st.st_mode):o}"
    try:
        digest = hashlib.sha1(Path(path).read_bytes()).hexdigest()[:16]
    except OSError:
        digest = "unreadable"
    return f"{_sig(st)}:{digest}"


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
    suffixes = frozenset(SUFFIXES)
    stack = [str(folder)]
    while stack:
        d = stack.pop()
        docs, sidecars = [], {}
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
            elif e.is_dir(follow_symlinks=False):
                stack.append(e.path)
        for e, stem in docs:
            side = sidecars.get(stem)
            sig = f"{_doc_sig(e)}|{_sidecar_sig(side.path) if side is not None else '-'}"
            found[e.path] = f"{sig}|{_link_target_sig(e.path)}" if e.is_symlink() else sig
    return dict(sorted(found.items()))


def raw_state(pub: Published | None, *, columns: list[str] | None = None) -> pa.Table | None:
    """The current rows (newest per source_path, tombstones removed) of a raw version."""
    if pub is None:
        return None
    cols = list(columns) if columns is not None else None
    if cols is not None:
        for c in ("source_path", "deleted"):
            if c not in cols:
                cols.append(c)
    if cols is not None:  # older tables lack some columns: read what is there
        have = set(pq.read_schema(pub.table_paths("documents")[-1]).names)
        cols = [c for c in cols if c in have]
    table = read_segments(pub, "documents", columns=cols)
    if "deleted" not in table.column_names:  # a table written before tombstones existed
        return table
    return _current_rows(table)


def _row(doc: Document | None, error: DocumentError | None, *, doc_id: str, source_path: str, sig: str,
         version: str, deleted: bool = False) -> dict:
    return {"doc_id": doc_id, "title": doc.title if doc else "", "text": doc.text if doc else None,
            "metadata": json.dumps(doc.metadata, ensure_ascii=False, sort_keys=True) if doc else "{}",
            "sensitivity": doc.metadata["sensitivity"] if doc else None,
            "source_path": source_path, "content_hash": doc.content_hash if doc else None,
            "parse_error": error.error if error else None, "file_sig": sig, "deleted": deleted,
            "raw_version": version, "label_problem": (doc.label_problem or None) if doc else None,
            # Parser structure marks as JSON; rows written before this column read as ().
            "structure": structure_to_json(doc.structure) if doc else None}


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


def _current_map(pub: Published | None) -> dict[str, tuple[str, str, str | None, str | None, str | None]] | None:
    """source_path -> (doc_id, file_sig, parse_error, sensitivity, label_problem) of a raw
    version's current rows."""
    state = raw_state(pub, columns=STATE_COLUMNS)
    if state is None or "file_sig" not in state.column_names or "label_problem" not in state.column_names:
        return None  # nothing yet, or a table written before signatures/labels: parse everything once
    cols = [state.column(c).to_pylist()
            for c in ("source_path", "doc_id", "file_sig", "parse_error", "sensitivity", "label_problem")]
    return {p: (d, sig, err, sen, lp) for p, d, sig, err, sen, lp in zip(*cols, strict=True)}


@library_step
def build_raw_documents(wh: VersionedTables, corpus_root: Path, library: str, *, rescan: bool = False,
                        folder: Path | None = None) -> StepResult:
    """``folder``: the library's folder when it is not ``corpus_root / library`` (``ragspine
    index PATH --library NAME``: PATH is library NAME; symlinks stay bounded by ``corpus_root``)."""
    t0 = time.perf_counter()
    folder = Path(folder) if folder is not None else Path(corpus_root) / library
    folder_errors: list[str] = []
    files = scan_library(folder, folder_errors)
    prev = wh.latest(RAW, library)
    known = None if rescan else _current_map(prev)
    whole = known is None
    known = known or {}
    version_hint = f"v{(int(prev.version[1:]) + 1) if prev else 1:06d}"
    todo = [p for p, sig in files.items() if p not in known or known[p][1] != sig]
    gone = [p for p in known if p not in files]
    owner = {v[0]: p for p, v in known.items() if not v[2] and p not in gone}
    rows: list[dict] = []
    n_new = n_changed = 0
    for p in todo:
        path = Path(p)
        doc_id = f"{library}/{path.stem}"
        n_changed += p in known
        n_new += p not in known
        try:
            doc = read_document(path, library, root=Path(corpus_root), folder=folder)
        except CorpusError as exc:
            rows.append(_row(None, DocumentError(p, str(exc)), doc_id=doc_id, source_path=p, sig=files[p],
                             version=version_hint))
            continue
        other = owner.get(doc.doc_id)
        if other is not None and other != p and other in files:
            err = DocumentError(p, f"duplicate document id {doc.doc_id!r}: {relative_name(other, folder)} "
                                   f"already has it")
            rows.append(_row(None, err, doc_id=doc_id, source_path=p, sig=files[p], version=version_hint))
            continue
        owner[doc.doc_id] = p
        rows.append(_row(doc, None, doc_id=doc.doc_id, source_path=p, sig=files[p], version=version_hint))
    for p in gone:
        rows.append(_row(None, None, doc_id=known[p][0], source_path=p, sig="", version=version_hint, deleted=True))
    # The library's current state after this refresh, for the metadata (no re-read).
    current = {p: v for p, v in known.items() if p in files}
    for r in rows:
        if not r["deleted"]:
            current[r["source_path"]] = (r["doc_id"], r["file_sig"], r["parse_error"], r["sensitivity"],
                                         r["label_problem"])
    errors = sorted((p, v[2]) for p, v in current.items() if v[2])
    failed = [f"{relative_name(p, folder)}: {e}" for p, e in errors] + folder_errors
    label_problems = sorted((relative_name(p, folder), v[4]) for p, v in current.items() if not v[2] and v[4])
    counts = {"documents": len(current) - len(errors), "parse_failures": len(failed),
              "restricted_documents": sum(1 for v in current.values() if not v[2] and is_restricted(v[3])),
              "label_problems": len(label_problems)}
    meta = {"parsed": len(todo), "new_files": n_new, "changed_files": n_changed, "deleted_files": len(gone), **counts,
            "failed_files": failed[:100],
            "invalid_labels": [f"{p}: {e}" for p, e in label_problems[:100]]}
    if prev is not None and not rows and not rescan:
        pub = prev  # nothing changed on disk: keep the published version
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
                                 r.get("label_problem") or "", structure_from_json(r.get("structure"))))
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
