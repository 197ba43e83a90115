"""The next generation's graph snapshot from the previous one and what a write changed.

A write touches few rows; rebuilding the snapshot from every row of the index after each write
costs the writer time that grows with the index (1.5 s at 100k passages). :func:`update_snapshot`
re-reads only the rows a write recorded as touched (:class:`~hipgraph.store.changes.GraphChanges`)
and splices them into the previous arrays:

- node ids: the previous ids minus the touched ones, plus the touched ones still stored;
- edges: every previous edge with neither end touched and not between a touched pair keeps its
  weight (its ends renumbered), every stored edge with a touched end or between a touched pair
  is read again; rows are merged so that columns stay sorted, as :func:`to_csr` leaves them;
- facts: the previous triple facts minus the touched ones, plus the touched ones still stored.

The result equals :func:`~hipgraph.query.snapshot.build_snapshot` on the same rows array for
array, weights included (an unordered pair has at most a fact and a synonym edge, and the sum
of two floats does not depend on their order); ``tests/test_snapshot_delta.py`` checks this over
sequences of adds, replaces, deletes, conversations and learned facts.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from hipgraph.query.ppr import to_csr
from hipgraph.query.snapshot import GraphSnapshot, _assemble, _lookup
from hipgraph.store import reads
from hipgraph.store.changes import GraphChanges
from hipgraph.store.database import GraphStore

# past this share of touched nodes a whole rebuild costs no more than splicing
REBUILD_SHARE = 0.25


def worth_splicing(snapshot: GraphSnapshot, changes: GraphChanges) -> bool:
    """Whether ``changes`` can be spliced into ``snapshot`` (an itemised record touching less
    than :data:`REBUILD_SHARE` of its nodes)."""
    touched = len(changes.passages) + len(changes.entities) + len(changes.pairs)
    return changes.itemised and touched <= REBUILD_SHARE * max(snapshot.n_nodes, 1)


def update_snapshot(old: GraphSnapshot, store: GraphStore, changes: GraphChanges,
                    generation: int) -> GraphSnapshot:
    """The snapshot of ``generation`` (the rows ``store.con`` sees now), given ``old`` and the
    ``changes`` made since it (module docstring)."""
    tp = np.unique(np.fromiter(changes.passages, dtype=np.int64))
    te = np.unique(np.fromiter(changes.entities, dtype=np.int64))
    gone_p = np.unique(np.fromiter(changes.gone_passages, dtype=np.int64))
    gone_e = np.unique(np.fromiter(changes.gone_entities, dtype=np.int64))
    # touched ids not removed are stored (added, or kept with edges rewritten)
    passage_ids = _merged(np.setdiff1d(old.passage_ids, gone_p, assume_unique=True),
                          np.setdiff1d(tp, gone_p, assume_unique=True))
    entity_ids = _merged(np.setdiff1d(old.entity_ids, gone_e, assume_unique=True),
                         np.setdiff1d(te, gone_e, assume_unique=True))
    n_p, n_e = passage_ids.size, entity_ids.size
    old_p, old_e = old.n_passages, old.n_entities

    # old node -> new node (-1: removed); old nodes whose every edge is read again
    p_map = _lookup(passage_ids, old.passage_ids)
    e_map = _lookup(entity_ids, old.entity_ids)
    node_map = np.concatenate([p_map, np.where(e_map >= 0, n_p + e_map, -1)])
    p_drop = np.isin(old.passage_ids, tp, assume_unique=True) | (p_map < 0)
    e_drop = np.isin(old.entity_ids, te, assume_unique=True) | (e_map < 0)
    node_drop = np.concatenate([p_drop, e_drop])
    new_to_old = np.full(n_p + n_e, -1, np.int64)
    kept = np.flatnonzero(node_map >= 0)
    new_to_old[node_map[kept]] = kept
    pair_keys, in_pair = _pair_keys(old, changes.pairs)

    # the edges read again, in new node numbers (edges to nodes not stored are left out, as the
    # full build leaves them out)
    pairs = np.asarray(sorted(changes.pairs), np.int64).reshape(-1, 2)
    src, dst, w, mention = reads.edges_touching(store, tp, te, pairs)
    m_src, m_dst = _lookup(passage_ids, src[mention]), _lookup(entity_ids, dst[mention])
    e_src, e_dst = _lookup(entity_ids, src[~mention]), _lookup(entity_ids, dst[~mention])
    w_e = w[~mention]
    ok_m = (m_src >= 0) & (m_dst >= 0)
    ok_e = (e_src >= 0) & (e_dst >= 0)
    f_indptr, f_indices, f_weights = to_csr(
        n_p + n_e, np.concatenate([m_src[ok_m], n_p + e_src[ok_e]]),
        np.concatenate([n_p + m_dst[ok_m], n_p + e_dst[ok_e]]),
        np.concatenate([np.ones(int(ok_m.sum())), np.asarray(w_e, np.float64)[ok_e]]), undirected=True)
    indptr, indices, weights = _splice(
        new_to_old, old.indptr, old.indices, np.asarray(old.weights, np.float64), node_drop, node_drop,
        node_map, pair_keys, in_pair, old_p + old_e, f_indptr, f_indices, f_weights)

    # entity -> passage matrix: rows of touched entities and columns of touched passages read again
    ep_new_to_old = np.full(n_e, -1, np.int64)
    kept_e = np.flatnonzero(e_map >= 0)
    ep_new_to_old[e_map[kept_e]] = kept_e
    fe_indptr, fe_indices, fe_weights = to_csr(n_e, m_dst[ok_m], m_src[ok_m], undirected=False, n_cols=n_p)
    ep_indptr, ep_indices, _ = _splice(
        ep_new_to_old, old.entity_passage_indptr, old.entity_passage_indices,
        np.ones(old.entity_passage_indices.size), e_drop, p_drop, p_map, np.zeros(0, np.int64),
        np.zeros(max(old_e, old_p), np.bool_), 0, fe_indptr, fe_indices, fe_weights)

    # triple facts
    tf = np.unique(np.fromiter(changes.facts, dtype=np.int64))
    keep_f = ~np.isin(old.fact_ids, tf, assume_unique=True)
    fid, fs, fo = reads.triple_facts_by_id(store, tf)
    fact_ids = np.concatenate([old.fact_ids[keep_f], fid.astype(np.int64)])
    subject = np.concatenate([_remap(old.fact_subject[keep_f], e_map), _lookup(entity_ids, fs)])
    obj = np.concatenate([_remap(old.fact_object[keep_f], e_map), _lookup(entity_ids, fo)])
    order = slice(None)
    if fid.size and keep_f.any() and fid[0] <= old.fact_ids[keep_f][-1]:  # new ids are not all last
        order = np.argsort(fact_ids, kind="stable")
    return _assemble(generation, {
        "passage_ids": passage_ids, "entity_ids": entity_ids,
        "indptr": indptr, "indices": indices, "weights": weights,
        "entity_passage_indptr": ep_indptr, "entity_passage_indices": ep_indices,
        "fact_ids": fact_ids[order], "fact_subject": subject[order].astype(np.int32),
        "fact_object": obj[order].astype(np.int32),
    })


def _merged(kept: np.ndarray, more: np.ndarray) -> np.ndarray:
    """The sorted union of two sorted id arrays (new ids usually all come after the old ones)."""
    if not more.size:
        return kept
    if not kept.size or more[0] > kept[-1]:
        return np.concatenate([kept, more])
    return np.union1d(kept, more)


def _remap(entity_index: np.ndarray, e_map: np.ndarray) -> np.ndarray:
    """Old entity indices (-1: none) in the new numbering (-1 where the entity is gone)."""
    return np.append(e_map, -1)[np.asarray(entity_index, np.int64)]  # index -1 reads the -1


def _pair_keys(old: GraphSnapshot, pairs: set[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """Sorted keys ``lo * n + hi`` (old node numbers) of the touched pairs both of whose ends
    the old snapshot holds, and a mask of the old nodes that end one of them."""
    in_pair = np.zeros(old.n_nodes, np.bool_)
    if not pairs:
        return np.zeros(0, np.int64), in_pair
    arr = np.asarray(sorted(pairs), np.int64)
    a = _lookup(old.entity_ids, arr[:, 0])
    b = _lookup(old.entity_ids, arr[:, 1])
    ok = (a >= 0) & (b >= 0)
    a, b = old.n_passages + a[ok], old.n_passages + b[ok]
    in_pair[a] = True
    in_pair[b] = True
    return np.unique(np.minimum(a, b) * old.n_nodes + np.maximum(a, b)), in_pair


@njit(cache=True, nogil=True)
def _is_pair(keys, u, v, n):
    """Whether ``(u, v)`` is among the sorted pair ``keys`` (binary search; called only for
    nodes that both end some pair: a call per entry would cost more than the whole splice)."""
    key = min(u, v) * n + max(u, v)
    lo, hi = 0, keys.size
    while lo < hi:
        mid = (lo + hi) >> 1
        if keys[mid] < key:
            lo = mid + 1
        else:
            hi = mid
    return lo < keys.size and keys[lo] == key


@njit(cache=True, nogil=True)
def _splice(new_to_old, indptr, indices, weights, row_drop, col_drop, col_map, pair_keys, in_pair,
            n_old, f_indptr, f_indices, f_weights):
    """Rows of the new CSR: row ``r`` merges the old row ``new_to_old[r]`` (unless -1 or
    dropped; entries to dropped columns or touched pairs left out, columns renumbered by
    ``col_map``) with the fresh row ``r``; both are sorted by column, so the merge is too.
    ``in_pair`` marks the old nodes that end a touched pair (``pair_keys``); a matrix without
    pairs passes an all-False mask as long as its rows."""
    n = new_to_old.size
    out_ptr = np.zeros(n + 1, np.int64)
    for r in range(n):
        c = f_indptr[r + 1] - f_indptr[r]
        u = new_to_old[r]
        if u >= 0 and not row_drop[u]:
            pu = in_pair[u]
            for e in range(indptr[u], indptr[u + 1]):
                v = indices[e]
                if not col_drop[v] and not (pu and in_pair[v] and _is_pair(pair_keys, u, v, n_old)):
                    c += 1
        out_ptr[r + 1] = out_ptr[r] + c
    out_idx = np.empty(out_ptr[n], np.int32)
    out_w = np.empty(out_ptr[n], np.float64)
    for r in range(n):
        pos = out_ptr[r]
        f, f_end = f_indptr[r], f_indptr[r + 1]
        u = new_to_old[r]
        if u >= 0 and not row_drop[u]:
            pu = in_pair[u]
            for e in range(indptr[u], indptr[u + 1]):
                v = indices[e]
                if col_drop[v] or (pu and in_pair[v] and _is_pair(pair_keys, u, v, n_old)):
                    continue
                col = col_map[v]
                while f < f_end and f_indices[f] < col:
                    out_idx[pos] = f_indices[f]
                    out_w[pos] = f_weights[f]
                    pos += 1
                    f += 1
                out_idx[pos] = col
                out_w[pos] = weights[e]
                pos += 1
        while f < f_end:
            out_idx[pos] = f_indices[f]
            out_w[pos] = f_weights[f]
            pos += 1
            f += 1
    return out_ptr, out_idx, out_w
