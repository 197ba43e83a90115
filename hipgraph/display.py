"""Rich display for notebooks: HTML tables for hits, answers and statistics, and a drawing of a
question's PPR subgraph (matplotlib, optional: ``pip install 'hipgraph[notebooks]'``)."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from hipgraph.errors import BackendUnavailableError

_STYLE = "border-collapse:collapse;font-size:13px"
_CELL = "border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f'<th style="{_CELL}">{html.escape(str(h))}</th>' for h in header)
    body = "".join("<tr>" + "".join(f'<td style="{_CELL}">{c}</td>' for c in row) + "</tr>" for row in rows)
    return f'<table style="{_STYLE}"><tr>{head}</tr>{body}</table>'


def _short(text: str, n: int = 220) -> str:
    text = " ".join(text.split())
    return html.escape(text if len(text) <= n else text[: n - 3] + "...")


def _why(why: Mapping[str, Any]) -> str:
    parts = []
    path = [s["name"] for s in why.get("path", []) if "name" in s]
    if path:
        parts.append("via " + " → ".join(path))
    if why.get("constraints"):
        parts.append("constraints " + ", ".join(f"step {n}" if n else "question" for n in why["constraints"]))
    if why.get("supports"):
        parts.append("supports " + "; ".join(" | ".join(f) for f in why["supports"][:3]))
    if why.get("time_match"):
        parts.append(f"time: {why['time_match']}")
    if why.get("fallback"):
        parts.append(why["fallback"])
    return html.escape("; ".join(parts))


def hits_html(hits: Sequence[Any]) -> str:
    """A table of hits: rank, score, title, document, memory turns, text and why."""
    memory = any(h.turn_ids for h in hits)
    header = ["#", "score", "title", "doc"] + (["turns", "time"] if memory else []) + ["text", "why"]
    rows = []
    for h in hits:
        row = [h.rank, f"{h.score:.4g}", html.escape(h.title), html.escape(h.doc_id)]
        if memory:
            row += [html.escape(", ".join(h.turn_ids)), html.escape(h.time)]
        rows.append(row + [_short(h.text), _why(h.why)])
    return _table(header, rows)


def answer_html(answer: Any) -> str:
    head = (f"<p><b>Q:</b> {html.escape(answer.question)}<br><b>A:</b> "
            + ("<i>(the passages do not hold the answer)</i>" if answer.abstained else html.escape(answer.text))
            + f" <small>({html.escape(answer.generator)})</small></p>")
    return head + hits_html(answer.citations)


def stats_html(stats: Mapping[str, Any]) -> str:
    rows = []
    for key, value in stats.items():
        if isinstance(value, Mapping):
            value = ", ".join(f"{k} {v:,}" if isinstance(v, int) else f"{k} {v}" for k, v in value.items())
        elif isinstance(value, int):
            value = f"{value:,}"
        rows.append([html.escape(str(key)), html.escape(str(value))])
    return _table(["", "count"], rows)


def draw_graph(graph, ax=None, labels: int = 25):
    """Draw a question's subgraph (a networkx graph from ``HipGraph.to_networkx(question=...)``):
    node size by PPR mass, seeds orange, retrieved passages green (other passages blue, entities
    grey), strongest seed paths in red; the ``labels`` highest-mass nodes are labelled."""
    try:
        import matplotlib.pyplot as plt  # noqa: PLC0415
        import networkx as nx  # noqa: PLC0415
    except ImportError as exc:
        raise BackendUnavailableError("drawing needs matplotlib and networkx: "
                                      "pip install 'hipgraph[notebooks]'") from exc
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 8))
    nodes = list(graph.nodes)
    mass = [graph.nodes[n].get("ppr", 0.0) for n in nodes]
    top = max(mass) if mass and max(mass) > 0 else 1.0
    sizes = [40 + 1200 * m / top for m in mass]

    def colour(n: str) -> str:
        d = graph.nodes[n]
        if d.get("retrieved"):
            return "#2ca02c"
        if d.get("seed"):
            return "#ff7f0e"
        return "#1f77b4" if d["kind"] == "passage" else "#bbbbbb"

    pos = nx.spring_layout(graph, seed=7, weight="weight")
    on_path = [(a, b) for a, b, d in graph.edges(data=True) if d.get("on_path")]
    other = [(a, b) for a, b, d in graph.edges(data=True) if not d.get("on_path")]
    nx.draw_networkx_edges(graph, pos, edgelist=other, ax=ax, alpha=0.25, width=0.6)
    nx.draw_networkx_edges(graph, pos, edgelist=on_path, ax=ax, edge_color="#d62728", width=2.4)
    nx.draw_networkx_nodes(graph, pos, nodelist=nodes, node_size=sizes, node_color=[colour(n) for n in nodes],
                           ax=ax, linewidths=0.5, edgecolors="#333333")
    ranked = sorted(nodes, key=lambda n: -graph.nodes[n].get("ppr", 0.0))[:labels]
    named = {n: graph.nodes[n]["label"][:28] for n in ranked}
    nx.draw_networkx_labels(graph, pos, labels=named, font_size=8, ax=ax)
    ax.set_axis_off()
    return ax
