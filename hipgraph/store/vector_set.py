"""The three FAISS indexes of an index folder (passages, entities, facts), kept in step with DuckDB.

On open each file is checked against DuckDB's vector ids (count and exact id set) and spot-checked
against DuckDB's vectors (:data:`SPOT_CHECKS` ids spread over the id range, read back from FAISS,
and a search of them). A file from an older state (saved before the last commits: a crash
between a commit and the save) is brought up to date from DuckDB when its layout allows (the ids
gone removed, the new vectors added); a missing, unreadable or damaged file, or a stale one that
cannot be topped up, is rebuilt from DuckDB and rewritten. Updates after a commit are applied
in memory and saved atomically.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from hipgraph.config import VectorIndexConfig
from hipgraph.errors import StoreError
from hipgraph.store.database import GraphStore
from hipgraph.store.schema import VECTOR_KINDS
from hipgraph.store.vectors import FaissVectorIndex

logger = logging.getLogger(__name__)

SPOT_CHECKS = 8  # stored vectors compared with DuckDB's on open, per kind


def faiss_path(root: Path, kind: str) -> Path:
    return root / f"{kind}.faiss"


def trained_on_key(kind: str) -> str:
    """The meta key holding how many vectors ``kind``'s saved IVF layout was trained for (a FAISS
    file does not record it; retraining is due ``retrain_growth`` times past it, across reopens)."""
    return f"vectors.{kind}.trained_on"


class VectorSet:
    """Per-kind :class:`FaissVectorIndex` objects whose ids are the DuckDB ids."""

    def __init__(self, store: GraphStore, config: VectorIndexConfig):
        self.store = store
        self.config = config
        self.dimension = int(store.meta_get("dimension"))
        self.indexes: dict[str, FaissVectorIndex] = {}
        self.repaired: list[str] = []  # kinds rebuilt on open, with the reason
        self._dirty: set[str] = set()  # kinds changed since their file was written
        self.save_every = 0.0  # checkpoint(): seconds between saves (0: save at every call)
        self._last_save = time.monotonic()

    def open(self) -> VectorSet:
        if not self.store.read_only:  # temporary files of a save that was killed mid-way
            for stale in self.store.root.glob(".*.faiss.*.tmp"):
                stale.unlink(missing_ok=True)
        for kind in VECTOR_KINDS:
            self.indexes[kind] = self._load_or_rebuild(kind)
        return self

    def _load_or_rebuild(self, kind: str) -> FaissVectorIndex:
        path = faiss_path(self.store.root, kind)
        db_ids = self.store.vector_ids(kind)
        reason = None
        if not path.exists():
            reason = "missing"
        else:
            try:
                index = FaissVectorIndex.load(path, self.dimension, self.config)
            except StoreError as exc:
                reason = f"unreadable ({exc})"
            else:
                trained_on = self.store.meta_get(trained_on_key(kind))
                if index.layout == "ivf" and trained_on:
                    index.trained_on = int(trained_on)
                stale = None
                if index.ntotal != len(db_ids):
                    stale = f"stale ({index.ntotal} vectors in FAISS, {len(db_ids)} in DuckDB)"
                elif not np.array_equal(index.ids(), db_ids):
                    stale = "stale (id sets differ)"
                if stale is not None and not self.store.read_only and (done := self._top_up(kind, index, db_ids)):
                    stale += f"; {done}"  # still spot-checked below, and rebuilt if damaged
                elif stale is not None:
                    reason = stale
                if reason is None and (problem := self._spot_check(kind, index, db_ids)):
                    reason = f"damaged ({problem})"
                if reason is None:
                    if stale is not None:
                        logger.warning("%s FAISS index %s was %s", kind, path, stale)
                        self.repaired.append(f"{kind}: {stale}")
                        self._save(kind, index)
                    return index
        if len(db_ids) == 0 and reason == "missing":
            index = FaissVectorIndex(self.dimension, self.config)
        else:
            logger.warning("%s FAISS index %s is %s; rebuilding from DuckDB", kind, path, reason)
            index = self._rebuild(kind)
            self.repaired.append(f"{kind}: {reason}")
        if not self.store.read_only:
            self._save(kind, index)
        return index

    def _top_up(self, kind: str, index: FaissVectorIndex, db_ids: np.ndarray, rows: int = 65536) -> str | None:
        """Bring a file saved before the last commits up to DuckDB's ids, when its layout allows:
        remove the ids DuckDB no longer holds and add the vectors it gained (ids are never reused
        and a stored vector never changes, so these are the only differences a file from an
        older state can have). Returns what it did, or None where a rebuild is needed instead."""
        held = index.ids()
        gone = np.setdiff1d(held, db_ids, assume_unique=True)
        new = np.setdiff1d(db_ids, held, assume_unique=True)
        if (len(gone) and not index.supports_remove) or index.needs_relayout(len(db_ids)):
            return None
        index.remove(gone)
        for start in range(0, len(new), rows):
            ids, vectors = self.store.read_vectors(kind, new[start:start + rows])
            index.add(ids, vectors)
        return f"brought up to date from DuckDB (+{len(new)}, -{len(gone)})"

    def _spot_check(self, kind: str, index: FaissVectorIndex, db_ids: np.ndarray) -> str | None:
        """:meth:`FaissVectorIndex.spot_check` on up to :data:`SPOT_CHECKS` ids evenly spread
        over ``db_ids`` (the same ones every open)."""
        if len(db_ids) == 0:
            return None
        picks = np.unique(np.linspace(0, len(db_ids) - 1, min(SPOT_CHECKS, len(db_ids))).round())
        ids, vectors = self.store.read_vectors(kind, db_ids[picks.astype(np.int64)])
        return index.spot_check(ids, vectors)

    def _rebuild(self, kind: str) -> FaissVectorIndex:
        """A new index of ``kind`` from DuckDB, streamed in chunks (never all vectors at once)."""
        n = len(self.store.vector_ids(kind))
        index = FaissVectorIndex(self.dimension, self.config)
        want = index.training_size(n)
        sample = self.store.sample_vectors(kind, want) if want else np.zeros((0, self.dimension), np.float32)
        index.build_streamed(n, sample, self.store.iter_vectors(kind))
        if index.layout != "flat":
            logger.info("%s vectors: %s layout for %d vectors", kind, index.layout, n)
        return index

    def search(self, kind: str, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self.indexes[kind].search(queries, k)

    def apply(self, removed: Any, added: dict[str, tuple[np.ndarray, np.ndarray]], *, save: bool = True) -> None:
        """Apply a committed batch: remove ids, add new vectors, and save the changed files (or,
        with ``save=False``, leave them to :meth:`save`: a crash before it costs a rebuild from
        DuckDB on the next open, never data)."""
        removals = {"passage": removed.passages, "entity": removed.entities, "fact": removed.facts}
        for kind in VECTOR_KINDS:
            index = self.indexes[kind]
            gone = np.fromiter(sorted(removals[kind]), dtype=np.int64)
            ids, vectors = added.get(kind, (np.zeros(0, np.int64), None))
            if len(gone) == 0 and len(ids) == 0:
                continue
            if len(gone) and not index.supports_remove:
                index = self._rebuild(kind)
                self.indexes[kind] = index
            else:
                index.remove(gone)
                index.add(ids, vectors)
            if index.needs_relayout(index.ntotal):
                index = self._rebuild(kind)  # crossed a layout size: train the IVF layout (again)
                self.indexes[kind] = index
            self._dirty.add(kind)
        if save:
            self.save()

    def save(self) -> None:
        """Write the indexes changed since the last save (atomically, one file per kind)."""
        for kind in sorted(self._dirty):
            self._save(kind, self.indexes[kind])
            self._dirty.discard(kind)
        self._last_save = time.monotonic()

    @property
    def dirty(self) -> bool:
        """Whether an index changed since its file was written."""
        return bool(self._dirty)

    def checkpoint(self) -> None:
        """:meth:`save`, unless :attr:`save_every` is set and the last save is more recent (the
        end of a write call). Files left behind by a crash before the next save are brought up to
        date from DuckDB on the next open: a deferred save costs time then, never data."""
        if self._dirty and time.monotonic() - self._last_save >= self.save_every:
            self.save()

    def _save(self, kind: str, index: FaissVectorIndex) -> None:
        index.save(faiss_path(self.store.root, kind))
        if index.layout == "ivf":
            self.store.meta_set(trained_on_key(kind), index.trained_on)
