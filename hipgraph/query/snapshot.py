"""The query-time graph snapshot: node order, CSR adjacency and lookup arrays, built from DuckDB.

Node order: passages ``0 .. P-1`` (ascending passage id), then entities ``P .. P+E-1`` (ascending
entity id). The CSR holds every edge in both directions (mention passage–entity, fact and synonym
entity–entity; parallel edges summed), so it is symmetric and PPR needs no transpose.

A snapshot is a pure function of the stored graph. It is written beside the database as plain
``.npy`` files under ``cache/graph/`` stamped with the index ``generation`` (bumped by every write),
a fingerprint of the database rows it was built from (:func:`reads.content_fingerprint`) and
per-array checksums, and loaded memory-mapped after verifying all of them and the arrays' shapes
and index ranges; a stale, foreign or damaged cache is rebuilt (a read-only folder keeps the
rebuilt snapshot in memory only).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from hipgraph.query.ppr import PPRGraph, prepare_graph, to_csr
from hipgraph.store import reads
from hipgraph.store.database import GraphStore

logger = logging.getLogger(__name__)

SNAPSHOT_FORMAT = 3
_ARRAYS = ("passage_ids", "entity_ids", "indptr", "indices", "weights", "entity_passage_indptr",
           "entity_passage_indices", "fact_ids", "fact_subject", "fact_object")


@dataclass(frozen=True)
class GraphSnapshot:
    """Arrays over one node order (see module docstring); all read-only."""

    generation: int
    passage_ids: np.ndarray  # (P,) int64 ascending: node i is passage passage_ids[i]
    entity_ids: np.ndarray  # (E,) int64 ascending: node P + j is entity entity_ids[j]
    indptr: np.ndarray  # (P+E+1,) int64 symmetric CSR
    indices: np.ndarray  # int32 neighbour nodes
    weights: np.ndarray  # float64 edge weights
    entity_passage_indptr: np.ndarray  # (E+1,) int64: entity -> passages CSR (the mention matrix)
    entity_passage_indices: np.ndarray  # int32 passage nodes mentioning each entity, ascending
    fact_ids: np.ndarray  # (F,) int64 ascending, retrievable facts (kind 'triple')
    fact_subject: np.ndarray  # (F,) int32 entity index (0 .. E-1) of the subject
    fact_object: np.ndarray  # (F,) int32 entity index of the object
    ppr_graph: PPRGraph

    @cached_property
    def entity_passage_count(self) -> np.ndarray:
        """(E,) distinct passages mentioning each entity."""
        return np.diff(self.entity_passage_indptr).astype(np.int32)

    @cached_property
    def entity_facts(self) -> tuple[np.ndarray, np.ndarray]:
        """``(indptr, fact rows)``: the stored facts each entity index is subject or object of."""
        n_f = self.fact_ids.size
        ents = np.concatenate([self.fact_subject, self.fact_object]).astype(np.int64)
        rows = np.concatenate([np.arange(n_f), np.arange(n_f)])
        ok = ents >= 0
        ents, rows = ents[ok], rows[ok]
        order = np.argsort(ents, kind="stable")
        indptr = np.zeros(self.n_entities + 1, np.int64)
        np.cumsum(np.bincount(ents, minlength=self.n_entities), out=indptr[1:])
        return indptr, rows[order]

    def entity_passages(self, entity: int) -> np.ndarray:
        """Passage nodes that mention entity index ``entity``."""
        lo, hi = int(self.entity_passage_indptr[entity]), int(self.entity_passage_indptr[entity + 1])
        return self.entity_passage_indices[lo:hi]

    @property
    def n_passages(self) -> int:
        return int(self.passage_ids.size)

    @property
    def n_entities(self) -> int:
        return int(self.entity_ids.size)

    @property
    def n_nodes(self) -> int:
        return self.n_passages + self.n_entities

    def passage_nodes(self, passage_ids: np.ndarray) -> np.ndarray:
        """Node index of each passage id, -1 where the id is not in the snapshot."""
        return _lookup(self.passage_ids, passage_ids)

    def entity_index(self, entity_ids: np.ndarray) -> np.ndarray:
        """Entity index (node - P) of each entity id, -1 where unknown."""
        return _lookup(self.entity_ids, entity_ids)

    def fact_index(self, fact_ids: np.ndarray) -> np.ndarray:
        """Row of each fact id in the fact arrays, -1 where unknown (e.g. a co-occurrence)."""
        return _lookup(self.fact_ids, fact_ids)

    @property
    def out_weight(self) -> np.ndarray:
        """Total edge weight at each node (the PPR transition denominator)."""
        return self.ppr_graph.out_weight

    def neighbors(self, node: int) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = int(self.indptr[node]), int(self.indptr[node + 1])
        return self.indices[lo:hi], self.weights[lo:hi]


def _lookup(sorted_ids: np.ndarray, ids: np.ndarray) -> np.ndarray:
    ids = np.asarray(ids, dtype=np.int64)
    if sorted_ids.size == 0:
        return np.full(ids.shape, -1, dtype=np.int64)
    pos = np.searchsorted(sorted_ids, ids)
    pos_c = np.minimum(pos, sorted_ids.size - 1)
    return np.where(sorted_ids[pos_c] == ids, pos_c, -1).astype(np.int64)


def build_snapshot(store: GraphStore) -> GraphSnapshot:
    """Read the graph from DuckDB into a fresh :class:`GraphSnapshot`."""
    generation = store.generation
    cols = reads.snapshot_columns(store)
    (passage_ids,), (entity_ids,) = cols["passages"], cols["entities"]
    passage_ids = passage_ids.astype(np.int64)
    entity_ids = entity_ids.astype(np.int64)
    n_p, n_e = passage_ids.size, entity_ids.size
    src_m, dst_m = cols["mentions"]
    src_e, dst_e, w_e = cols["entity_edges"]
    mention_src = _lookup(passage_ids, src_m)
    mention_dst = _lookup(entity_ids, dst_m)
    ent_src = _lookup(entity_ids, src_e)
    ent_dst = _lookup(entity_ids, dst_e)
    ok_m = (mention_src >= 0) & (mention_dst >= 0)
    ok_e = (ent_src >= 0) & (ent_dst >= 0)
    # node numbers as int32, the edge arrays of a large index being its largest temporaries;
    # checked first, so that they cannot wrap (prepare_graph's limit, raised as it raises it)
    if n_p + n_e >= 2**31:
        raise ValueError(f"at most 2**31 - 1 nodes are supported, got {n_p + n_e}")
    m_src, m_dst = mention_src[ok_m].astype(np.int32), mention_dst[ok_m].astype(np.int32)
    del mention_src, mention_dst, src_m, dst_m, cols["mentions"]
    src = np.concatenate([m_src, (n_p + ent_src[ok_e]).astype(np.int32)])
    dst = np.concatenate([n_p + m_dst, (n_p + ent_dst[ok_e]).astype(np.int32)])
    weight = np.concatenate([np.ones(m_src.size), np.asarray(w_e, np.float64)[ok_e]])
    del ent_src, ent_dst, src_e, dst_e, w_e, cols["entity_edges"]
    indptr, indices, weights = to_csr(n_p + n_e, src, dst, weight, undirected=True)
    del src, dst, weight
    # entity -> passage matrix (mention edges are distinct per passage-entity pair)
    ep_indptr, ep_indices, _ = to_csr(n_e, m_dst, m_src, undirected=False, n_cols=n_p)
    fid, fs, fo = cols["facts"]
    return _assemble(generation, {
        "passage_ids": passage_ids, "entity_ids": entity_ids,
        "indptr": indptr, "indices": indices, "weights": weights,
        "entity_passage_indptr": ep_indptr, "entity_passage_indices": ep_indices,
        "fact_ids": fid.astype(np.int64),
        "fact_subject": _lookup(entity_ids, fs).astype(np.int32),
        "fact_object": _lookup(entity_ids, fo).astype(np.int32),
    })


def _assemble(generation: int, arrays: dict[str, np.ndarray]) -> GraphSnapshot:
    # the arrays come from to_csr or the splice, or were verified on load (snapshot_problem)
    graph = prepare_graph(arrays["indptr"], arrays["indices"], arrays["weights"], symmetric=True,
                          validate=False)
    return GraphSnapshot(generation=generation, ppr_graph=graph, **{k: arrays[k] for k in _ARRAYS})


# ---------------------------------------------------------------------- on-disk cache
_DTYPES = {"passage_ids": np.int64, "entity_ids": np.int64, "indptr": np.int64, "indices": np.int32,
           "weights": np.float64, "entity_passage_indptr": np.int64,
           "entity_passage_indices": np.int32, "fact_ids": np.int64, "fact_subject": np.int32,
           "fact_object": np.int32}


def cache_dir(root: Path) -> Path:
    return root / "cache" / "graph"


def array_checksum(array: np.ndarray) -> int:
    """Wrapping int64 sum of an array's values (of its bits, for floats): any changed value shows."""
    values = np.asarray(array)
    if values.dtype.kind == "f":
        values = values.view(np.int64 if values.itemsize == 8 else np.int32)
    return int(np.sum(values, dtype=np.int64))


