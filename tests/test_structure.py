"""Structure (#26 item 4): protocols in the base modules named for them, one copy of the
shared span helpers, and no function-level import that dodges an import cycle.

``lint-imports`` (.importlinter) keeps the arrows one way in CI; these tests say the same
from inside pytest and check what a contract cannot express: that every old import path
still hands out the *same* object, and that no function-level import anywhere in the
engine closes a cycle (a sign the shared piece sits in the wrong room).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from ragspine_pipeline.text_spans import line_spans, trim_span

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ragspine_pipeline"
# Function-level imports that close a cycle: none may exist (the warehouse pairs were
# resolved by moving the RAPTOR asset name to warehouse/common).
KNOWN_CYCLES: set[tuple[str, str]] = set()


def test_protocols_live_in_their_base_modules_and_old_paths_re_export_them():
    from ragspine_pipeline.retrieval import chunking, postprocess, rerank, vector
    from ragspine_pipeline.retrieval.chunking import factory
    from ragspine_pipeline.retrieval.link import narrative_index
    from ragspine_pipeline.retrieval.postprocess import base as post_base
    from ragspine_pipeline.retrieval.rerank import base as rerank_base
    from ragspine_pipeline.retrieval.vector import base as vector_base
    from ragspine_pipeline.retrieval.vector import embedding_backends, onnx_backend

    # the package exports the function listwise_rerank, which hides the module attribute
    listwise_rerank = importlib.import_module("ragspine_pipeline.retrieval.rerank.listwise_rerank")
    assert embedding_backends.EmbeddingBackend is vector_base.EmbeddingBackend is vector.EmbeddingBackend
    assert (embedding_backends.EmbeddingBackendUnavailable is vector_base.EmbeddingBackendUnavailable
            is onnx_backend.EmbeddingBackendUnavailable)
    assert embedding_backends.backend_model_id is vector_base.backend_model_id
    assert embedding_backends.OnnxEmbeddingBackend is onnx_backend.FastEmbedBackend  # no module __getattr__
    assert not hasattr(embedding_backends, "__getattr__")
    assert listwise_rerank.Reranker is rerank_base.Reranker is rerank.Reranker
    assert listwise_rerank.guarded_rerank is rerank_base.guarded_rerank is rerank.guarded_rerank
    assert narrative_index.guarded_rerank is rerank_base.guarded_rerank
    assert postprocess.Postprocessor is post_base.Postprocessor
    assert chunking.make_chunker is factory.make_chunker
    assert rerank_base.Reranker.__module__ == "ragspine_pipeline.retrieval.rerank.base"
    assert vector_base.EmbeddingBackend.__module__ == "ragspine_pipeline.retrieval.vector.base"


def test_corpus_make_chunker_builds_what_the_chunking_factory_builds():
    """``corpus.make_chunker`` (its older path) and ``chunking.make_chunker`` agree on every spec."""
    from ragspine_pipeline.corpus import make_chunker as old
    from ragspine_pipeline.retrieval.chunking import make_chunker as new

    for spec in ("paragraph", "paragraph:300:20", "layout:400:0", "laws", "qa", "book:600:60",
                 "parent_child:1200:300:30", "sentence_window:2:200"):
        a, b = old(spec), new(spec)
        assert (type(a).__name__, a.key) == (type(b).__name__, b.key), spec
    for bad in ("tokens", "paragraph:x", "sentence_window:1:2:3"):
        with pytest.raises(ValueError) as e_old:
            old(bad)
        with pytest.raises(ValueError) as e_new:
            new(bad)
        assert str(e_old.value) == str(e_new.value)


def test_line_spans_and_trim_span_exact():
    text = "  # Title \n\nbody line\t\n  last"
    assert list(line_spans(text)) == [(0, 10), (11, 11), (12, 22), (23, 29)]
    assert [trim_span(text, s, e) for s, e in line_spans(text)] == [(2, 9), (11, 11), (12, 21), (25, 29)]
    assert [text[slice(*trim_span(text, s, e))] for s, e in line_spans(text)] == ["# Title", "", "body line", "last"]
    assert list(line_spans("")) == [] and list(line_spans("\n")) == [(0, 0)]
    assert trim_span("   ", 0, 3) == (3, 3)  # all blank: empty, never inverted
    assert trim_span("a b", 1, 2) == (2, 2)


def test_structured_chunker_uses_the_shared_span_helpers():
    from ragspine_pipeline.retrieval.chunking import structured

    source = (PACKAGE / "retrieval" / "chunking" / "structured.py").read_text(encoding="utf-8")
    assert "def _trim" not in source and structured.trim_span is trim_span
    text = "FAQ\n  Q: how do I apply?  \nAnswer.\nWhy so slow?\n"
    marks = structured.question_marks(text)
    assert [(text[m.start:m.end], m.kind) for m in marks] == [("Q: how do I apply?", "question"),
                                                              ("Why so slow?", "question")]


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _function_level_imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every package-relative or absolute package import made
    inside a function body."""
    mod = _module_name(path)
    package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    out = []
    for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                elif (node.module or "").startswith("ragspine_pipeline"):
                    target = node.module or ""
                else:
                    continue
                out.append((node.lineno, target, [a.name for a in node.names]))
            elif isinstance(node, ast.Import):
                out += [(node.lineno, a.name, []) for a in node.names if a.name.startswith("ragspine_pipeline")]
    return out


def test_no_function_level_import_closes_an_import_cycle():
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("ragspine_pipeline")
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        importer = _module_name(path)
        for line, target, names in _function_level_imports(path):
            imported = next((f"{target}.{n}" for n in names if f"{target}.{n}" in graph.modules), target)
            if imported not in graph.modules or (importer, imported) in KNOWN_CYCLES:
                continue
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back is not None:
                found.append(f"{importer}:{line} imports {imported} inside a function; "
                             f"{imported} reaches back via {' -> '.join(back)}")
    assert not found, "move the shared piece into a base module:\n" + "\n".join(found)
