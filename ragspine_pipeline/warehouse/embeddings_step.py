"""The embeddings step's model choice and progress (kept out of pipeline.py on purpose).

With ``RAGSPINE_EMBEDDING_BACKEND=auto`` the model is chosen per library from the
evaluation table (``retrieval/vector/auto_policy.py``), over the library's whole active,
non-RESTRICTED chunk set -- not over the chunks a refresh happens to embed, so an
incremental run cannot switch models half-way. The concrete model key becomes the
embeddings version's ``spec`` (so the snapshot rebuilds exactly that model for queries),
and the choice (group, model, fusion, why, and every language the library holds, per
document) is stored in its metadata and the snapshot's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..retrieval.lexical.fusion import fusion_configured, fusion_from_env
from ..retrieval.vector.batching import ProgressHook, embed_in_batches, log_progress
from ..sensitivity import is_restricted
from .chunk_tables import active_chunk_table, withheld_docs

LOG = logging.getLogger("ragspine.warehouse.embeddings")


def resolve_library_backend(backend: Any, spec: str, pub_chunks: Any) -> tuple[Any, str, dict[str, Any]]:
    """(backend to embed with, spec to record, metadata to add) for one library."""
    if backend is None or not callable(getattr(backend, "resolve", None)):
        return backend, spec, {}
    # The served chunks only (no RESTRICTED, no withheld document): the profile and the choice
    # reach the manifest, the UI metadata and every served score, so hidden text must not vote.
    withheld = withheld_docs(pub_chunks)
    t = active_chunk_table(pub_chunks, columns=["doc_id", "text", "language", "sensitivity"])
    items = [(txt, lang, doc) for doc, txt, lang, sens in zip(
        t.column("doc_id").to_pylist(), t.column("text").to_pylist(), t.column("language").to_pylist(),
        t.column("sensitivity").to_pylist(), strict=True) if doc not in withheld and not is_restricted(sens)]
    choice = backend.resolve(items)
    fusion = fusion_from_env() if fusion_configured() else choice.fusion
    auto = {k: v for k, v in choice.to_dict().items() if k != "evidence"}
    auto["profile"] = choice.evidence.get("profile")
    return backend.backend_for(choice.model), choice.model, {"auto": auto, "fusion": fusion.to_dict()}


def embed_for_step(backend: Any, spec: str, texts: list[str], library: str, log: Callable[[str], None] | None,
                   executor: str | None) -> tuple[Any, dict[str, Any]]:
    """(vectors of ``texts``, the Ray job's metadata or {}): embedded here in bounded
    batches, or with ``executor="ray"`` on a Ray actor pool that builds ``spec`` per actor
    (it must build the same model id as ``backend``: a mismatch fails the step)."""
    from ..scale.config import executor as executor_name

    if executor_name(executor) != "ray":
        return embed_with_progress(backend, texts, library, log), {}
    if not texts:  # nothing new to embed: no cluster to start
        return [], {"executor": "ray", "ray_batches": 0}
    from ..retrieval.vector.embedding_backends import backend_model_id
    from ..scale.build import embed_on_ray

    return embed_on_ray(spec, backend_model_id(backend), texts, log=log or LOG.info, desc=f"embeddings[{library}]")


def embed_with_progress(backend: Any, texts: list[str], library: str,
                        log: Callable[[str], None] | None = None) -> list:
    """Embed in bounded batches, logging progress (the Dagster step passes its logger)."""
    hook: ProgressHook = log_progress(log or LOG.info, f"embeddings[{library}]")
    return embed_in_batches(backend, texts, progress=hook) if texts else []
