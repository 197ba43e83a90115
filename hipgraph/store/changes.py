"""What one write transaction changed in the graph, by id.

The write side records here, as it writes, which passages, entities, facts and entity pairs a
transaction touched; the read side uses the record to bring the previous generation's read view
up to date (graph snapshot, entity names, memory units) by re-reading only those rows, instead of
re-reading the whole index after every write (see :mod:`hipgraph.query.view_delta`).

A record is only trusted when the write path that filled it says it listed everything
(:attr:`GraphChanges.itemised`); any other transaction that moves the generation on makes the
read side rebuild whole, as before.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np


def _ints(ids: Iterable[int] | np.ndarray) -> list[int]:
    if isinstance(ids, np.ndarray):
        return ids.astype(np.int64, copy=False).reshape(-1).tolist()
    return [int(i) for i in ids]


@dataclass
class GraphChanges:
    """The ids one transaction touched (module docstring).

    - ``passages``: passages added or removed (their mention edges go with them);
      ``gone_passages``: those of them removed;
    - ``entities``: entities added or removed, or whose edges were rewritten: every edge of
      theirs is re-read; ``gone_entities``: those removed;
    - ``labels``: entities whose stored label may have changed (names and labels are re-read);
    - ``facts``: facts added or removed;
    - ``pairs``: entity pairs ``(lo, hi)`` whose fact or synonym edges were added, removed or
      re-weighted (the pair's edges are re-read).
    """

    passages: set[int] = field(default_factory=set)
    gone_passages: set[int] = field(default_factory=set)
    entities: set[int] = field(default_factory=set)
    gone_entities: set[int] = field(default_factory=set)
    labels: set[int] = field(default_factory=set)
    facts: set[int] = field(default_factory=set)
    pairs: set[tuple[int, int]] = field(default_factory=set)
    itemised: bool = False

    def touch_passages(self, ids: Iterable[int] | np.ndarray) -> None:
        self.passages.update(_ints(ids))

    def remove_passages(self, ids: Iterable[int] | np.ndarray) -> None:
        ids = _ints(ids)
        self.passages.update(ids)
        self.gone_passages.update(ids)

    def touch_entities(self, ids: Iterable[int] | np.ndarray) -> None:
        self.entities.update(_ints(ids))

    def remove_entities(self, ids: Iterable[int] | np.ndarray) -> None:
        ids = _ints(ids)
        self.entities.update(ids)
        self.gone_entities.update(ids)
        self.labels.update(ids)

    def touch_labels(self, ids: Iterable[int] | np.ndarray) -> None:
        self.labels.update(_ints(ids))

    def touch_facts(self, ids: Iterable[int] | np.ndarray) -> None:
        self.facts.update(_ints(ids))

    def touch_pairs(self, src: Iterable[int] | np.ndarray, dst: Iterable[int] | np.ndarray) -> None:
        """Entity pairs whose fact/synonym edges changed (stored as ``(min, max)``)."""
        for a, b in zip(_ints(src), _ints(dst), strict=True):
            self.pairs.add((a, b) if a <= b else (b, a))

    def size(self) -> int:
        """How many ids the record holds (a view rebuilds whole when this is a large part of it)."""
        return len(self.passages) + len(self.entities) + len(self.labels) + len(self.facts) + len(self.pairs)

    def merged(self, later: GraphChanges) -> GraphChanges:
        """The changes of this transaction followed by ``later`` (ids are never reused, so a
        union says what the two touched; itemised when both were)."""
        return GraphChanges(self.passages | later.passages, self.gone_passages | later.gone_passages,
                            self.entities | later.entities, self.gone_entities | later.gone_entities,
                            self.labels | later.labels, self.facts | later.facts,
                            self.pairs | later.pairs, self.itemised and later.itemised)
