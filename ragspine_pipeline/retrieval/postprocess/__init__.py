"""Post-retrieval processors (after rerank, before prompt assembly) and their factory.

``make_postprocessor(spec)`` is the spec's entry (``RAGSPINE_POSTPROCESSOR`` when
``spec`` is None). A spec is a comma-separated chain, run in the given order:

* ``mmr`` (``mmr:0.7`` sets lambda; 1.0 = relevance only) — MMR diversity
  de-duplication over dense vectors when an ``embedding_backend`` is given, token sets
  otherwise (``MMRPostprocessor``);
* ``lost_in_middle`` — best hits at both ends (``LostInTheMiddle``);
* ``compress`` (``compress:400`` sets the character budget) — extractive compression
  into ``prompt_text`` only (``ExtractiveCompressor``).

``None`` / ``"none"`` / ``""`` -> None: snippets exactly as the retriever returns them
(byte-identical). An unknown name or a bad parameter is a ValueError naming it.
"""

from __future__ import annotations

from ... import settings
from ..vector.base import EmbeddingBackend
from .base import LAYERS_KEY, Postprocessor, PostprocessorChain, mark_layer
from .compress import DEFAULT_COMPRESS_CHARS, ExtractiveCompressor, split_sentences
from .lost_in_middle import LostInTheMiddle, lost_in_middle_order
from .mmr import (
    DEFAULT_MMR_LAMBDA,
    IndexVectorLookup,
    MMRPostprocessor,
    VectorLookup,
    token_similarity,
)

POSTPROCESSOR_ENV = "RAGSPINE_POSTPROCESSOR"
ACCEPTED = ("none", "mmr", "lost_in_middle", "compress")
_ALIASES = {"lost_in_the_middle": "lost_in_middle", "litm": "lost_in_middle", "reorder": "lost_in_middle",
            "compression": "compress", "extractive": "compress"}


def _param(name: str, raw: str | None, spec: str, kind: type) -> float | int | None:
    if raw is None:
        return None
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"postprocessor {name!r} in {spec!r}: parameter {raw!r} is not "
                         f"{'a number' if kind is float else 'an integer'}") from None


def make_postprocessor(spec: str | None = None, *,
                       embedding_backend: EmbeddingBackend | None = None,
                       vectors: VectorLookup | None = None) -> Postprocessor | None:
    """A post-processor chain from a comma-separated spec; None when off. ``vectors``
    (an ``IndexVectorLookup``) gives MMR the served index's cached vectors; an
    ``embedding_backend`` is its second choice; token sets otherwise."""
    raw = spec if spec is not None else settings.get(POSTPROCESSOR_ENV)  # a bad variable: SettingsError
    if not isinstance(raw, str):
        raise TypeError(f"postprocessor spec must be a string or None (got {type(raw).__name__})")
    steps = []
    for item in (n.strip() for n in raw.split(",")):
        if not item:
            continue
        name, _, arg = item.partition(":")
        name = _ALIASES.get(name.strip().lower(), name.strip().lower())
        arg_s = arg.strip() or None
        if name in ("none", "off"):
            continue
        if name == "mmr":
            lam = _param(name, arg_s, raw, float)
            steps.append(MMRPostprocessor(lambda_=DEFAULT_MMR_LAMBDA if lam is None else lam,
                                          embedding_backend=embedding_backend, vectors=vectors))
        elif name == "lost_in_middle":
            if arg_s is not None:
                raise ValueError(f"postprocessor 'lost_in_middle' in {raw!r} takes no parameter")
            steps.append(LostInTheMiddle())
        elif name == "compress":
            n = _param(name, arg_s, raw, int)
            steps.append(ExtractiveCompressor(max_chars=DEFAULT_COMPRESS_CHARS if n is None else int(n)))
        else:
            raise ValueError(f"unknown postprocessor {name!r} in {raw!r}; accepted values: "
                             f"{', '.join(ACCEPTED)} (comma-separated, e.g. 'mmr,lost_in_middle')")
    return PostprocessorChain(steps) if steps else None


__all__ = ["DEFAULT_COMPRESS_CHARS", "DEFAULT_MMR_LAMBDA", "LAYERS_KEY", "POSTPROCESSOR_ENV",
           "ExtractiveCompressor", "IndexVectorLookup", "LostInTheMiddle", "MMRPostprocessor", "Postprocessor",
           "PostprocessorChain", "lost_in_middle_order", "make_postprocessor", "mark_layer",
           "split_sentences", "token_similarity"]
