"""The embeddings step's model choice and progress (kept out of pipeline.py on purpose).

Progress (issue 43: a 34-minute index printed nothing until each library ended): after
each batch ``EmbedProgress`` counts the texts embedded and, at most ``PROGRESS_EVERY_S``
seconds apart (and after the first and the last batch), logs ``embeddings[LIB]: done/total
texts (p%), R texts/s, ETA …``; a document with more than ``LARGE_FILE_CHUNKS`` chunks to
embed is announced with its expected time when the embedding reaches it. Every line goes
to the step's ``log`` (the Dagster asset passes ``context.log.info``, ``ragspine index
--in-process`` prints) and to the ``ragspine.progress`` logger, which ``ragspine index``
prints while the code location runs (its Dagster console is quiet).

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
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..retrieval.hybrid.fusion import fusion_configured, fusion_from_env
from ..retrieval.vector.batching import DEFAULT_STREAM_BATCH, embed_in_batches
from ..sensitivity import is_restricted
from .chunk_tables import active_chunk_table, withheld_docs

LOG = logging.getLogger("ragspine.warehouse.embeddings")
PROGRESS_LOG = logging.getLogger("ragspine.progress")
PROGRESS_EVERY_S = 10.0
"""Longest wait between two progress lines while a step embeds (docs/pipeline.md)."""
LARGE_FILE_CHUNKS = 2000
"""A document with more chunks than this to embed is announced with its expected time."""


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
                   executor: str | None, ids: Sequence[str] | None = None) -> tuple[Any, dict[str, Any]]:
    """(vectors of ``texts``, the Ray job's metadata and the reuse counts): embedded here in
    bounded batches, or with ``executor="ray"`` on a Ray actor pool that builds ``spec`` per
    actor (it must build the same model id as ``backend``: a mismatch fails the step).
    ``ids``: the chunk ids of ``texts`` (``doc#ordinal-hash``), so that a large document is
    announced by name.

    A text is embedded once per process and model (issue 47): the backend's
    ``vector_cache.shared_reuse`` store, keyed by (model id, normalised text hash), hands
    back the vector of a text this step, another library or an earlier version already
    embedded (the shipped models are loaded once per process, so one store serves them
    all; ``RAGSPINE_EMBED_CACHE`` keeps it on disk for later processes); only the distinct
    texts it lacks reach the model. ``reuse`` in the returned
    metadata counts them."""
    from ..retrieval.vector.embedding_backends import backend_model_id
    from ..scale.config import executor as executor_name
    from ..vector_cache import shared_reuse

    if not texts:
        return [], ({"executor": "ray", "ray_batches": 0} if executor_name(executor) == "ray" else {})
    model_id = backend_model_id(backend)
    job: dict[str, Any] = {}

    say = progress_line(log)

    def embed_missing(missing: list[str]) -> Any:
        if len(missing) < len(texts):
            say(f"embeddings[{library}]: {len(texts):,} texts, {len(texts) - len(missing):,} of them duplicates or "
                f"embedded earlier with {model_id}: {len(missing):,} to embed")
        if executor_name(executor) != "ray":
            first_id: dict[str, str] = {}
            for cid, t in zip(ids or (), texts, strict=False):
                first_id.setdefault(t, cid)
            return embed_with_progress(backend, missing, library, log,
                                       ids=[first_id.get(t, "") for t in missing] if ids else None)
        from ..scale.build import embed_on_ray

        vecs, meta = embed_on_ray(spec, model_id, missing, log=log or LOG.info, desc=f"embeddings[{library}]")
        job.update(meta)
        return vecs

    vecs, counts = shared_reuse(backend).embed(model_id, texts, embed_missing)
    if not counts["embedded"]:
        say(f"embeddings[{library}]: {len(texts):,}/{len(texts):,} texts reused from earlier embeddings with "
            f"{model_id}, none embedded (100%)")
    return vecs, {**job, "reuse": counts}


def progress_line(log: Callable[[str], None] | None) -> Callable[[str], None]:
    """A line sink: the step's ``log`` (else this module's logger) and ``ragspine.progress``."""
    def say(line: str) -> None:
        (log or LOG.info)(line)
        PROGRESS_LOG.info(line)

    return say


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s // 60 % 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def large_documents(ids: Sequence[str] | None, threshold: int | None = None) -> list[tuple[str, int, int]]:
    """(doc id, index of its first text, texts) of each document over ``threshold`` texts
    (default ``LARGE_FILE_CHUNKS``)."""
    if not ids:
        return []
    threshold = LARGE_FILE_CHUNKS if threshold is None else threshold
    docs = [cid.rpartition("#")[0] or cid for cid in ids]
    counts = Counter(docs)
    first: dict[str, int] = {}
    for i, d in enumerate(docs):
        first.setdefault(d, i)
    return sorted(((d, first[d], n) for d, n in counts.items() if n > threshold), key=lambda x: x[1])


@dataclass
class EmbedProgress:
    """The progress hook of one embedding step (``progress(done, total)`` after each
    batch): counts, rate and ETA at most ``every_s`` apart, large documents announced."""

    desc: str
    say: Callable[[str], None]
    every_s: float = PROGRESS_EVERY_S
    batch: int = DEFAULT_STREAM_BATCH
    large: list[tuple[str, int, int]] = field(default_factory=list)
    clock: Callable[[], float] = time.monotonic
    calls: int = 0
    lines: int = 0
    _t0: float = field(default=0.0, init=False)
    _last_line: float = field(default=0.0, init=False)
    _last_call: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        self._t0 = self._last_line = self._last_call = self.clock()

    def _emit(self, line: str) -> None:
        self.lines += 1
        self.say(line)

    def __call__(self, done: int, total: int) -> None:
        now = self.clock()
        self.calls += 1
        batch_s, self._last_call = now - self._last_call, now
        elapsed = max(now - self._t0, 1e-9)
        rate = done / elapsed
        while self.large and self.large[0][1] < done + self.batch:  # reached by the next batch
            doc, _, n = self.large.pop(0)
            self._emit(f"{self.desc}: {doc} has {n:,} chunks to embed (over {LARGE_FILE_CHUNKS:,}): "
                       f"about {_duration(n / rate)} at {rate:,.1f} texts/s")
        if done >= total:
            self._emit(f"{self.desc}: {done:,}/{total:,} texts in {_duration(elapsed)}, {rate:,.1f} texts/s (100%)")
        elif self.calls == 1 or now - self._last_line + batch_s >= self.every_s:
            # The next line would come a batch later: write it now so no gap passes every_s.
            eta = (total - done) / rate if rate > 0 else 0.0
            self._emit(f"{self.desc}: {done:,}/{total:,} texts ({100 * done / total:.0f}%), {rate:,.1f} texts/s, "
                       f"ETA {_duration(eta)}")
        else:
            return
        self._last_line = now


def embed_with_progress(backend: Any, texts: list[str], library: str, log: Callable[[str], None] | None = None,
                        *, ids: Sequence[str] | None = None, batch: int = DEFAULT_STREAM_BATCH,
                        clock: Callable[[], float] = time.monotonic) -> list:
    """Embed in bounded batches, reporting progress (see ``EmbedProgress``)."""
    if not texts:
        return []
    say = progress_line(log)
    desc = f"embeddings[{library}]"
    say(f"{desc}: {len(texts):,} texts to embed in batches of {batch}")
    hook = EmbedProgress(desc, say, batch=batch, large=large_documents(ids), clock=clock)
    return embed_in_batches(backend, texts, batch=batch, progress=hook)
