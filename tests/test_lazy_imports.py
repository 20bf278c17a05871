"""Function-level imports in the engine say why they are lazy (issue 46 item 3).

An import inside a function hides a dependency from the module's header and, when it only
dodges an import cycle, hides a design fault. The rule: a module imports at its top; an
import stays inside a function only where a heavy or optional dependency (onnxruntime,
fastembed, faiss, Ray, FastAPI, networkx, the document parsers, the numba kernel modules
...) is loaded when it is needed, and then it carries a comment starting ``# lazy:`` that
names the dependency and the reason. The comment stands on the import's own line, or in
the comment lines directly above it; imports that follow one another without a blank line
share the first one's comment (``import onnx`` / ``from onnx import helper``).

``ALLOWED`` may name a file mid-rework (empty now: every module follows the rule); an entry
goes once its file follows the rule (the second test says when).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ragspine_pipeline"
MARK = "# lazy:"

# Files not yet under the rule (package-relative); none.
ALLOWED: frozenset[str] = frozenset()


def _function_imports(tree: ast.AST) -> list[tuple[ast.stmt, ast.stmt | None]]:
    """(import, the statement right before it in the same body or None) for every
    ``import``/``from ... import`` inside a function or method, nested ones included."""
    found: list[tuple[ast.stmt, ast.stmt | None]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        inside = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if not isinstance(body, list):
                continue
            prev: ast.stmt | None = None
            for stmt in body:
                if inside and isinstance(stmt, (ast.Import, ast.ImportFrom)):
                    found.append((stmt, prev))
                prev = stmt
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    visit(tree, False)
    return found


def _comment_above(lines: list[str], lineno: int) -> list[str]:
    """The comment lines directly above line ``lineno`` (1-based), nearest last."""
    out: list[str] = []
    i = lineno - 2
    while i >= 0 and lines[i].strip().startswith("#"):
        out.insert(0, lines[i].strip())
        i -= 1
    return out


def unexplained_imports(path: Path, root: Path = PACKAGE.parent) -> list[str]:
    """``file:line: import`` (file relative to ``root``) for each function-level import of
    ``path`` without ``# lazy:``."""
    src = path.read_text(encoding="utf-8")
    lines = src.splitlines()
    ok: dict[int, bool] = {}
    bad: list[str] = []
    for stmt, prev in _function_imports(ast.parse(src)):
        explained = MARK in lines[stmt.lineno - 1] or any(c.startswith(MARK) for c in _comment_above(lines, stmt.lineno))
        if not explained and prev is not None and isinstance(prev, (ast.Import, ast.ImportFrom)):
            # one group of imports, no blank line or comment between: the first one's comment
            explained = prev.end_lineno == stmt.lineno - 1 and ok.get(id(prev), False)
        ok[id(stmt)] = explained
        if not explained:
            bad.append(f"{path.relative_to(root)}:{stmt.lineno}: {lines[stmt.lineno - 1].strip()}")
    return bad


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_function_level_import_says_why_it_is_lazy():
    bad = [line for p in _modules() if p.relative_to(PACKAGE).as_posix() not in ALLOWED
           for line in unexplained_imports(p)]
    assert not bad, ("function-level imports without a '# lazy:' comment (move them to the module top, "
                     "or say which heavy/optional dependency they keep off start-up):\n" + "\n".join(bad))


def test_allow_list_names_only_files_that_still_need_it():
    stale = sorted(rel for rel in ALLOWED
                   if not (PACKAGE / rel).is_file() or not unexplained_imports(PACKAGE / rel))
    assert not stale, f"follow the rule now: remove from ALLOWED in {Path(__file__).name}: {stale}"


def test_the_check_sees_what_it_must(tmp_path):
    """The checker itself: a bare function-level import is reported; a commented one, a
    group under one comment and a module-level import are not."""
    src = tmp_path / "m.py"
    src.write_text(
        "import os\n"
        "def f():\n"
        "    import json\n"
        "    # lazy: onnx, optional\n"
        "    import onnx\n"
        "    from onnx import helper\n"
        "\n"
        "    import numpy  # lazy: as an example\n"
        "    class C:\n"
        "        def g(self):\n"
        "            try:\n"
        "                import faiss\n"
        "            except ImportError:\n"
        "                pass\n",
        encoding="utf-8",
    )
    assert unexplained_imports(src, tmp_path) == ["m.py:3: import json", "m.py:12: import faiss"]
