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
    so hub entities cost a logarithm, not their degree.
    """
    p = snapshot.n_passages
    seed_nodes = {p + e: w for e, w in seeds.entities.items()}
    if not seed_nodes:
        return [], 0.0
    out = np.asarray(snapshot.out_weight)  # plain views: memmap indexing is slow per call
    indptr, indices, weights = (np.asarray(a) for a in (snapshot.indptr, snapshot.indices, snapshot.weights))

    def row(u: int) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = int(indptr[u]), int(indptr[u + 1])
        return indices[lo:hi].astype(np.int64), weights[lo:hi]

    # the walk's last step: b -> target for the target's neighbours b (entities)
    b_nodes, b_w = row(target)
    keep = (b_nodes >= p) & (out[b_nodes] > 0)
    b_nodes, r1 = b_nodes[keep], b_w[keep] / out[b_nodes[keep]]

    b_order = np.argsort(b_nodes)
    b_sorted, r1_sorted = b_nodes[b_order], r1[b_order]

    def to_target(xs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Best probability of reaching the target from each ``x`` in at most two edges (through
        one of the target's entities), and the next node of that walk (-1: none)."""
        best = np.zeros(xs.size)
        via = np.full(xs.size, -1, np.int64)
        if b_sorted.size:  # one edge x -> target (kept on ties, as the shorter walk)
            at = np.minimum(np.searchsorted(b_sorted, xs), b_sorted.size - 1)
            one = b_sorted[at] == xs
            best[one], via[one] = r1_sorted[at[one]], target
        ox = out[xs]
        for b, rb in zip(b_sorted.tolist(), r1_sorted.tolist(), strict=True):  # two edges x -> b -> target
            nb, wb = row(b)  # w(x, b) = w(b, x): the CSR is symmetric
            if nb.size == 0:
                continue
            at = np.minimum(np.searchsorted(nb, xs), nb.size - 1)
            hit = (nb[at] == xs) & (ox > 0) & (xs != target)
            prob = np.zeros(xs.size)
            prob[hit] = rb * wb[at[hit]] / ox[hit]
            better = prob > best
            best[better], via[better] = prob[better], b
        return best, via

    best_score, best_path = 0.0, []
    for s in sorted(seed_nodes):
        if out[s] <= 0:
            continue
        own, own_via = to_target(np.array([s], np.int64))  # one or two edges
        if own[0] > 0:
            path = [s, int(own_via[0])] + ([target] if own_via[0] != target else [])
            score = seed_nodes[s] * own[0]
        else:  # three edges: s -> x -> b -> target
            xs, wx = row(s)
            reach, via = to_target(xs)
            prob = reach * wx / out[s]
            if prob.size == 0 or prob.max() <= 0:
                continue
            j = int(np.argmax(prob))  # first maximum: the smallest x
            x = int(xs[j])
            path = [s, x] + ([int(via[j])] if via[j] != target else []) + [target]
            score = seed_nodes[s] * float(prob[j])
        if score > best_score:
            best_score, best_path = float(score), path
    return best_path, best_score
