"""When facts held: ``valid_at`` and ``invalid_at`` of facts stated in conversations.

A fact's ``valid_at`` is the earliest time of the conversation units that state it (facts from
plain documents have none and are always valid). A later fact with the same subject and relation
and a different named object of the same type ("ana | live in | lisbon", then "ana | live in |
berlin": two places) contradicts it: the earlier fact gets ``invalid_at`` = the later one's ``valid_at`` and
``invalidated_by`` = its id. Relations that naturally hold many objects at once ("likes",
"visited", "has") never contradict. Nothing is deleted: this is a view derived from the stored
facts and their provenance, recomputed per index generation, so deleting the session that stated
the later fact makes the earlier one current again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from hipgraph.store import reads
from hipgraph.store.database import GraphStore

# relations that hold several objects at once: a new object adds, it does not replace
MULTI_VALUED = frozenset({
    "likes", "like", "loves", "love", "enjoys", "enjoy", "has", "have", "had", "visited", "visit",
    "went to", "go to", "read", "reads", "watched", "watch", "bought", "buy", "met", "meet", "saw",
    "see", "played", "play", "tried", "try", "made", "make", "painted", "paint", "is", "was", "are",
    "were", "said", "says", "told", "tell", "took", "take", "got", "get", "gave", "give", "wants",
    "want", "needs", "need", "knows", "know", "friend of", "mentioned", "talked about",
})


# objects that can replace each other: named things of one type (a city for a city), not noun
# chunks ("new dance routines") or numbers, which a conversation mentions in passing
NAMED = frozenset({"PERSON", "ORG", "GPE", "LOC", "FAC", "NORP", "PRODUCT", "EVENT", "WORK_OF_ART",
                   "LANGUAGE", "LAW"})


@dataclass(frozen=True)
class FactTime:
    """One fact's validity (times naive, as conversations state them)."""

    fact_id: int
    valid_at: datetime | None
    invalid_at: datetime | None = None
    invalidated_by: int | None = None

    def as_of(self, when: datetime | None) -> FactTime | None:
        """This fact as known at ``when`` (None = now): None if not stated yet, without its
        invalidation if that came later."""
        if when is None:
            return self
        if self.valid_at is not None and self.valid_at > when:
            return None
        if self.invalid_at is not None and self.invalid_at > when:
            return FactTime(self.fact_id, self.valid_at)
        return self

    def valid(self, when: datetime | None) -> bool:
        """Whether the fact held at ``when`` (now when None): stated by then, not yet replaced."""
        if when is None:
            return self.invalid_at is None
        if self.valid_at is not None and self.valid_at > when:
            return False
        return self.invalid_at is None or self.invalid_at > when


def fact_times(store: GraphStore, unit_start: Mapping[int, datetime]) -> dict[int, FactTime]:
    """Validity of every triple fact stated in a conversation unit (``unit_start``: passage id ->
    the unit's start time); other facts are always valid."""
    if not unit_start:
        return {}
    rows = reads.triple_sources(store, unit_start)
    first: dict[int, datetime] = {}
    keys: dict[int, tuple[int, str, int, str]] = {}
    for fid, subj, rel, obj, label, pid in rows:
        t = unit_start.get(int(pid))
        if t is None:
            continue
        fid = int(fid)
        first[fid] = min(first.get(fid, t), t)
        keys[fid] = (int(subj), rel, int(obj), label)
    by_key: dict[tuple[int, str], list[int]] = {}
    for fid, (subj, rel, _, _) in keys.items():
        if rel not in MULTI_VALUED:
            by_key.setdefault((subj, rel), []).append(fid)
    out = {fid: FactTime(fid, t) for fid, t in first.items()}
    for group in by_key.values():
        group.sort(key=lambda f: (first[f], f))
        for i, fid in enumerate(group):
            _, _, obj, label = keys[fid]
            for later in group[i + 1:]:
                _, _, obj2, label2 = keys[later]
                if obj2 != obj and label2 == label and label in NAMED and first[later] > first[fid]:
                    out[fid] = FactTime(fid, first[fid], first[later], later)
                    break
    return out


def fact_weights(times: dict[int, FactTime], fact_ids: np.ndarray, when: datetime | None,
                 past: bool, stale_weight: float) -> np.ndarray:
    """Multipliers for candidate facts: 0 for a fact not yet stated at ``when`` (an as-of time),
    ``stale_weight`` for one replaced by then, unless the question asks about the past."""
    out = np.ones(len(fact_ids))
    for i, fid in enumerate(fact_ids.tolist()):
        t = times.get(int(fid))
        if t is None:
            continue
        if when is not None and t.valid_at is not None and t.valid_at > when:
            out[i] = 0.0
        elif not past and not t.valid(when):
            out[i] = stale_weight
    return out
