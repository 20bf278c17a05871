"""What every benchmark script shares: where data comes from and where results go.

* ``--data DIR`` (or ``RAGSPINE_BENCH_DATA``; default ``../shared/eval`` beside the
  repository): the BEIR-layout sets. A missing set is one line naming the expected path
  (exit code 2) before anything runs, never a traceback half-way through.
* ``--out DIR``: where the JSON/markdown/PNG results go. The default is
  ``benchmarks/out/`` (git-ignored by a ``.gitignore`` written into it), so a run from a
  fresh clone never overwrites the committed ``benchmarks/results/``; pass
  ``--out benchmarks/results`` to update those on purpose.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path

from ragspine_pipeline import settings

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "eval"
COMMITTED_RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_OUT = ROOT / "benchmarks" / "out"
DATA_ENV = "RAGSPINE_BENCH_DATA"


def data_root() -> Path:
    """``--data`` (handed to workers as $RAGSPINE_BENCH_DATA), else ../shared/eval."""
    return Path(settings.get(DATA_ENV) or DEFAULT_DATA)


def add_io_args(ap, *, data: bool = True) -> None:
    """``--out`` (and ``--data`` for scripts that read the shared sets)."""
    if data:
        ap.add_argument("--data", default=None, help=f"folder of BEIR-layout sets (default ${DATA_ENV} or "
                        f"{DEFAULT_DATA})")
    ap.add_argument("--out", default=None, help=f"results folder (default {DEFAULT_OUT.relative_to(ROOT)}/, "
                    f"git-ignored; --out {COMMITTED_RESULTS.relative_to(ROOT)} updates the committed results)")


def fail(message: str) -> None:
    """One line on stderr, exit code 2."""
    print(f"{Path(sys.argv[0]).name}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def use_data(arg: str | None) -> Path:
    """The data root chosen by ``--data``; exported so worker subprocesses see it too."""
    root = Path(arg) if arg else data_root()
    os.environ[DATA_ENV] = str(root)
    return root


def require_sets(root: Path, names: Iterable[str]) -> None:
    for name in names:
        if not (root / name).is_dir():
            fail(f"no dataset folder at {root / name} (BEIR layout: corpus.jsonl, queries.jsonl, qrels/); "
                 f"pass --data DIR or set {DATA_ENV}")


def out_dir(arg: str | None) -> Path:
    """The results folder, created; the default one is git-ignored."""
    out = Path(arg) if arg else DEFAULT_OUT
    out.mkdir(parents=True, exist_ok=True)
    if out.resolve() == DEFAULT_OUT.resolve() and not (out / ".gitignore").exists():
        (out / ".gitignore").write_text("*\n", encoding="utf-8")
    return out


def say_written(paths: Iterable[Path]) -> None:
    print("results written: " + ", ".join(str(p) for p in paths), file=sys.stderr)
