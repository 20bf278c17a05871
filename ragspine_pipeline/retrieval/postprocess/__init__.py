"""Post-retrieval processors (after rerank, before prompt assembly) and their factory.

``make_postprocessor(spec)`` is the spec's entry (``RAGSPINE_POSTPROCESSOR`` when
``spec`` is None). The off state is the only one built so far: ``None`` / ``"none"`` /
``""`` -> None, i.e. snippets exactly as the retriever returns them. The layers the
spec names (``mmr``, ``lost_in_middle``, ``compress``) are not implemented yet; asking
for one is a ValueError that says so, never a silent pass-through.
"""

from __future__ import annotations

import os

from ..link.narrative_link import Postprocessor

POSTPROCESSOR_ENV = "RAGSPINE_POSTPROCESSOR"
ACCEPTED = ("none",)
PLANNED = ("mmr", "lost_in_middle", "compress")


def make_postprocessor(spec: str | None = None) -> Postprocessor | None:
    """A post-processor chain from a comma-separated spec; None when off."""
    raw = spec if spec is not None else os.environ.get(POSTPROCESSOR_ENV, "")
    if not isinstance(raw, str):
        raise TypeError(f"postprocessor spec must be a string or None (got {type(raw).__name__})")
    names = [n.strip().lower() for n in raw.split(",") if n.strip()]
    if all(n in ("none", "off") for n in names):
        return None
    bad = [n for n in names if n not in ("none", "off")]
    planned = [n for n in bad if n in PLANNED]
    note = f" ({', '.join(planned)} not implemented yet)" if planned else ""
    raise ValueError(f"unknown postprocessor {bad[0]!r} in {raw!r}{note}; accepted values: "
                     f"{', '.join(ACCEPTED)} (or an empty spec)")


__all__ = ["POSTPROCESSOR_ENV", "Postprocessor", "make_postprocessor"]
