"""The graph as networkx / igraph objects, whole or around a question or some entities.

Nodes are keyed ``"p:<passage id>"`` and ``"e:<entity id>"`` (passages and entities have separate
id spaces) with attributes ``kind`` (passage | entity), ``label`` (title or name), ``doc_id`` /
``entity_label``; edges carry ``type`` (mention | fact | synonym) and ``weight``. Around a
question, nodes also carry ``ppr`` (PageRank mass), ``seed`` (weight, 0 if none), ``retrieved``
(rank, 0 if not among the top k) and edges on a hit's strongest seed path ``on_path=True``.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hipgraph.config import RetrievalConfig
from hipgraph.errors import BackendUnavailableError, ConfigError
from hipgraph.query.graph_search import GraphSearch
from hipgraph.query.hits import to_hits
from hipgraph.query.view import ReadView
from hipgraph.store import reads


@dataclass
class GraphView:
    """Nodes and edges ready for a graph library (see module docstring)."""

    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    edges: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)


def graph_view(graph: GraphSearch, cfg: RetrievalConfig, question: str | None = None,
               entities: Sequence[str] | None = None, hops: int = 1, k: int = 5,
               max_nodes: int = 300) -> GraphView:
    """The whole graph (no ``question``/``entities``), the ``hops``-neighbourhood of named
    ``entities``, or a question's PPR subgraph: its seeds, top-``k`` passages, their strongest
    paths, grown best-first by PPR mass through their neighbours up to ``max_nodes``. Reads
    ``graph``'s view only (the caller holds the store's shared lock)."""
    if hops < 0 or max_nodes < 1 or k < 1:
        raise ConfigError("hops must be >= 0, max_nodes and k >= 1")
    view = graph.view
    snap = view.snapshot()
    p = snap.n_passages
    extra: dict[int, dict[str, Any]] = {}
    path_edges: set[frozenset[int]] = set()
    if question is not None:
        run = graph.graph_run([question], cfg)
        seeds = run.seeds[0]
        mass = run.scores[run.rows[0]] if 0 in run.rows else np.zeros(snap.n_nodes)
        ranked = graph.rank_run(run, k, cfg.graph)[0]
        hits = to_hits(view, [ranked], k)[0]
        chosen = {p + e for e in seeds.entities}
        for rank, hit in enumerate(hits, start=1):
            node = int(snap.passage_nodes(np.array([hit.passage_id]))[0])
            chosen.add(node)
            extra.setdefault(node, {})["retrieved"] = rank
            steps = [(p + int(snap.entity_index(np.array([s["entity_id"]]))[0])) if "entity_id" in s
                     else int(snap.passage_nodes(np.array([s["passage_id"]]))[0])
                     for s in hit.why.get("path", [])]
            chosen.update(steps)
            path_edges.update(frozenset(pair) for pair in zip(steps, steps[1:], strict=False))
        for e, w in seeds.entities.items():
            extra.setdefault(p + e, {})["seed"] = float(w)
        _grow(snap, chosen, mass, max_nodes)
        for node in chosen:
            extra.setdefault(node, {})["ppr"] = float(mass[node])
        nodes = sorted(chosen)[:max_nodes] if len(chosen) > max_nodes else sorted(chosen)
    elif entities is not None:
        names = view.entity_names()
        start = []
        for name in entities:
            eid = names.exact(name)
            if eid is None:
                raise ConfigError(f"no entity named {name!r} in the index")
            start.append(p + int(snap.entity_index(np.array([eid]))[0]))
        seen, frontier = set(start), list(start)
        for _ in range(hops):
            nxt = []
            for node in frontier:
                nbrs, _ = snap.neighbors(node)
                nxt.extend(int(n) for n in nbrs if int(n) not in seen)
            seen.update(nxt)
            frontier = nxt
            if len(seen) >= max_nodes:
                break
        nodes = sorted(seen)[:max_nodes] if len(seen) > max_nodes else sorted(seen)
    else:
        nodes = list(range(snap.n_nodes))
    return _assemble(view, snap, nodes, extra, path_edges, annotate=question is not None)


def _grow(snap, chosen: set[int], mass: np.ndarray, max_nodes: int) -> None:
    """Best-first growth of ``chosen``: the highest-mass neighbour of the set joins next, so the
    subgraph stays connected around its core."""
    heap: list[tuple[float, int]] = []
    queued: set[int] = set()

    def push_neighbours(node: int) -> None:
        nbrs, _ = snap.neighbors(node)
        for m in nbrs.tolist():
            if m not in chosen and m not in queued and mass[m] > 0:
                queued.add(m)
                heapq.heappush(heap, (-float(mass[m]), m))

    for node in list(chosen):
        push_neighbours(node)
    while heap and len(chosen) < max_nodes:
        _, node = heapq.heappop(heap)
        chosen.add(node)
        push_neighbours(node)


def _assemble(read: ReadView, snap, nodes: list[int], extra: dict[int, dict[str, Any]],
          path_edges: set[frozenset[int]], annotate: bool) -> GraphView:
    p = snap.n_passages
    keep = set(nodes)
    pids = [int(snap.passage_ids[n]) for n in nodes if n < p]
    eids = [int(snap.entity_ids[n - p]) for n in nodes if n >= p]
    titles = reads.passage_titles(read.store, pids)
    ents = reads.entity_labels(read.store, eids)
    view = GraphView()
    for n in nodes:
        base = {"ppr": 0.0, "seed": 0.0, "retrieved": 0} if annotate else {}
        if n < p:
            pid = int(snap.passage_ids[n])
            title, doc = titles.get(pid, ("", ""))
            view.nodes[f"p:{pid}"] = {"kind": "passage", "label": title or f"passage {pid}", "doc_id": doc,
                                      **base, **extra.get(n, {})}
        else:
            eid = int(snap.entity_ids[n - p])
            name, label = ents.get(eid, ("", ""))
            view.nodes[f"e:{eid}"] = {"kind": "entity", "label": name, "entity_label": label,
                                      **base, **extra.get(n, {})}
    key = {n: (f"p:{int(snap.passage_ids[n])}" if n < p else f"e:{int(snap.entity_ids[n - p])}") for n in nodes}
    types = _edge_types(read, eids)
    for n in nodes:
        nbrs, weights = snap.neighbors(n)
        for m, w in zip(nbrs.tolist(), weights.tolist(), strict=True):
            if m <= n or m not in keep:
                continue
            a, b = key[n], key[m]
            attrs = {"type": types.get((a, b)) or types.get((b, a)) or ("mention" if n < p or m < p else "fact"),
                     "weight": float(w)}
            if annotate:
                attrs["on_path"] = frozenset((n, m)) in path_edges
            view.edges.append((a, b, attrs))
    return view


def _edge_types(read: ReadView, eids: list[int]) -> dict[tuple[str, str], str]:
    """The stored type of each entity-entity edge among ``eids`` (fact wins over synonym)."""
    if len(eids) < 2:
        return {}
    out: dict[tuple[str, str], str] = {}
    for typ, src, dst in reads.entity_edges_among(read.store, eids):
        k = (f"e:{int(src)}", f"e:{int(dst)}")
        if out.get(k) != "fact":
            out[k] = typ
    return out


def to_networkx(view: GraphView):
    try:
        import networkx as nx  # noqa: PLC0415
    except ImportError as exc:
        raise BackendUnavailableError("to_networkx needs networkx: pip install networkx") from exc
    g = nx.Graph()
    g.add_nodes_from(view.nodes.items())
    g.add_edges_from(view.edges)
    return g


def to_igraph(view: GraphView):
    try:
        import igraph as ig  # noqa: PLC0415
    except ImportError as exc:
        raise BackendUnavailableError("to_igraph needs python-igraph: pip install python-igraph") from exc
    names = list(view.nodes)
    index = {n: i for i, n in enumerate(names)}
    g = ig.Graph(n=len(names), edges=[(index[a], index[b]) for a, b, _ in view.edges])
    g.vs["name"] = names
    for attr in sorted({a for d in view.nodes.values() for a in d}):
        g.vs[attr] = [view.nodes[n].get(attr) for n in names]
    for attr in sorted({a for _, _, d in view.edges for a in d}):
        g.es[attr] = [d.get(attr) for _, _, d in view.edges]
    return g
