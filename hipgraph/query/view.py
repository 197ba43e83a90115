"""The read view: everything queries read of one index generation, shared by all threads.

A :class:`ReadView` belongs to one generation. Its parts (graph snapshot, entity names, memory
units and their times, memory turns with their BM25, fact validity, BM25 index, and the database fingerprint the snapshot and
BM25 files on disk are checked against) are built on first use, once, under a lock per part, and
never change afterwards. :class:`Views` hands out the view of the current
generation and swaps in a new one when a write has bumped it; readers that hold the old view
finish on it. Callers hold the store's shared lock (``store.lock.shared()``) for the whole read,
so the generation, DuckDB's rows and the FAISS indexes agree while they read.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from hipgraph.query.linking import EntityNames
from hipgraph.query.snapshot import (
    GraphSnapshot,
    build_snapshot,
    cache_dir,
    current_snapshot,
    save_snapshot,
)
from hipgraph.query.turns import MemoryTurns
from hipgraph.query.validity import FactTime, fact_times
from hipgraph.query.view_delta import derived_parts
from hipgraph.store import reads
from hipgraph.store.changes import GraphChanges
from hipgraph.store.database import GraphStore
from hipgraph.store.vector_set import VectorSet
from hipgraph.text.memory_units import SESSION_KIND, unit_record

logger = logging.getLogger(__name__)

T = TypeVar("T")
UnitTimes = dict[int, tuple[datetime, datetime]]


class ReadView:
    """One generation's query-time state (see module docstring)."""

    def __init__(self, store: GraphStore, vectors: VectorSet, generation: int, *, persist: bool = True):
        self.store = store
        self.vectors = vectors
        self.generation = generation
        self.persist = persist  # False: the disk caches (snapshot, BM25) are neither read nor written
        self._parts: dict[Any, Any] = {}
        self._locks: dict[Any, threading.Lock] = {}
        self._guard = threading.Lock()
        # (the previous view's parts, the changes since it): parts derived on first use
        self._derive_from: tuple[dict[Any, Any], GraphChanges] | None = None
        self.derived: set[Any] = set()  # parts derived that way (kept in memory: see save_caches)

    def derive_from(self, parts: dict[Any, Any], changes: GraphChanges) -> None:
        """Build this view's parts, when first asked for, from ``parts`` (a previous view's)
        and the ``changes`` made since it (:func:`view_delta.derived_parts`), not from every row."""
        self._derive_from = (parts, changes)

    def _derive(self) -> None:
        with self._guard:
            lock = self._locks.setdefault("derive", threading.Lock())
        with lock:
            source = self._derive_from
            if source is None:
                return
            try:
                for key, part in derived_parts(source[0], self.store, source[1], self.generation).items():
                    if key not in self._parts:
                        self._parts[key] = part
                        self.derived.add(key)
            except Exception as exc:  # noqa: BLE001 - the parts are then built from every row
                logger.warning("deriving the read view of generation %d failed (%s); building it "
                               "from the stored rows", self.generation, exc)
            self._derive_from = None

    def _once(self, key: Any, build: Callable[[], T]) -> T:
        """The part ``key``, built by the first thread that asks (the others wait for it)."""
        try:
            return self._parts[key]
        except KeyError:
            pass
        if self._derive_from is not None and (key[0] if isinstance(key, tuple) else key) in DERIVED_PARTS:
            self._derive()
            if key in self._parts:
                return self._parts[key]
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._parts:
                self._parts[key] = build()
            return self._parts[key]

    # ------------------------------------------------------------------ parts
    def fingerprint(self) -> dict[str, int]:
        """The database content the disk caches are checked against
        (:func:`reads.content_fingerprint`)."""
        return self._once("fingerprint", lambda: reads.content_fingerprint(self.store))

    def snapshot(self) -> GraphSnapshot:
        """The graph as CSR arrays over one node order (cached on disk per generation, unless the
        view does not persist: see :meth:`Views.save_caches`)."""
        if not self.persist:
            return self._once("snapshot", lambda: build_snapshot(self.store))
        return self._once("snapshot", lambda: current_snapshot(
            self.store, None, self.generation, self.fingerprint()))

    def passage_count(self) -> int:
        """How many passages this generation holds (one DuckDB count; builds no snapshot)."""
        return self._once("passage_count", lambda: reads.passage_count(self.store))

    def entity_names(self) -> EntityNames:
        return self._once("names", lambda: EntityNames(self.store, self.generation))

    def memory_units(self) -> tuple[dict[int, dict[str, Any]], UnitTimes]:
        """Conversation memory units: each unit's hit fields and its time span (units without a
        time have none)."""
        return self._once("units", lambda: memory_units(self._unit_rows()))

    def _unit_rows(self) -> list[tuple[int, int, int, str, dict[str, Any]]]:
        return self._once("unit_rows", lambda: reads.unit_rows(self.store, SESSION_KIND))

    def memory_turns(self) -> MemoryTurns:
        """Every turn of the memory units, in one row order (:class:`MemoryTurns`)."""
        return self._once("turns", lambda: MemoryTurns(self._unit_rows()))

    def turn_bm25(self, k1: float, b: float):
        """BM25 over the memory turns' ``Speaker: text`` lines (ids are turn rows)."""
        return self._once(("turn_bm25", k1, b), lambda: self.memory_turns().bm25(k1, b))

    def turn_vectors(self, rows: list[int], passage_ids: list[int],
                     embed: Callable[[list[str]], np.ndarray]) -> dict[Any, np.ndarray]:
        """The embedding of each memory turn row (key: the row) and of each other passage (key:
        ``("passage", id)``), read from DuckDB in one query per kind. Turns of an index written
        before turn vectors were stored are embedded with ``embed`` once per view."""
        turns = self.memory_turns()
        out: dict[Any, np.ndarray] = {}
        if rows:
            stored = self._stored_turn_vectors({int(turns.unit[r]) for r in rows})
            for r in rows:
                vec = stored.get(int(turns.unit[r]), {}).get(int(turns.position[r]))
                if vec is not None:
                    out[r] = vec
            missing = [r for r in rows if r not in out]
            if missing:
                out.update(self._embedded_turns(missing, embed))
        if passage_ids:
            ids, matrix = self.store.read_vectors("passage", np.asarray(passage_ids, dtype=np.int64))
            out.update({("passage", int(i)): v for i, v in zip(ids.tolist(), matrix, strict=True)})
        return out

    def _stored_turn_vectors(self, units: set[int]) -> dict[int, dict[int, np.ndarray]]:
        """``unit -> turn position -> stored vector`` for ``units``, read once per unit and view."""
        cache = self._once("turn_vector_cache", dict)
        with self._guard:
            todo = units - cache.keys()
        if todo:
            got: dict[int, dict[int, np.ndarray]] = {u: {} for u in todo}
            pids, positions, matrix = reads.turn_vectors(self.store, todo)
            for pid, pos, vec in zip(pids.tolist(), positions.tolist(), matrix, strict=True):
                got[pid][pos] = vec
            with self._guard:
                cache.update(got)
        with self._guard:
            return {u: cache[u] for u in units}

    def _embedded_turns(self, rows: list[int], embed: Callable[[list[str]], np.ndarray]) -> dict[int, np.ndarray]:
        """Query-time embeddings of turns that have no stored vector (kept for this view)."""
        cache = self._once("turn_fallback", dict)
        with self._guard:
            todo = [r for r in rows if r not in cache]
        if todo:
            logger.info("embedding %d memory turns without stored vectors (index written before "
                        "turn vectors; re-index to store them)", len(todo))
            texts = self.memory_turns().texts
            vecs = embed([texts[r] for r in todo])
            with self._guard:
                cache.update(zip(todo, vecs, strict=True))
        with self._guard:
            return {r: cache[r] for r in rows}

    def fact_times(self) -> dict[int, FactTime]:
        """Validity of facts stated in conversations."""
        def build() -> dict[int, FactTime]:
            starts = {pid: span[0] for pid, span in self.memory_units()[1].items()}
            return fact_times(self.store, starts)
        return self._once("fact_times", build)

    def has_replaced_facts(self) -> bool:
        """Whether any fact stated in a conversation was replaced by a later one."""
        return self._once("replaced", lambda: any(t.invalid_at is not None for t in self.fact_times().values()))

    def bm25(self, k1: float, b: float):
        """The BM25 index for ``(k1, b)``, loaded from the cache folder or built and saved."""
        return self._once(("bm25", k1, b), lambda: self._build_bm25(k1, b))

    def _build_bm25(self, k1: float, b: float):
        """The cached folder when its stamp matches this database's fingerprint and its ids are
        the stored passage ids, else a fresh index (saved when the folder is writable; a view
        that does not persist builds it in memory)."""
        from hipgraph.query.bm25 import BM25Config, BM25Index  # noqa: PLC0415 - optional mode

        cfg = BM25Config(k1=k1, b=b)
        if not self.persist:
            return BM25Index.build(*reads.passage_texts_for_bm25(self.store), cfg)
        folder = self._bm25_folder(cfg)
        if folder.exists():
            try:
                index = BM25Index.load(folder, cfg, source=self._bm25_source())
                if not np.array_equal(index.ids, reads.passage_ids(self.store)):
                    raise ValueError("its passage ids are not the stored ones")
                return index
            except Exception as exc:  # noqa: BLE001 - a broken cache is rebuilt, never fatal
                logger.warning("bm25 cache %s unusable (%s); rebuilding", folder, exc)
        index = BM25Index.build(*reads.passage_texts_for_bm25(self.store), cfg)
        self.save_bm25(index)
        return index

    def _bm25_folder(self, cfg) -> Path:
        return self.store.root / "cache" / "bm25" / f"g{self.generation}-k{cfg.k1:g}-b{cfg.b:g}"

    def _bm25_source(self) -> dict[str, Any]:
        return {"generation": self.generation, "fingerprint": self.fingerprint()}

    def save_bm25(self, index) -> None:
        """Write ``index`` (built for this view) to the cache folder, removing other generations'."""
        folder = self._bm25_folder(index.config)
        try:
            if folder.parent.exists():
                for old in folder.parent.iterdir():
                    if not old.name.startswith(f"g{self.generation}-"):
                        shutil.rmtree(old, ignore_errors=True)
            index.save(folder, source=self._bm25_source())
        except OSError as exc:
            logger.warning("cannot write bm25 cache %s (%s); keeping it in memory", folder, exc)

    # ------------------------------------------------------------------ rows
    def passage_rows(self, passage_ids: Iterable[int]) -> dict[int, tuple[str, str, str]]:
        """``passage id -> (document key, title, text)``."""
        return reads.passage_rows(self.store, passage_ids)

    def passage_texts(self, passage_ids: list[int]) -> list[tuple[str, str]]:
        """``(title, text)`` of each passage id still stored, in the order given."""
        rows = self.passage_rows(passage_ids)
        return [rows[i][1:] for i in passage_ids if i in rows]

    def facts_of(self, fact_ids: Iterable[int]) -> dict[int, dict[str, str]]:
        """``fact id -> {subject, relation, object}`` by entity name."""
        fact_ids = list(fact_ids)
        if not fact_ids:
            return {}
        names = self.entity_names().by_id
        return {i: {"subject": names.get(s, ""), "relation": r, "object": names.get(o, "")}
                for i, (s, r, o) in reads.fact_triples(self.store, fact_ids).items()}

    def fact_sources(self, fact_ids: Iterable[int]) -> dict[int, list[int]]:
        """``fact id -> ids of the passages stating it``."""
        return reads.fact_source_passages(self.store, fact_ids)

    def search(self, kind: str, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` FAISS search of ``kind`` (passage | entity | fact)."""
        return self.vectors.search(kind, queries, k)


def memory_units(rows: Iterable[tuple[int, int, int, str, dict[str, Any]]]
                 ) -> tuple[dict[int, dict[str, Any]], UnitTimes]:
    """Hit fields and time span of every conversation memory unit (see :meth:`ReadView.memory_units`)."""
    records: dict[int, dict[str, Any]] = {}
    times: UnitTimes = {}
    for pid, start, end, _, meta in rows:
        rec = records[pid] = unit_record(meta, start, end)
        if rec["time"]:
            times[pid] = (datetime.fromisoformat(rec["time"]), datetime.fromisoformat(rec["time_end"]))
    return records, times


# the parts view_delta.derived_parts may give
DERIVED_PARTS = frozenset({"snapshot", "passage_count", "names", "unit_rows", "units", "turns",
                           "turn_vector_cache", "turn_bm25"})
# the parts a write builds for the next view, when readers used them in the current one (not the
# fingerprint: it stamps the disk caches, which a view built by a write does not use)
_WARMED_PARTS = {
    "snapshot": ReadView.snapshot,
    "passage_count": ReadView.passage_count, "names": ReadView.entity_names,
    "units": ReadView.memory_units, "turns": ReadView.memory_turns,
    "fact_times": ReadView.fact_times, "replaced": ReadView.has_replaced_facts,
    "turn_bm25": ReadView.turn_bm25, "bm25": ReadView.bm25,
}
WARM_AFTER_READ_S = 5.0
MAX_RECORDED_IDS = 1_000_000  # past this many ids touched since the current view, rebuild whole  # a write warms the next view only while reads have been coming


class Views:
    """The current :class:`ReadView` of one store, swapped when the generation moves on.

    While reads are coming (one in the last :data:`WARM_AFTER_READ_S`), a write builds the next
    generation's view before its commit (:meth:`prepare_next`, run by the store on the writing
    thread, inside the transaction: it reads the new rows, while readers carry on with the old
    view) and publishes it with the commit, so readers never wait for the view after a write.
    Without recent reads (bulk indexing), views stay lazy: built by the first read that needs them.
    """

    def __init__(self, store: GraphStore, vectors: VectorSet):
        self.store = store
        self.vectors = vectors
        self._view: ReadView | None = None
        self._lock = threading.Lock()
        self._last_read = 0.0
        # the changes committed since the current view's generation, up to _since_gen (None:
        # not known, e.g. a write that did not itemise them): a view built lazily for a later
        # generation derives its parts from the current one's through them
        self._since: GraphChanges | None = None
        self._since_gen = -1
        store.add_publisher(self.prepare_next)

    def current(self) -> ReadView:
        """The view of the store's generation now (call with ``store.lock`` held shared)."""
        self._last_read = time.monotonic()
        generation = self.store.generation
        view = self._view
        if view is not None and view.generation == generation:
            return view
        with self._lock:
            old = self._view
            if old is None or old.generation != generation:
                self._view = ReadView(self.store, self.vectors, generation)
                if old is not None and self._since is not None and self._since_gen == generation:
                    # a derived snapshot stays in memory (written to the disk cache at close)
                    self._view.derive_from(dict(old._parts), self._since)
                self._since, self._since_gen = GraphChanges(itemised=True), generation
            return self._view

    def built_names(self) -> EntityNames | None:
        """The entity names of the latest view if it has built them (None otherwise); safe
        without the lock because it builds nothing: a hint for work done before a read."""
        view = self._view
        return None if view is None else view._parts.get("names")

    def prepare_next(self, changes: GraphChanges) -> Callable[[], None] | None:
        """In a write transaction, before its COMMIT: the next generation's view with the parts
        the current one has built, and the callable that makes it current after the commit.
        When the current view is the generation just before and the write itemised its
        ``changes``, parts are derived from the current ones (:mod:`view_delta`), not re-read."""
        view = self._view
        generation = self.store.generation  # the transaction's own
        if view is None or generation == view.generation:
            return None
        if time.monotonic() - self._last_read > WARM_AFTER_READ_S:
            return lambda: self._record(changes, generation)  # after the commit: views stay lazy
        # in memory only: writing the snapshot files for every write would cost the writer a
        # save per commit; save_caches writes the last one when the index closes
        nxt = ReadView(self.store, self.vectors, generation, persist=False)
        with self._lock:  # writes since the view that stayed lazy, then this one
            since = self._since if self._since_gen == generation - 1 else None
        if since is not None:
            nxt._parts.update(derived_parts(dict(view._parts), self.store, since.merged(changes), generation))
        for key in list(view._parts):
            name, args = (key[0], key[1:]) if isinstance(key, tuple) else (key, ())
            build = _WARMED_PARTS.get(name)
            if build is not None:
                build(nxt, *args)

        def publish() -> None:
            with self._lock:
                if self.store.generation == nxt.generation:
                    self._view = nxt
                    self._since, self._since_gen = GraphChanges(itemised=True), nxt.generation
        return publish

    def _record(self, changes: GraphChanges, generation: int) -> None:
        """Add a committed write's ``changes`` (it made ``generation``) to those since the
        current view (they stop being known at a gap or past a size where rebuilding is cheaper)."""
        with self._lock:
            if self._since is not None and generation == self._since_gen:
                return  # a commit that left the generation (what readers see) as it was: a fold
            if self._since is None or self._since_gen != generation - 1:
                self._since = None
                return
            merged = self._since.merged(changes)
            self._since = merged if merged.itemised and merged.size() <= MAX_RECORDED_IDS else None
            self._since_gen = generation

    def save_caches(self) -> None:
        """Write the current view's graph snapshot and BM25 indexes to the disk caches when the
        view was built in memory by a write (:meth:`prepare_next`), and its snapshot when it was
        derived from an earlier view's, so the next open loads them instead of rebuilding them
        (call with ``store.lock`` held shared)."""
        view = self._view
        if view is None or self.store.read_only or view.generation != self.store.generation:
            return
        if "snapshot" in view._parts and (not view.persist or "snapshot" in view.derived):
            folder = cache_dir(self.store.root)
            try:
                save_snapshot(view.snapshot(), folder, view.fingerprint())
            except OSError as exc:
                logger.warning("cannot write graph cache %s (%s)", folder, exc)
        if view.persist:  # its BM25 indexes were saved as they were built
            return
        for key, part in list(view._parts.items()):
            if isinstance(key, tuple) and key[0] == "bm25":
                view.save_bm25(part)
