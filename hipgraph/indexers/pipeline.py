"""Batch indexing: documents → passages → extraction → embeddings → one DuckDB transaction.

Each batch commits atomically; FAISS files are updated and saved after the commit. A crash loses
at most the batch in flight, and re-adding the same documents resumes (unchanged ones are skipped).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import numpy as np
import pyarrow as pa

from hipgraph.config import IndexConfig
from hipgraph.indexers.compute import BatchWork
from hipgraph.indexers.documents import SkippedRecord, content_hash, text_hash, to_document
from hipgraph.indexers.executors import Executor, ThreadExecutor
from hipgraph.indexers.extract_base import Extractor
from hipgraph.indexers.graph_update import (
    Removed,
    add_fact_edge_counts,
    add_mention_edges,
    collect_orphans,
    delete_document_rows,
    fold_fact_edges,
    insert_mentions,
    refresh_entities,
    refresh_surface_forms,
    update_synonyms,
)
from hipgraph.indexers.learned_facts import PersistReport, persist_facts
from hipgraph.models.base import Embedder
from hipgraph.store.database import GraphStore
from hipgraph.store.vector_set import VectorSet
from hipgraph.text.facts import fact_text
from hipgraph.types import Chunk, Document, IndexReport, LearnedFact

logger = logging.getLogger(__name__)

Progress = Callable[[int], None]

# a batch appends its fact-edge counts as partial rows (see graph_update.add_fact_edge_counts);
# they are folded when they pass this many rows or 1/FOLD_SHARE of the fact edges, whichever is
# more (so folds get rarer as the index grows), and at the end of each write call
FOLD_MIN_ROWS = 65_536
FOLD_SHARE = 8
CHECKPOINT_SECONDS = 300.0  # FAISS files are saved at least this often during a long add


@dataclass
class _Batch:
    """A batch after the compute stages, ready for the write transaction."""

    docs: list[Document] = field(default_factory=list)
    hashes: list[str] = field(default_factory=list)
    seen: int = 0  # input records this batch accounts for (progress)
    report: IndexReport = field(default_factory=IndexReport)
    chunks: list[Chunk] = field(default_factory=list)
    chunk_doc: list[int] = field(default_factory=list)  # index into docs
    passage_vectors: np.ndarray | None = None
    mentions: list[tuple[int, str, str, str | None]] = field(default_factory=list)  # chunk, name, surface, label
    facts: list[tuple[int, str, str, str, str]] = field(default_factory=list)  # chunk, subj, rel, obj, kind
    entity_ids: dict[str, int] = field(default_factory=dict)  # existing names -> ids
    new_entities: list[str] = field(default_factory=list)
    new_entity_vectors: np.ndarray | None = None
    fact_ids: dict[tuple[str, str, str], int] = field(default_factory=dict)  # existing fact keys
    new_facts: list[tuple[str, str, str, str]] = field(default_factory=list)  # subj, rel, obj, kind
    new_fact_vectors: np.ndarray | None = None  # rows for new facts of kind 'triple', in order
    turn_keys: list[tuple[int, int]] = field(default_factory=list)  # chunk, turn position
    turn_vectors: np.ndarray | None = None


class Indexer:
    """Writes documents into one index: owns the add/delete transactions."""

    def __init__(
        self,
        store: GraphStore,
        vectors: VectorSet,
        embedder: Embedder,
        extractor_factory: Callable[[], Extractor],
        config: IndexConfig,
    ):
        self.store = store
        self.vectors = vectors
        self.embedder = embedder
        self._extractor_factory = extractor_factory
        self._extractor: Extractor | None = None
        self.config = config
        # partial fact-edge rows appended since the last fold, and how many trigger the next one
        self._unfolded = 0
        self._fold_at = FOLD_MIN_ROWS

    @property
    def extractor(self) -> Extractor:
        if self._extractor is None:
            self._extractor = self._extractor_factory()
        return self._extractor

    def local_executor(self) -> Executor:
        """The default executor: this process, extraction and embedding on a thread each."""
        return ThreadExecutor(lambda: self.extractor, self.embedder, self.config)

    # ------------------------------------------------------------------ public
    def add_documents(
        self,
        records: Iterable[Document | Mapping[str, Any]],
        *,
        progress: Progress | None = None,
        batch_size: int | None = None,
        executor: Executor | None = None,
    ) -> IndexReport:
        """Add or replace documents in batches; each batch is one transaction. ``batch_size``
        fixes the batches' size; by default they start at ``IndexConfig.batch_size`` and grow
        with the index (:meth:`_batch_sizes`).

        ``executor`` runs the per-document work (default: :meth:`local_executor`) and hands the
        batches back in input order; writes stay on the calling thread. Records are read as a
        stream: only the batches in flight are held in memory. FAISS files are saved when the
        call ends and every :data:`CHECKPOINT_SECONDS` (DuckDB, saved per batch, is the truth).
        Writers on other threads wait their turn; readers go on and see each batch once committed.
        A list (any sequence) is checked whole before its first batch, so a bad record refuses it
        with nothing written; an iterator is checked batch by batch.
        """
        if isinstance(records, Sequence):
            for n, record in enumerate(records):
                with contextlib.suppress(SkippedRecord):  # counted when its batch is read
                    to_document(record, where=_where(record, n))
        with self.store.writing():
            return self._add_documents(records, progress, batch_size, executor)

    def _batch_sizes(self, batch_size: int | None) -> Callable[[int], int]:
        """The size of each next batch, given how many documents this call batched so far:
        ``batch_size`` when given, else ``config.batch_size`` growing to ``config.batch_growth``
        of the documents held (those batched included), at most ``config.max_batch_size``. A
        batch's lookups scan the tables they join with, so fixed batches cost more each as the
        index grows (a quadratic build); growing ones keep those scans a fixed share."""
        if batch_size:
            return lambda batched: batch_size
        config = self.config
        first, cap, growth = config.batch_size, max(config.batch_size, config.max_batch_size), config.batch_growth
        held = 0
        if growth:
            held = int(self.store.con.execute("SELECT count(*) FROM documents").fetchall()[0][0])
        return lambda batched: min(cap, max(first, int((held + batched) * growth)))

    def _add_documents(self, records, progress, batch_size, executor) -> IndexReport:
        sizes = self._batch_sizes(batch_size)
        report = IndexReport()
        in_flight: dict[str, str] = {}  # id -> content hash of documents planned, not yet written

        def planned():
            for docs, seen in self._batches(records, sizes, report, progress):
                batch = self._plan(docs, in_flight)
                batch.seen = seen
                if not batch.docs:
                    self._finish(batch, None, report, progress)
                    continue
                in_flight.update(zip((d.id for d in batch.docs), batch.hashes, strict=True))
                yield batch, batch.docs

        own = executor is None
        executor = executor or self.local_executor()
        last_save = time.monotonic()
        failed = False
        try:
            for batch, work in executor.map(planned()):
                self._finish(batch, work, report, progress)
                for doc, h in zip(batch.docs, batch.hashes, strict=True):
                    if in_flight.get(doc.id) == h:
                        del in_flight[doc.id]
                if time.monotonic() - last_save > CHECKPOINT_SECONDS:
                    self.vectors.save()
                    last_save = time.monotonic()
            self._fold_fact_edges()
        except BaseException:
            failed = True
            raise
        finally:
            if own:
                executor.close()
            if failed:
                self._fold_after_failure()
                self._save_vectors_after_failure()
            else:
                self.vectors.checkpoint()
        return report

    def _fold_fact_edges(self) -> None:
        """Fold the partial fact-edge rows this writer appended (one transaction), so that the
        table holds one row per edge between write calls."""
        if self._unfolded:
            with self.store.transaction():
                self._fold_in_transaction()

    def _fold_in_transaction(self) -> None:
        edges = fold_fact_edges(self.store)
        self._unfolded = 0
        self._fold_at = max(FOLD_MIN_ROWS, edges // FOLD_SHARE)

    def _fold_after_failure(self) -> None:
        """Fold what the batches committed before a failure appended, without masking the
        failure: readers sum partial rows, so an unfolded table is complete, only longer."""
        try:
            with self.store.transaction():
                self._fold_in_transaction()
        except Exception as exc:  # the failure in flight is the one to report
            logger.warning("fact edges left unfolded after the failed batch (%s); readers sum "
                           "them, and the next add that writes facts folds them", exc)

    def _save_vectors_after_failure(self) -> None:
        """Save the FAISS files of the batches committed before a failure without masking it: a
        file that cannot be written (the full disk that failed the commit) keeps its previous
        version, and the next open rebuilds it from DuckDB."""
        try:
            self.vectors.save()
        except Exception as exc:  # the failure in flight is the one to report
            logger.warning("FAISS files not saved after the failed batch (%s); the next open "
                           "rebuilds them from DuckDB", exc)

    def _batches(self, records, sizes: Callable[[int], int], report: IndexReport, progress: Progress | None):
        """Validated documents in batches of ``sizes(documents batched before)`` (a repeated id:
        the later record wins)."""
        batch: dict[str, Document] = {}
        seen = batched = 0
        size = sizes(0)
        for n, record in enumerate(records):
            where = _where(record, n)
            try:
                doc = to_document(record, where=where)
            except SkippedRecord as skip:
                report.skipped += 1
                report.warnings.append(str(skip))
                logger.warning("%s", skip)
                if progress:
                    progress(1)
                continue
            seen += 1
            if doc.id in batch:
                report.warnings.append(f"{where}: document {doc.id!r} repeated in one batch; the later one wins")
            batch[doc.id] = doc
            if len(batch) >= size:
                yield list(batch.values()), seen
                batched += len(batch)
                size = sizes(batched)
                batch, seen = {}, 0
        if batch:
            yield list(batch.values()), seen

    def delete_documents(self, keys: Sequence[str]) -> IndexReport:
        """Delete documents by id; unknown ids are counted as warnings, not errors."""
        with self.store.writing():
            return self._delete_documents(keys)

    def _delete_documents(self, keys: Sequence[str]) -> IndexReport:
        report = IndexReport()
        keys = [str(k) for k in keys]
        t0 = time.perf_counter()
        found = self._existing(keys)
        missing = sorted(set(keys) - set(found))
        for key in missing:
            report.warnings.append(f"document {key!r} is not in the index")
        if not found:
            return report
        removed = Removed()
        with self.store.transaction():
            delete_document_rows(self.store, [found[k][0] for k in found], removed)
            collect_orphans(self.store, removed)
            refresh_entities(self.store, removed.affected_entities - removed.entities)
            self._synonyms(np.zeros(0, np.int64), None, removed)
            self.store.changes.itemised = True
            self.store.bump_generation()
            self.store.on_commit(lambda: self.vectors.apply(removed, added={}, save=False))
            t1 = time.perf_counter()
        report.deleted = len(found)
        report.seconds["graph"] = t1 - t0
        self.vectors.checkpoint()
        report.seconds["write"] = time.perf_counter() - t1  # commit, FAISS update and save
        return report

    def persist_learned_facts(self, facts: Sequence[LearnedFact], extractor: str) -> PersistReport:
        """Store facts learned at query time (see :mod:`hipgraph.indexers.learned_facts`) in one
        transaction, their provenance naming ``extractor``; returns the ids they got."""
        with self.store.writing():
            report = persist_facts(self.store, self.vectors, self.embedder, facts, extractor=extractor)
            self.vectors.checkpoint()
        return report

    # ------------------------------------------------------------------ one batch
    def _existing(self, keys: Sequence[str]) -> dict[str, tuple[int, str]]:
        table = pa.table({"key": pa.array(list(keys), pa.string())})
        self.store.con.register("_keys", table)
        try:
            rows = self.store.con.execute(
                "SELECT d.key, d.id, d.content_hash FROM documents d JOIN _keys k ON d.key = k.key"
            ).fetchall()
        finally:
            self.store.unregister("_keys")
        return {key: (int(doc_id), h) for key, doc_id, h in rows}

    def _plan(self, docs: list[Document], pending: dict[str, str]) -> _Batch:
        """Drop unchanged documents (equal to the version in a batch still being written, else to
        the stored one) and chunk."""
        existing = self._existing([d.id for d in docs])
        batch = _Batch()
        for doc in docs:
            h = content_hash(doc)
            old = existing.get(doc.id)
            # a version planned but not yet written is what this one replaces, not the stored one
            current = pending[doc.id] if doc.id in pending else (old[1] if old is not None else None)
            if current == h:
                batch.report.unchanged += 1
                continue
            batch.docs.append(doc)
            batch.hashes.append(h)
        return batch

    def _finish(self, batch: _Batch, work: BatchWork | None, report: IndexReport,
                progress: Progress | None) -> None:
        if work is not None:
            batch.chunks, batch.chunk_doc = work.chunks, work.chunk_doc
            batch.mentions, batch.facts = work.mentions, work.facts
            batch.report.passages = len(work.chunks)
            for stage, seconds in work.seconds.items():
                batch.report.seconds[stage] = batch.report.seconds.get(stage, 0.0) + seconds
            with _timed(batch.report, "graph"):
                self._resolve_existing(batch)
            batch.passage_vectors = work.passage_vectors
            batch.turn_keys, batch.turn_vectors = work.turn_keys, work.turn_vectors
            batch.new_entity_vectors = work.name_vector_rows(batch.new_entities)
            batch.new_fact_vectors = work.fact_vector_rows(
                [fact_text(s, r, o) for s, r, o, kind in batch.new_facts if kind == "triple"])
            self._write(batch, batch.report)
        report.merge(batch.report)
        release_freed_memory()
        if progress:
            progress(batch.seen)

    def _resolve_existing(self, batch: _Batch) -> None:
        """Find which entity names and fact keys already exist; list the new ones."""
        con = self.store.con
        names = sorted({m[1] for m in batch.mentions})
        if names:
            con.register("_names", pa.table({"name": pa.array(names, pa.string())}))
            try:
                rows = con.execute(
                    "SELECT e.name, e.id FROM entities e JOIN _names n ON e.name = n.name").fetchall()
            finally:
                self.store.unregister("_names")
            batch.entity_ids = {name: int(eid) for name, eid in rows}
        batch.new_entities = [n for n in names if n not in batch.entity_ids]
        keys = sorted({(s, r, o, kind) for _, s, r, o, kind in batch.facts})
        known = [(s, r, o) for s, r, o, _ in keys if s in batch.entity_ids and o in batch.entity_ids]
        if known:
            table = pa.table({
                "subject_id": pa.array([batch.entity_ids[s] for s, _, _ in known], pa.int64()),
                "relation": pa.array([r for _, r, _ in known], pa.string()),
                "object_id": pa.array([batch.entity_ids[o] for _, _, o in known], pa.int64()),
            })
            con.register("_fkeys", table)
            try:
                rows = con.execute("""
                    SELECT f.subject_id, f.relation, f.object_id, f.id FROM facts f
                    JOIN _fkeys k USING (subject_id, relation, object_id)""").fetchall()
            finally:
                self.store.unregister("_fkeys")
            by_ids = {(int(s), r, int(o)): int(fid) for s, r, o, fid in rows}
            for s, r, o in known:
                fid = by_ids.get((batch.entity_ids[s], r, batch.entity_ids[o]))
                if fid is not None:
                    batch.fact_ids[(s, r, o)] = fid
        seen: set[tuple[str, str, str]] = set()
        for s, r, o, kind in keys:
            if (s, r, o) not in batch.fact_ids and (s, r, o) not in seen:
                seen.add((s, r, o))
                batch.new_facts.append((s, r, o, kind))

    def _write(self, batch: _Batch, report: IndexReport) -> None:
        store = self.store
        removed = Removed()
        extractor_name = self.extractor.name
        t_write = time.perf_counter()
        t_graph = 0.0
        with store.transaction():
            existing = self._existing([d.id for d in batch.docs])
            report.replaced += len(existing)
            report.added += len(batch.docs) - len(existing)
            delete_document_rows(store, [doc_id for doc_id, _ in existing.values()], removed)
            now = datetime.now(timezone.utc).replace(tzinfo=None)
            ids = store.allocate_id_blocks({"document": len(batch.docs), "passage": len(batch.chunks),
                                            "entity": len(batch.new_entities), "fact": len(batch.new_facts)})
            doc_ids = ids["document"]
            store.insert("documents", {
                "id": doc_ids,
                "key": [d.id for d in batch.docs],
                "title": [d.title for d in batch.docs],
                "content_hash": batch.hashes,
                "metadata": [json.dumps(d.metadata, sort_keys=True, ensure_ascii=False) for d in batch.docs],
                "added_at": pa.array([now] * len(batch.docs), pa.timestamp("us")),
            })
            passage_ids = ids["passage"]
            store.insert("passages", {
                "id": passage_ids,
                "doc_id": pa.array([int(doc_ids[i]) for i in batch.chunk_doc], pa.int64()),
                "ordinal": pa.array([c.ordinal for c in batch.chunks], pa.int32()),
                "title": [c.title for c in batch.chunks],
                "text": [c.text for c in batch.chunks],
                "start_char": pa.array([c.start for c in batch.chunks], pa.int32()),
                "end_char": pa.array([c.end for c in batch.chunks], pa.int32()),
                "text_hash": [text_hash(c.title, c.text) for c in batch.chunks],
            })
            store.write_vectors("passage", passage_ids, batch.passage_vectors)
            store.changes.touch_passages(passage_ids)
            if batch.turn_keys:
                store.write_turn_vectors(passage_ids[[c for c, _ in batch.turn_keys]],
                                         np.array([p for _, p in batch.turn_keys]), batch.turn_vectors)

            new_entity_ids = ids["entity"]
            entity_ids = dict(batch.entity_ids)
            entity_ids.update(zip(batch.new_entities, new_entity_ids.tolist(), strict=True))
            store.insert("entities", {
                "id": new_entity_ids,
                "name": pa.array(batch.new_entities, pa.string()),
                "label": pa.array([None] * len(batch.new_entities), pa.string()),
                "surface_forms": pa.array([[] for _ in batch.new_entities], pa.list_(pa.string())),
            })
            store.write_vectors("entity", new_entity_ids, batch.new_entity_vectors)
            store.changes.touch_entities(new_entity_ids)
            store.changes.touch_labels(new_entity_ids)
            mention_passages = passage_ids[[ci for ci, _, _, _ in batch.mentions]]
            mention_entities = np.array([entity_ids[name] for _, name, _, _ in batch.mentions], dtype=np.int64)
            insert_mentions(store, mention_passages, mention_entities,
                            [s for _, _, s, _ in batch.mentions], [lb for _, _, _, lb in batch.mentions])

            new_fact_ids = ids["fact"]
            fact_ids = dict(batch.fact_ids)
            fact_ids.update(zip([(s, r, o) for s, r, o, _ in batch.new_facts], new_fact_ids.tolist(), strict=True))
            store.insert("facts", {
                "id": new_fact_ids,
                "subject_id": pa.array([entity_ids[s] for s, _, _, _ in batch.new_facts], pa.int64()),
                "relation": pa.array([r for _, r, _, _ in batch.new_facts], pa.string()),
                "object_id": pa.array([entity_ids[o] for _, _, o, _ in batch.new_facts], pa.int64()),
                "kind": pa.array([k for _, _, _, k in batch.new_facts], pa.string()),
            })
            store.changes.touch_facts(new_fact_ids)
            triple_mask = np.array([k == "triple" for *_, k in batch.new_facts], dtype=bool)
            store.write_vectors("fact", new_fact_ids[triple_mask], batch.new_fact_vectors)
            store.insert("fact_sources", {
                "fact_id": pa.array([fact_ids[(s, r, o)] for _, s, r, o, _ in batch.facts], pa.int64()),
                "passage_id": pa.array([int(passage_ids[ci]) for ci, *_ in batch.facts], pa.int64()),
                "extractor": pa.array([extractor_name] * len(batch.facts), pa.string()),
            })

            t0 = time.perf_counter()
            collect_orphans(store, removed)
            refresh = removed.affected_entities - removed.entities  # recomputed from provenance
            refresh_entities(store, refresh)
            refresh_surface_forms(store, set(mention_entities.tolist()) - refresh - removed.entities)
            subjects = np.array([entity_ids[s] for _, s, _, _, _ in batch.facts], dtype=np.int64)
            objects = np.array([entity_ids[o] for _, _, _, o, _ in batch.facts], dtype=np.int64)
            if refresh:  # pairs touching a refreshed entity already count this batch's sources
                stale = np.array(sorted(refresh), dtype=np.int64)
                keep = ~(np.isin(subjects, stale) | np.isin(objects, stale))
                subjects, objects = subjects[keep], objects[keep]
            self._unfolded += add_fact_edge_counts(store, subjects, objects)
            if self._unfolded >= self._fold_at:
                self._fold_in_transaction()
            add_mention_edges(store, mention_passages, mention_entities)
            n_synonyms = self._synonyms(new_entity_ids, batch.new_entity_vectors, removed)
            t_graph = time.perf_counter() - t0
            store.changes.itemised = True  # every graph row this batch touched is recorded
            store.bump_generation()
            added = {
                "passage": (passage_ids, batch.passage_vectors),
                "entity": (new_entity_ids, batch.new_entity_vectors),
                "fact": (new_fact_ids[triple_mask], batch.new_fact_vectors),
            }
            # FAISS changes with the commit, before readers see the new generation
            store.on_commit(lambda: self.vectors.apply(removed, added=added, save=False))
        report.entities_new += len(batch.new_entities)
        report.facts_new += len(batch.new_facts)
        report.synonym_edges_new += n_synonyms
        report.seconds["graph"] = report.seconds.get("graph", 0.0) + t_graph
        report.seconds["write"] = report.seconds.get("write", 0.0) + time.perf_counter() - t_write - t_graph

    def _synonyms(self, new_ids: np.ndarray, new_vectors: np.ndarray, removed: Removed) -> int:
        dim = self.vectors.dimension
        removed_vectors = removed.entity_vectors if removed.entity_vectors is not None else np.zeros((0, dim), np.float32)
        if new_vectors is None or len(new_vectors) == 0:
            new_vectors = np.zeros((0, dim), np.float32)
        return update_synonyms(self.store, self.vectors.indexes["entity"], new_ids, new_vectors,
                               removed.entity_vector_ids, removed_vectors, self.config.synonyms)


def _where(record: Any, n: int) -> str:
    """How errors name input record ``n``: its reader's ``_where`` (file and line) if it has one."""
    where = record.get("_where") if isinstance(record, Mapping) else None
    return where if isinstance(where, str) else f"record {n}"


@contextmanager
def _timed(report: IndexReport, stage: str):
    t0 = time.perf_counter()
    try:
        yield
    finally:
        report.seconds[stage] = report.seconds.get(stage, 0.0) + time.perf_counter() - t0


def release_freed_memory() -> None:
    """Hand memory freed by a batch back to the OS (glibc keeps it otherwise; peak RSS grows)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None
