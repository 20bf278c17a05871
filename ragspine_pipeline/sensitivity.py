"""The one RESTRICTED label and the one test for it.

Both exits (before a reranker/LLM prompt, and before a snippet is built) import this
module, so there is exactly one definition of what "restricted" means. The test is
deliberately lenient about spelling (case, surrounding whitespace): a label that a
human typed as ``restricted `` must never slip through an exact-match comparison.
"""

from __future__ import annotations

RESTRICTED_SENSITIVITY = "RESTRICTED"


def is_restricted(sensitivity: object) -> bool:
    """True when a sensitivity label means RESTRICTED (case/whitespace-insensitive)."""
    if sensitivity is None:
        return False
    return str(sensitivity).strip().upper() == RESTRICTED_SENSITIVITY
