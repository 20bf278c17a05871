"""BEIR-layout dataset loader: corpus.jsonl, queries.jsonl, qrels/<split>.tsv."""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from pathlib import Path


class DatasetError(ValueError):
    """The dataset folder is missing a file or holds malformed records."""


@dataclass(frozen=True)
class BeirDoc:
    doc_id: str
    title: str
    text: str


@dataclass
class BeirDataset:
    name: str
    corpus: dict[str, BeirDoc]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]  # query id -> doc id -> graded gain

    @property
    def judged_queries(self) -> list[str]:
        """Query ids with at least one relevant (gain > 0) judgment, in id order."""
        return sorted(
            (q for q, rels in self.qrels.items() if q in self.queries and any(g > 0 for g in rels.values())),
            key=_natural_key,
        )


def _natural_key(s: str) -> tuple[int, int | str]:
    return (0, int(s)) if s.isdigit() else (1, s)


def _read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        raise DatasetError(f"missing {path}")
    out = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path}:{lineno}: invalid JSON ({exc})") from None
    return out


def load_beir(folder: str | os.PathLike[str], split: str = "test") -> BeirDataset:
    root = Path(folder)
    if not root.is_dir():
        raise DatasetError(f"dataset folder not found: {root}")
    corpus = {}
    for r in _read_jsonl(root / "corpus.jsonl"):
        did = str(r.get("_id", ""))
        if not did:
            raise DatasetError(f"{root / 'corpus.jsonl'}: record without _id")
        corpus[did] = BeirDoc(did, str(r.get("title") or ""), str(r.get("text") or ""))
    queries = {str(r["_id"]): str(r.get("text") or "") for r in _read_jsonl(root / "queries.jsonl")}
    qpath = root / "qrels" / f"{split}.tsv"
    if not qpath.exists():
        raise DatasetError(f"missing {qpath}")
    qrels: dict[str, dict[str, int]] = {}
    with qpath.open(encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh, delimiter="\t")
        for row in reader:
            if not row or row[0] in ("query-id", "query_id"):
                continue
            if len(row) < 3:
                raise DatasetError(f"{qpath}: expected query-id, corpus-id, score; got {row!r}")
            qrels.setdefault(row[0], {})[row[1]] = int(float(row[2]))
    return BeirDataset(root.name, corpus, queries, qrels)
