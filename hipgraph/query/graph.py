"""Graph retrieval scoring: seeds from facts, question entities and dense scores → PPR → passages.

Pure functions over a :class:`GraphSnapshot` and arrays the caller fetched (FAISS fact and passage
scores, linked question entities); see :class:`hipgraph.config.GraphRetrievalConfig` for the recipe.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numba
import numpy as np

from hipgraph.config import GraphRetrievalConfig
from hipgraph.query.ppr import ppr
from hipgraph.query.snapshot import GraphSnapshot


@dataclass
class Seeds:
    """What seeded one question's PPR (indexes into the snapshot's arrays)."""

    facts: list[tuple[int, float]] = field(default_factory=list)  # (fact row, cosine)
    entities: dict[int, float] = field(default_factory=dict)  # entity index -> seed weight
    linked: dict[int, str] = field(default_factory=dict)  # entity index -> question span
    passages: dict[int, float] = field(default_factory=dict)  # passage node -> seed weight

    @property
    def has_graph_seeds(self) -> bool:
        return bool(self.entities)


def _minmax(x: np.ndarray) -> np.ndarray:
    if x.size == 0:
        return x
    lo, hi = float(x.min()), float(x.max())
    return np.ones_like(x) if hi - lo <= 1e-12 else (x - lo) / (hi - lo)


def make_seeds(
    snapshot: GraphSnapshot,
    fact_rows: np.ndarray,
    fact_scores: np.ndarray,
    linked: dict[int, str],
    passage_nodes: np.ndarray,
    passage_scores: np.ndarray,
    cfg: GraphRetrievalConfig,
    min_fact_score: float | None = None,
) -> Seeds:
    """Seed weights for one question.

    ``fact_rows``/``fact_scores``: candidate facts (snapshot rows, -1 = unknown) by cosine, best
    first; ``linked``: entity index -> question span; ``passage_nodes``/``passage_scores``: dense
    candidates, best first. ``min_fact_score`` overrides the config's threshold (facts already
    chosen by the LLM filter pass with ``-1``).
    """
    seeds = Seeds()
    count = snapshot.entity_passage_count
    threshold = cfg.min_fact_score if min_fact_score is None else min_fact_score
    ok = (fact_rows >= 0) & (fact_scores >= threshold)
    rows, scores = fact_rows[ok][: cfg.fact_top_k], fact_scores[ok][: cfg.fact_top_k]
    fact_entities: dict[int, float] = {}
    for row, score in zip(rows.tolist(), scores.tolist(), strict=True):
        seeds.facts.append((row, score))
        for ent in (int(snapshot.fact_subject[row]), int(snapshot.fact_object[row])):
            if ent < 0:
                continue
            weight = cfg.fact_weight * max(score, 0.0) / max(1, int(count[ent]))
            fact_entities[ent] = max(fact_entities.get(ent, 0.0), weight)
    top = sorted(fact_entities.items(), key=lambda kv: (-kv[1], kv[0]))[: cfg.entity_top_k]
    seeds.entities = {e: w for e, w in top if w > 0}
    for ent, span in linked.items():
        weight = cfg.link_weight / max(1, int(count[ent]))
        seeds.entities[ent] = seeds.entities.get(ent, 0.0) + weight
        seeds.linked[ent] = span
    if passage_nodes.size and cfg.passage_weight > 0:
        keep = passage_nodes >= 0
        norm = _minmax(np.asarray(passage_scores, np.float64)[keep]) * cfg.passage_weight
        seeds.passages = {int(n): float(w) for n, w in zip(passage_nodes[keep], norm, strict=True)
                          if w > 0}
    return seeds


def reset_matrix(snapshot: GraphSnapshot, seeds: list[Seeds]) -> np.ndarray:
    """``(b, n)`` reset weights (unnormalised) for questions with graph seeds."""
    reset = np.zeros((len(seeds), snapshot.n_nodes))
    p = snapshot.n_passages
    for i, s in enumerate(seeds):
        for node, w in s.passages.items():
            reset[i, node] += w
        for ent, w in s.entities.items():
            reset[i, p + ent] += w
    return reset


def passage_scores(snapshot: GraphSnapshot, reset: np.ndarray, cfg: GraphRetrievalConfig) -> np.ndarray:
    """PPR mass of every passage node, ``(b, P)``."""
    return node_scores(snapshot, reset, cfg)[:, : snapshot.n_passages]


def node_scores(snapshot: GraphSnapshot, reset: np.ndarray, cfg: GraphRetrievalConfig) -> np.ndarray:
    """PPR mass of every node (passages, then entities), ``(b, n)``."""
    if reset.shape[0] == 0:
        return np.zeros((0, snapshot.n_nodes))
    method = cfg.ppr_method
    if method == "auto":
        method = "push" if snapshot.n_nodes > cfg.ppr_push_above else "power"
    before = numba.get_num_threads()
    numba.set_num_threads(min(cfg.ppr_threads, numba.config.NUMBA_NUM_THREADS))
    try:
        x = ppr(snapshot.ppr_graph, reset, damping=cfg.damping, tol=cfg.ppr_tol, method=method, eps=cfg.ppr_eps)
    finally:
        numba.set_num_threads(before)
    return np.asarray(x)


def top_passages(scores: np.ndarray, k: int) -> list[tuple[int, float]]:
    """Best ``k`` passage nodes of one score row; ties broken by node (= passage id) order."""
    k = min(k, scores.size)
    if k == 0:
        return []
    cand = np.argpartition(-scores, k - 1)[:k] if k < scores.size else np.arange(scores.size)
    # include every node tied with the k-th score so the tie-break is by id, not by partition
    kth = scores[cand].min()
    cand = np.flatnonzero(scores >= kth)
    order = np.lexsort((cand, -scores[cand]))[:k]
    return [(int(cand[i]), float(scores[cand[i]])) for i in order if scores[cand[i]] > 0]


def strongest_path(snapshot: GraphSnapshot, seeds: Seeds, target: int) -> tuple[list[int], float]:
    """The most probable walk of at most three edges from an entity seed to passage ``target``.

    A walk's score is the seed weight times the product of its transition probabilities
    ``w(u, v) / out(u)``; walks pass through entities (the node after the seed may be any node).
    Returns ``(nodes from seed to target, score)``, empty when no seed lies within three edges;
    ties go to the smaller seed, then the smaller next node. Meets in the middle: the target's
    entities are matched against each seed's neighbours by binary search in the sorted CSR rows,
    so hub entities cost a logarithm, not their degree (:func:`_strongest_path`, compiled).
    """
    if not seeds.entities:
        return [], 0.0
    p = snapshot.n_passages
    nodes = np.array(sorted(p + e for e in seeds.entities), np.int64)
    weights = np.array([seeds.entities[int(n) - p] for n in nodes], np.float64)
    path, length, score = _strongest_path(
        np.asarray(snapshot.indptr), np.asarray(snapshot.indices), np.asarray(snapshot.weights),
        np.asarray(snapshot.out_weight), p, nodes, weights, int(target))
    if length == 0:
        return [], 0.0
    return [int(v) for v in path[:length]], float(score)


@numba.njit(cache=True, nogil=True)
def _in_row(indptr, indices, u, x):
    """Position of node ``x`` in CSR row ``u`` (sorted), or -1."""
    lo, hi = indptr[u], indptr[u + 1]
    while lo < hi:
        mid = (lo + hi) // 2
        if indices[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo if lo < indptr[u + 1] and indices[lo] == x else -1


@numba.njit(cache=True, nogil=True)
def _to_target(indptr, indices, weights, out, b_nodes, r1, target, x):
    """Best probability of reaching ``target`` from ``x`` in at most two edges (through one of
    the target's entities ``b_nodes``, sorted, whose last step has probability ``r1``), and the
    next node of that walk (-1: none); the one-edge walk is kept on ties, then the smaller ``b``."""
    best, via = 0.0, -1
    for j in range(b_nodes.size):  # one edge x -> target
        if b_nodes[j] == x:
            best, via = r1[j], target
            break
    if out[x] <= 0 or x == target:
        return best, via
    for j in range(b_nodes.size):  # two edges x -> b -> target; w(x, b) = w(b, x): symmetric CSR
        at = _in_row(indptr, indices, b_nodes[j], x)
        if at >= 0:
            prob = r1[j] * weights[at] / out[x]
            if prob > best:
                best, via = prob, b_nodes[j]
    return best, via


@numba.njit(cache=True, nogil=True)
def _strongest_path(indptr, indices, weights, out, p, seed_nodes, seed_weights, target):
    """:func:`strongest_path` over the CSR arrays: ``(path nodes, their count, score)``."""
    lo, hi = indptr[target], indptr[target + 1]
    b_nodes = np.empty(hi - lo, np.int64)
    r1 = np.empty(hi - lo, np.float64)
    nb = 0
    for k in range(lo, hi):  # the walk's last step b -> target, for the target's entities b
        b = indices[k]
        if b >= p and out[b] > 0:
            b_nodes[nb], r1[nb] = b, weights[k] / out[b]
            nb += 1
    order = np.argsort(b_nodes[:nb])
    b_nodes, r1 = b_nodes[:nb][order], r1[:nb][order]
    best_path = np.full(4, -1, np.int64)
    best_len, best_score = 0, 0.0
    path = np.full(4, -1, np.int64)
    for i in range(seed_nodes.size):
        s = seed_nodes[i]
        if out[s] <= 0:
            continue
        own, own_via = _to_target(indptr, indices, weights, out, b_nodes, r1, target, s)
        if own > 0:  # one or two edges
            path[0], path[1] = s, own_via
            length = 2
            if own_via != target:
                path[2] = target
                length = 3
            score = seed_weights[i] * own
        else:  # three edges: s -> x -> b -> target; the first maximum (the smallest x) wins
            top, top_x, top_via = 0.0, -1, -1
            for k in range(indptr[s], indptr[s + 1]):
                x = indices[k]
                reach, via = _to_target(indptr, indices, weights, out, b_nodes, r1, target, x)
                prob = reach * weights[k] / out[s]
                if prob > top:
                    top, top_x, top_via = prob, x, via
            if top <= 0:
                continue
            path[0], path[1] = s, top_x
            length = 2
            if top_via != target:
                path[length] = top_via
                length += 1
            path[length] = target
            length += 1
            score = seed_weights[i] * top
        if score > best_score:
            best_score, best_len = score, length
            best_path[:] = path
    return best_path, best_len, best_score
