"""Graph exports (networkx, igraph) and notebook rendering, on the real inline index."""

from __future__ import annotations

import networkx as nx
import pytest
from conftest import MULTIHOP_QUESTION as MULTIHOP

from hipgraph.errors import ConfigError


def test_whole_graph_export_matches_the_store(inline_index):
    hg = inline_index
    g = hg.to_networkx()
    stats = hg.stats()
    assert g.number_of_nodes() == stats["passages"] + stats["entities"]
    con = hg.store.con
    pairs = {frozenset((f"p:{s}", f"e:{d}")) for s, d in con.execute(
        "SELECT src, dst FROM edges WHERE type = 'mention'").fetchall()}
    pairs |= {frozenset((f"e:{s}", f"e:{d}")) for s, d in con.execute(
        "SELECT src, dst FROM edges WHERE type <> 'mention' AND src <> dst").fetchall()}
    assert {frozenset(e) for e in g.edges} == pairs
    types = {d["type"] for _, _, d in g.edges(data=True)}
    assert types <= {"mention", "fact", "synonym"} and "mention" in types and "fact" in types
    title = {d["label"] for n, d in g.nodes(data=True) if d["kind"] == "passage"}
    assert "American Psychological Association" in title
    ig = hg.to_igraph()
    assert ig.vcount() == g.number_of_nodes() and ig.ecount() == g.number_of_edges()


def test_question_subgraph_marks_seeds_hits_and_paths(inline_index):
    hg = inline_index
    hits = hg.retrieve(MULTIHOP, k=3)
    g = hg.to_networkx(MULTIHOP, k=3, max_nodes=25)
    assert g.number_of_nodes() <= 25 and nx.is_connected(g)
    retrieved = {n: d["retrieved"] for n, d in g.nodes(data=True) if d["retrieved"]}
    assert retrieved == {f"p:{h.passage_id}": h.rank for h in hits}
    seeds = {d["label"] for n, d in g.nodes(data=True) if d["seed"] > 0}
    assert "journal of psychotherapy integration" in seeds
    on_path = [(a, b) for a, b, d in g.edges(data=True) if d["on_path"]]
    assert on_path and all(g.nodes[n]["ppr"] > 0 for e in on_path for n in e)
    assert max(d["ppr"] for _, d in g.nodes(data=True)) > 0


def test_entity_neighbourhood_and_errors(inline_index):
    hg = inline_index
    g = hg.to_networkx(entities=["Carl Rogers"], hops=1)
    names = {d["label"] for _, d in g.nodes(data=True)}
    assert "carl rogers" in names and "Carl Rogers" in names  # the entity and a passage naming it
    assert nx.is_connected(g)
    with pytest.raises(ConfigError, match="no entity named"):
        hg.to_networkx(entities=["Nobody At All"])
    with pytest.raises(ConfigError, match="hops"):
        hg.to_networkx(entities=["Carl Rogers"], hops=-1)


def test_html_renders_hits_answers_and_stats(inline_index):
    hg = inline_index
    hits = hg.retrieve(MULTIHOP, k=2)
    table = hits._repr_html_()
    assert table.startswith("<table") and hits[0].title in table and "via " in table
    assert hits[0]._repr_html_().count("<tr>") == 2
    assert "passages" in hg.stats()._repr_html_()
    answer = hg.answer(MULTIHOP, k=2)
    assert MULTIHOP in answer._repr_html_()
