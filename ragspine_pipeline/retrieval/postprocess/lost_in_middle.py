"""Lost-in-the-middle reordering: the best hits at both ends of the context.

Language models use the start and the end of a long context best (Liu et al., 2023,
"Lost in the Middle"). Given snippets best-first, this puts #1 first, #2 last, #3
second, #4 second to last, ... so the weakest sit in the middle. Nothing is dropped or
changed; ``rank`` keeps the retrieval rank, the list order is the prompt order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .base import mark_layer


def lost_in_middle_order(n: int) -> list[int]:
    """Positions of a best-first list of ``n`` items in both-ends order."""
    front = list(range(0, n, 2))
    back = list(range(1, n, 2))
    return front + back[::-1]


@dataclass
class LostInTheMiddle:
    name: str = "lost_in_middle"

    def process(self, query: str, snippets: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [mark_layer(snippets[i], self.name) for i in lost_in_middle_order(len(snippets))]
