"""Write docs/spec-names.md: every public name the product spec gives, and where it lives here.

The spec (``../shared/spec/000_*.txt`` beside the checkout, or ``--spec PATH``) names
classes, functions, constants, methods and ``RAGSPINE_*`` variables, with module paths
under ``ragspine.`` (``ragspine_pipeline.`` here). This script reads those names from the
spec text (``spec_names``), finds each one's import path in ``ragspine_pipeline`` by
importing it (the module of the spec section it appears in first, then every module the
spec names, then the few modules the spec gives no path for), and writes the page. A
name that cannot be imported fails the run, unless it is one of ``OUTSIDE`` (names the
spec defines outside this package). ``--check``: exit 1 when the page is stale.
tests/test_spec_deviations.py fails when a spec name is missing from the page or a row
does not import.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET = ROOT / "docs" / "spec-names.md"
SPEC_GLOB = "000_*.txt"
SPEC_DIRS = (ROOT.parent / "shared" / "spec", ROOT / "spec")

# Capitalised words of the spec that are techniques, products or Python's own names, not
# names of this API.
NOT_NAMES = frozenset({"ColBERT", "ColPali", "GraphRAG", "HyDE", "MaxSim", "MiniLM", "LLMLingua", "RAGSpine",
                       "SQLite", "ValueError", "ACME_CN", "max", "str", "chunk_db", "chunk_id"})
# Names the spec defines outside this package: (where, what stands for it here).
OUTSIDE = {
    "NarrativeRetriever": ("the agent's contract (the spec: agent/agent.py, the agent side)",
                           "`NarrativeIndexRetriever.retrieve` implements it"),
    "NodePostprocessor": ("LlamaIndex's term for a post-retrieval step",
                          "`ragspine_pipeline.retrieval.postprocess.Postprocessor` (chains: `make_postprocessor`)"),
}
# Modules of names the spec gives without a module path.
EXTRA_MODULES = (
    "ragspine_pipeline.retrieval.link.multi_index",
    "ragspine_pipeline.retrieval.chunking.contextual",
    "ragspine_pipeline.retrieval.raptor",
    "ragspine_pipeline.retrieval.query",
    "ragspine_pipeline.graph.store",
    "ragspine_pipeline.graph.relations",
    "ragspine_pipeline.graph.step",
    "ragspine_pipeline.llm.provider",
)
# Methods the spec names in words, not as calls ("upsert / query / delete / count").
WORDED_METHODS = {"VectorStore": ("upsert", "query", "delete", "count"), "ChunkStore": ("execute_read",)}


@dataclass(frozen=True)
class Row:
    name: str
    kind: str
    where: str  # the import path (module for a top-level name, module.Class for a method)
    defined: str  # the module that defines it ("" where the same, or for variables)
    note: str = ""


def find_spec(path: str | None = None) -> Path | None:
    if path:
        return Path(path)
    for d in SPEC_DIRS:
        found = sorted(d.glob(SPEC_GLOB)) if d.is_dir() else []
        if found:
            return found[0]
    return None


def _module_of_path(p: str) -> str:
    """``chunking/chunk_store.py`` -> ``ragspine_pipeline.retrieval.chunking.chunk_store``."""
    return "ragspine_pipeline.retrieval." + p.removesuffix(".py").replace("/", ".")


def spec_names(text: str) -> dict[str, list[str]]:
    """Every API name in the spec text -> the spec modules in force where it appears, in
    order (the module a section's text last named before the name; a name in a code
    block's ``from X import Y`` gets X). Variables map to ``[]``."""
    pattern = re.compile(
        r"from (?P<imp_mod>ragspine[\w.]*) import (?P<imp>\w+)"
        r"|(?P<dotted>\bragspine(?:\.[a-z_]+)+)"
        r"|(?P<file>\b[a-z_]+/[a-z_]+\.py\b)"
        r"|(?P<var>\bRAGSPINE_[A-Z0-9_]+\*?)"
        r"|(?P<method>\b[A-Z]\w+\.[a-z_]\w*)\("
        r"|(?P<const>\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b)"
        r"|(?<![\w./-])(?P<camel>[A-Z][A-Za-z0-9]+)\b"
        r"|(?<![\w.])(?P<call>[a-z][a-z0-9_]*)\("
        r"|(?<![\w./-])(?P<factory>(?:make|build)_[a-z0-9_]+)\b")
    names: dict[str, list[str]] = {}
    current = ""
    last_class = ""  # the class a lowercase call nearby most likely belongs to (``class:X`` hints)

    def add(name: str, module: str) -> None:
        if name in NOT_NAMES:
            return
        mods = names.setdefault(name, [])
        if module and module not in mods:
            mods.append(module)

    for m in pattern.finditer(text):
        kind = m.lastgroup
        value = m.group(kind)
        if kind == "imp":
            add(value, m.group("imp_mod").replace("ragspine.", "ragspine_pipeline.", 1))
        elif kind == "dotted":
            current = value.replace("ragspine.", "ragspine_pipeline.", 1)
        elif kind == "file":
            current = _module_of_path(value)
        elif kind == "var":
            names.setdefault(value, [])
        elif kind == "method":
            add(value, current)
        elif kind == "camel":
            if sum(c.isupper() for c in value) >= 2 and any(c.islower() for c in value):
                add(value, current)
                last_class = value if value not in NOT_NAMES else last_class
        elif kind == "call":
            add(value, current)
            if last_class and value in names:
                add(value, f"class:{last_class}")
        elif kind in ("const", "factory"):
            add(value, current)
    for cls, methods in WORDED_METHODS.items():
        for meth in methods:
            add(f"{cls}.{meth}", "")
    return names


def _import(module: str) -> object | None:
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def resolve(names: dict[str, list[str]]) -> list[Row]:
    """One row per spec name; a name not importable (and not in ``OUTSIDE``) is an error."""
    from ragspine_pipeline.settings import REGISTRY

    spec_modules = list(dict.fromkeys(m for mods in names.values() for m in mods if not m.startswith("class:")))
    rows: list[Row] = []
    classes: dict[str, tuple[str, type]] = {}
    missing: list[str] = []
    pending_methods: list[tuple[str, list[str]]] = []
    for name, mods in names.items():
        if name.startswith("RAGSPINE_"):
            declared = sorted(n for n in REGISTRY if n == name or (name.endswith("*") and
                                                                    n.startswith(name.rstrip("*"))))
            if not declared:
                missing.append(name)
            rows.append(Row(name, "variable", "ragspine_pipeline.settings", "",
                            ", ".join(declared) if name.endswith("*") else ""))
            continue
        if name in OUTSIDE:
            where, instead = OUTSIDE[name]
            rows.append(Row(name, "outside", "", "", f"{where}; here: {instead}"))
            continue
        if "." in name or name.islower() and not name.startswith(("make_", "build_")):
            pending_methods.append((name, mods))  # a method, or a function: tried after the classes
            continue
        row = _find(name, [*mods, *spec_modules, *EXTRA_MODULES])
        if row is None:
            missing.append(name)
            continue
        rows.append(row)
        if row.kind in ("class", "protocol"):
            classes[name] = (row.where, getattr(_import(row.where), name))
    for name, mods in pending_methods:
        cls_name, _, meth = name.rpartition(".")
        hints = [m.removeprefix("class:") for m in mods if m.startswith("class:")]
        mods = [m for m in mods if not m.startswith("class:")]
        row = None if cls_name else _find(name, [*mods, *spec_modules, *EXTRA_MODULES])
        if row is None:
            owners = [cls_name] if cls_name else list(dict.fromkeys([*hints, *classes]))
            for owner in owners:
                mod, cls = classes.get(owner, ("", None))
                if cls is not None and hasattr(cls, meth):
                    row = Row(f"{owner}.{meth}", "method", f"{mod}.{owner}", "")
                    break
        if row is None:
            missing.append(name)
        else:
            rows.append(row)
    if missing:
        raise SystemExit(f"spec names not importable from ragspine_pipeline: {', '.join(sorted(missing))}")
    return sorted(rows, key=lambda r: (r.kind == "variable", r.name.lower()))


def _find(name: str, modules: list[str]) -> Row | None:
    for module in dict.fromkeys(modules):
        mod = _import(module)
        if mod is None or not hasattr(mod, name):
            continue
        obj = getattr(mod, name)
        if inspect.isclass(obj):
            kind = "protocol" if getattr(obj, "_is_protocol", False) else "class"
        elif callable(obj):
            kind = "function"
        else:
            kind = "constant"
        defined = getattr(obj, "__module__", "") if kind != "constant" else ""
        return Row(name, kind, module, "" if defined == module else defined)
    return None


HEADER = """# Spec names

Every public name the product spec gives (its `ragspine.` prefix is `ragspine_pipeline.`
here) and the module it imports from in this package. The table is generated by
`python tools/gen_spec_names.py` from the spec's own text (`--check`: exit 1 when this page
is stale); `tests/test_spec_deviations.py` fails when a spec name is missing here or a row
does not import. "Defined in" names the module that holds the code when the spec's path
re-exports it.

"""

DEVIATIONS = """
## Where this package differs from the spec, and why

**The chunk store is DuckDB; the spec's SQLite store is migrated.** `ChunkStore(path)` on
an existing SQLite file (the spec's table `narrative_chunk`, one column per `StoredChunk`
field) reads it through Python's `sqlite3` over a read-only URI (the file is never written;
DuckDB's `sqlite_scanner` is never loaded, it would download itself) and writes the DuckDB
store beside it, `<path>.duckdb`, which later opens use. An older SQLite schema without
`parent_id`, `heading`, `window_text`, `parent_locator` and `chunker` migrates additively
(those read as the `StoredChunk` defaults). The file is **re-read when it changes**: its
stamp (the header's file change counter, and size, `mtime_ns` and inode of the file and of
its `-wal`) is recorded at migration and compared on every open and before every
`iter_chunks`; on a change, each document of the file replaces its rows in the store,
unless the store holds a newer version of it (written or withdrawn through
`replace_doc_chunks` after the migration); documents only the store has are kept, and
rows deleted from the file are not deleted (the store never deletes rows). A read-only
open cannot write the store: it serves the migrated rows and logs a warning.
(`ragspine_pipeline.retrieval.chunking.sqlite_migration`.)

**`build_narrative_retriever` reads the preset variables.** It honours
`RAGSPINE_RETRIEVAL_MODE` and `RAGSPINE_EMBEDDING_BACKEND` (alias `RAGSPINE_EMBEDDING`);
a bad value, or the two embedding names set to different specs, is one `SettingsError`
before the store is opened. `economy`/`bm25`/`lexical` build no backend (an injected one
is left unused); `auto` uses the injected backend, else the one the variable names, and
with neither keeps the spec's library default (no vector backend, pure BM25 + RRF);
`hybrid`/`vector` use the injected backend or the variable's spec (default `auto`), and
a `SettingsError` when none can be built.

**One embedding call per search.** A backend without `model_id` is identified (for the
snippets' fusion report and the warehouse's same-model check) by embedding a probe text;
that is done once per backend object, not on every search.

**Fan-out ceilings of the query layers.** Each layer multiplies the base searches of one
question, so each has a ceiling; a configured value past it is an error (never clamped in
silence), and what an injected layer returns past it is dropped and listed under the
result report's `degraded`:

| Layer | Ceiling | Past it |
|---|---|---|
| Decomposition (`RAGSPINE_QUERY_DECOMPOSE=llm:N`) | N from 1 to 8 (`decompose.MAX_SUBQUESTIONS`; default 4) | `SettingsError`; an injected decomposer's extra sub-questions dropped |
| RAG-Fusion / HyDE / step-back variants | 8 besides the original (`transforms.MAX_VARIANTS`; HyDE and step-back make 1) | `ValueError` for `RAGFusion(max_variants=...)`; extra variants dropped |
| Glossary multi-query (`GlossaryQueryRewriter(max_queries=5)`) | 16 (`glossary.MAX_QUERIES`) | `ValueError` |
| Corrective retrieval (CRAG) | 2 rounds (`corrective.MAX_ROUNDS`, the spec's ≤ 2) | `ValueError` |
| All layers together, one question | 64 base searches (`pipeline.MAX_SEARCHES`) | the rest skipped, reported once as `fan_out` |

`RAGSPINE_QUERY_DECOMPOSE=llm:1000` once ran 301 searches for one question; it is now
refused when the service is assembled.
"""


def render(rows: list[Row]) -> str:
    out = [HEADER, "## Names\n\n| Name | Kind | Import from | Defined in |\n|---|---|---|---|\n"]
    for r in rows:
        if r.kind in ("variable", "outside"):
            continue
        out.append(f"| `{r.name}` | {r.kind} | `{r.where}` | {f'`{r.defined}`' if r.defined else ''} |\n")
    out.append("\n## Not in this package\n\n| Name | Where the spec puts it | Here |\n|---|---|---|\n")
    for r in rows:
        if r.kind == "outside":
            where, instead = OUTSIDE[r.name]
            out.append(f"| `{r.name}` | {where} | {instead} |\n")
    from ragspine_pipeline.settings import REGISTRY

    out.append("\n## Environment variables\n\nEach is declared in the settings registry "
               "(`ragspine_pipeline.settings`); defaults, accepted values and the spec section "
               "are in [Configuration](configuration.md).\n\n| Variable | Group | What |\n|---|---|---|\n")
    for r in rows:
        if r.kind == "variable":
            for name in r.note.split(", ") if r.note else [r.name]:
                s = REGISTRY[name]
                group = f"[{s.group}](configuration.md#{s.group.replace(' ', '-')})"
                out.append(f"| `{name}` | {group} | {s.doc} |\n")
    out.append(DEVIATIONS)
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spec", default=None, help=f"the spec text (default: {SPEC_GLOB} under {SPEC_DIRS[0]})")
    p.add_argument("--check", action="store_true", help="only compare; exit 1 when the page is stale")
    p.add_argument("--out", type=Path, default=TARGET)
    args = p.parse_args(argv)
    spec = find_spec(args.spec)
    if spec is None or not spec.is_file():
        print("the spec text was not found; pass --spec PATH", file=sys.stderr)
        return 2
    text = render(resolve(spec_names(spec.read_text(encoding="utf-8"))))
    current = args.out.read_text(encoding="utf-8") if args.out.is_file() else ""
    if args.check:
        if current != text:
            print(f"{args.out} is stale: run python tools/gen_spec_names.py", file=sys.stderr)
            return 1
        return 0
    if current != text:
        args.out.write_text(text, encoding="utf-8")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