def save_snapshot(snapshot: GraphSnapshot, folder: Path, fingerprint: dict[str, int]) -> None:
    """Write the arrays and a stamp (generation, the database ``fingerprint`` it was built from,
    sizes and per-array checksums) into ``folder`` atomically (temp folder, then rename)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for name in _ARRAYS:
        np.save(tmp / f"{name}.npy", np.ascontiguousarray(getattr(snapshot, name)))
    stamp = {"format": SNAPSHOT_FORMAT, "generation": snapshot.generation,
             "fingerprint": fingerprint, "passages": snapshot.n_passages,
             "entities": snapshot.n_entities, "facts": int(snapshot.fact_ids.size),
             "checksums": {name: array_checksum(getattr(snapshot, name)) for name in _ARRAYS}}
    (tmp / "snapshot.json").write_text(json.dumps(stamp), encoding="utf-8")
    old = folder.with_name(f".{folder.name}.{os.getpid()}.old")
    if folder.exists():
        os.replace(folder, old)
    os.replace(tmp, folder)
    shutil.rmtree(old, ignore_errors=True)


def load_snapshot(folder: Path, generation: int, fingerprint: dict[str, int]) -> GraphSnapshot | None:
    """The cached snapshot of ``generation`` built from a database with ``fingerprint``,
    memory-mapped and verified (:func:`snapshot_problem`); None when absent, stale or damaged."""
    try:
        stamp = json.loads((folder / "snapshot.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        logger.warning("graph cache %s unreadable (%s); rebuilding", folder, exc)
        return None
    if not isinstance(stamp, dict) or stamp.get("format") != SNAPSHOT_FORMAT \
            or stamp.get("generation") != generation:
        return None  # another format or generation: stale, not damaged
    if stamp.get("fingerprint") != fingerprint:
        logger.warning("graph cache %s was built from other database content than %s holds now "
                       "(same generation %d); rebuilding", folder, folder.parents[1], generation)
        return None
    try:
        arrays = {name: np.load(folder / f"{name}.npy", mmap_mode="r", allow_pickle=False)
                  for name in _ARRAYS}
        problem = snapshot_problem(arrays, stamp)
        snapshot = None if problem else _assemble(generation, arrays)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        problem = str(exc) or type(exc).__name__
    if problem:
        logger.warning("graph cache %s damaged (%s); rebuilding", folder, problem)
        return None
    return snapshot


def snapshot_problem(arrays: dict[str, np.ndarray], stamp: dict) -> str | None:
    """Why ``arrays`` are not the snapshot ``stamp`` describes (None when they are): dtypes and
    sizes, per-array checksums, ascending unique ids, both CSRs' offsets and index ranges, fact
    endpoints and edge weights."""
    n_p, n_e, n_f = int(stamp["passages"]), int(stamp["entities"]), int(stamp["facts"])
    sizes = {"passage_ids": n_p, "entity_ids": n_e, "indptr": n_p + n_e + 1,
             "weights": arrays["indices"].size, "entity_passage_indptr": n_e + 1,
             "fact_ids": n_f, "fact_subject": n_f, "fact_object": n_f}
    for name, dtype in _DTYPES.items():
        array = arrays[name]
        if array.dtype != dtype or array.ndim != 1 or array.size != sizes.get(name, array.size):
            return (f"{name}.npy holds {array.dtype} {array.shape}, expected {np.dtype(dtype)} "
                    f"({sizes.get(name, 'any')},)")
        if array_checksum(array) != stamp["checksums"][name]:
            return f"{name}.npy differs from the array saved (checksum)"
    for name in ("passage_ids", "entity_ids", "fact_ids"):
        ids = arrays[name]
        if ids.size > 1 and not bool(np.all(ids[1:] > ids[:-1])):
            return f"{name}.npy is not strictly ascending"
    for indptr, indices, n_cols in (("indptr", "indices", n_p + n_e),
                                    ("entity_passage_indptr", "entity_passage_indices", n_p)):
        ptr, idx = arrays[indptr], arrays[indices]
        if ptr[0] != 0 or ptr[-1] != idx.size or bool(np.any(np.diff(ptr) < 0)):
            return f"{indptr}.npy is not monotone from 0 to {idx.size}"
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= n_cols):
            return f"{indices}.npy has nodes outside [0, {n_cols})"
    for name in ("fact_subject", "fact_object"):
        ends = arrays[name]
        if ends.size and (int(ends.min()) < -1 or int(ends.max()) >= n_e):
            return f"{name}.npy has entity indices outside [-1, {n_e})"
    weights = arrays["weights"]
    if not bool(np.all(np.isfinite(weights))) or (weights.size and float(weights.min()) < 0):
        return "weights.npy holds negative or non-finite weights"
    return None


def current_snapshot(store: GraphStore, previous: GraphSnapshot | None = None,
                     generation: int | None = None,
                     fingerprint: dict[str, int] | None = None) -> GraphSnapshot:
    """The snapshot of the store's current generation (read from ``meta`` unless given):
    ``previous`` if still current, else the cached files when they verify against the database's
    ``fingerprint`` (:func:`reads.content_fingerprint` unless given), else a fresh build (saved
    to the cache when the folder is writable)."""
    if generation is None:
        generation = store.generation
    if previous is not None and previous.generation == generation:
        return previous
    if fingerprint is None:
        fingerprint = reads.content_fingerprint(store)
    folder = cache_dir(store.root)
    snapshot = load_snapshot(folder, generation, fingerprint)
    if snapshot is not None:
        return snapshot
    snapshot = build_snapshot(store)
    try:
        save_snapshot(snapshot, folder, fingerprint)
    except OSError as exc:
        logger.warning("cannot write graph cache %s (%s); keeping it in memory", folder, exc)
        return snapshot
    return load_snapshot(folder, generation, fingerprint) or snapshot
