"""The parts of the next read view derived from the previous view's parts and a write's changes.

When a write builds the next generation's view (:meth:`Views.prepare_next`), the parts readers
used are not re-read whole: the graph snapshot is spliced (:mod:`hipgraph.query.snapshot_delta`),
entity names re-read only for the entities the write touched, and the memory units and turns
take the write's new conversation units (dropping its removed ones) and the turns' BM25 their
turns (:class:`~hipgraph.query.bm25_live.LiveBM25`). What cannot be derived
(no itemised record, too large a change) is left to the usual full build. Each derived part
equals the part built from all the rows; ``tests/test_snapshot_delta.py`` checks that.
"""

from __future__ import annotations

import logging
from typing import Any

from hipgraph.query.snapshot_delta import update_snapshot, worth_splicing
from hipgraph.store import reads
from hipgraph.store.changes import GraphChanges
from hipgraph.text.memory_units import SESSION_KIND

logger = logging.getLogger(__name__)


def derived_parts(parts: dict[Any, Any], store, changes: GraphChanges, generation: int) -> dict[Any, Any]:
    """The next generation's parts that ``parts`` (the previous view's) and ``changes`` give,
    read through ``store.con`` (the writing transaction, which sees its own rows)."""
    if not changes.itemised:
        return {}
    from hipgraph.query.view import memory_units  # noqa: PLC0415 - view imports this module

    out: dict[Any, Any] = {}
    snapshot = parts.get("snapshot")
    if snapshot is not None and worth_splicing(snapshot, changes):
        out["snapshot"] = update_snapshot(snapshot, store, changes, generation)
        out["passage_count"] = out["snapshot"].n_passages
    names = parts.get("names")
    if names is not None:
        out["names"] = names.updated(store, changes.entities | changes.labels, generation)
    rows = parts.get("unit_rows")
    if rows is not None:
        touched = changes.passages
        removed = bool(touched) and any(r[0] in touched for r in rows)
        kept = [r for r in rows if r[0] not in touched] if removed else rows
        added = reads.unit_rows(store, SESSION_KIND, touched) if touched else []
        ascending = not kept or not added or added[0][0] > kept[-1][0]
        out["unit_rows"] = kept + added if ascending else sorted(kept + added, key=lambda r: r[0])
        units = parts.get("units")
        if units is not None and ascending:  # dicts keep the units in passage order
            records, times = dict(units[0]), dict(units[1])
            for pid in touched:
                records.pop(pid, None)
                times.pop(pid, None)
            more_records, more_times = memory_units(added)
            records.update(more_records)
            times.update(more_times)
            out["units"] = (records, times)
        turns = parts.get("turns")
        if turns is not None and ascending and not removed:  # turn rows keep their numbers
            out["turns"] = turns.extended(added)
            new_texts = out["turns"].texts[len(turns):]
            for key, bm25 in parts.items():
                if isinstance(key, tuple) and key[0] == "turn_bm25":
                    out[key] = bm25.extended(new_texts)
        cache = parts.get("turn_vector_cache")
        if cache is not None:  # stored turn vectors of units still held do not change
            out["turn_vector_cache"] = {u: v for u, v in cache.items() if u not in touched}
    return out
