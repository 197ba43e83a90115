"""The query engine end to end on real indexes: graph retrieval (seeds, PPR checked against igraph,
why-paths), dense/bm25/hybrid modes, the graph snapshot cache and its invalidation, bad input."""

from __future__ import annotations

import json

import igraph
import numpy as np
import pytest
from conftest import MULTIHOP_QUESTION, copy_index, run_cli

import hipgraph
from hipgraph.config import GraphRetrievalConfig, RetrievalConfig
from hipgraph.errors import ConfigError, IndexNotFoundError
from hipgraph.query.graph import Seeds, passage_scores, reset_matrix, strongest_path
from hipgraph.query.snapshot import build_snapshot, cache_dir
from hipgraph.text.normalize import normalize_entity

MULTIHOP = MULTIHOP_QUESTION


def _edges(hg) -> list[tuple[str, int, int, float]]:
    return hg.store.con.execute("SELECT type, src, dst, weight FROM edges").fetchall()


def test_graph_mode_finds_both_hops_and_explains_them(inline_index):
    hits = inline_index.retrieve(MULTIHOP, k=3)
    docs = [h.doc_id for h in hits]
    assert {"jpi", "apa"} <= set(docs[:2]), docs  # the bridge passage (APA) ranks with the entry one
    assert [h.rank for h in hits] == [1, 2, 3] and hits[0].score >= hits[1].score >= hits[2].score
    why = hits[0].why
    assert why["mode"] == "graph" and why["ppr"] == pytest.approx(hits[0].score)
    linked = {e["name"] for e in why["seed_entities"] if e["via"] == "question"}
    assert "journal of psychotherapy integration" in linked
    # every hit's path starts at a seed entity, ends at the hit and follows stored edges
    seed_ids = {e["entity_id"] for e in why["seed_entities"]}
    pairs = {(s, d) for t, s, d, _ in _edges(inline_index)} | {(d, s) for t, s, d, _ in _edges(inline_index)}
    for hit in hits:
        path = hit.why["path"]
        assert path and path[0]["entity_id"] in seed_ids and path[-1] == {"passage_id": hit.passage_id}
        ids = [step.get("entity_id", step.get("passage_id")) for step in path]
        assert all((a, b) in pairs for a, b in zip(ids, ids[1:], strict=False)), path


def test_graph_scores_equal_igraph_ppr_over_the_stored_edges(inline_index):
    """The snapshot + kernel against igraph on a graph built independently from the edges table."""
    hg = inline_index
    snap = build_snapshot(hg.store)
    passages = [r[0] for r in hg.store.con.execute("SELECT id FROM passages ORDER BY id").fetchall()]
    entities = [r[0] for r in hg.store.con.execute("SELECT id FROM entities ORDER BY id").fetchall()]
    node = {("p", p): i for i, p in enumerate(passages)}
    node.update({("e", e): len(passages) + i for i, e in enumerate(entities)})
    # the entity -> passage matrix holds exactly the stored mentions
    mentions = {(node[("e", e)] - len(passages), node[("p", p)]) for p, e in hg.store.con.execute(
        "SELECT DISTINCT passage_id, entity_id FROM mentions").fetchall()}
    assert {(e, int(p)) for e in range(len(entities)) for p in snap.entity_passages(e)} == mentions
    g = igraph.Graph(n=len(node), directed=True)
    es, ws = [], []
    for etype, src, dst, w in _edges(hg):
        a = node[("p", src)] if etype == "mention" else node[("e", src)]
        b = node[("e", dst)]
        es += [(a, b), (b, a)]
        ws += [w, w]
    g.add_edges(es)
    rng = np.random.default_rng(0)
    seeds = [Seeds(entities={int(e): float(rng.random() + 0.1) for e in rng.choice(len(entities), 3, replace=False)},
                   passages={int(p): 0.05 * float(rng.random()) for p in range(len(passages))})
             for _ in range(4)]
    reset = reset_matrix(snap, seeds)
    cfg = GraphRetrievalConfig(ppr_tol=1e-10)
    ours = passage_scores(snap, reset, cfg)
    for row, r in zip(ours, reset, strict=True):
        ref = np.array(g.personalized_pagerank(directed=True, weights=ws, reset=r.tolist(), damping=0.5))
        assert np.abs(row - ref[: len(passages)]).sum() <= 1e-6


def test_strongest_path_prefers_the_likelier_walk():
    from hipgraph.query.ppr import to_csr
    from hipgraph.query.snapshot import _assemble

    # passages 0, 1; entities 0..3 at nodes 2..5. seed e0 -> e1 (weight 3) -> p0, and e0 -> e2 -> p0
    # (weight 1): the heavier edge wins; e3 is unreachable within three edges of p1.
    src = np.array([2, 2, 3, 4, 1])
    dst = np.array([3, 4, 0, 0, 5])
    indptr, indices, weights = to_csr(6, src, dst, np.array([3.0, 1.0, 1.0, 1.0, 1.0]))
    arrays = {"passage_ids": np.array([10, 11]), "entity_ids": np.array([20, 21, 22, 23]),
              "indptr": indptr, "indices": indices, "weights": weights,
              "entity_passage_indptr": np.array([0, 0, 1, 2, 3]),
              "entity_passage_indices": np.array([0, 0, 1], np.int32), "fact_ids": np.zeros(0, np.int64),
              "fact_subject": np.zeros(0, np.int32), "fact_object": np.zeros(0, np.int32)}
    snap = _assemble(0, arrays)
    path, score = strongest_path(snap, Seeds(entities={0: 1.0}), 0)
    assert path == [2, 3, 0]
    # e0 -> e1 has probability 3/4; e1 -> p0 has 1/4 (e1 also links back to e0 with weight 3)
    assert score == pytest.approx(0.75 * 0.25)
    assert strongest_path(snap, Seeds(entities={0: 1.0}), 1) == ([], 0.0)
    # a seed whose only edge leads to the target (out-weight 1): the one-edge walk, probability 1
    assert strongest_path(snap, Seeds(entities={3: 0.5}), 1) == ([5, 1], pytest.approx(0.5))


def _hand_snapshot(n_p: int, n_e: int, edges: list[tuple[int, int, float]]):
    from hipgraph.query.ppr import to_csr
    from hipgraph.query.snapshot import _assemble

    src, dst, w = (np.array(col) for col in zip(*edges, strict=True))
    indptr, indices, weights = to_csr(n_p + n_e, src, dst, w.astype(float))
    return _assemble(0, {"passage_ids": np.arange(n_p), "entity_ids": np.arange(n_e), "indptr": indptr,
                         "indices": indices, "weights": weights,
                         "entity_passage_indptr": np.zeros(n_e + 1, np.int64),
                         "entity_passage_indices": np.zeros(0, np.int32), "fact_ids": np.zeros(0, np.int64),
                         "fact_subject": np.zeros(0, np.int32), "fact_object": np.zeros(0, np.int32)})


def test_strongest_path_breaks_ties_by_smaller_seed_then_smaller_next_node():
    # passage 0; entities 0..3 at nodes 1..4. Seeds e0 and e1 each have one edge to the passage:
    # equal scores, the smaller seed's walk is kept whichever order the seeds come in
    snap = _hand_snapshot(1, 4, [(1, 0, 1.0), (2, 0, 1.0)])
    assert strongest_path(snap, Seeds(entities={1: 1.0, 0: 1.0}), 0) == ([1, 0], pytest.approx(1.0))
    # seed e0 reaches the passage through e2 or e3 with equal probability (1/2 * 1/2): e2 (node 3)
    snap = _hand_snapshot(1, 4, [(1, 3, 1.0), (1, 4, 1.0), (4, 0, 1.0), (3, 0, 1.0)])
    assert strongest_path(snap, Seeds(entities={0: 1.0}), 0) == ([1, 3, 0], pytest.approx(0.25))
    # three edges, two tied first steps: e0 -> e1 | e2 -> e3 -> passage; the smaller (e1, node 2)
    snap = _hand_snapshot(1, 4, [(1, 3, 1.0), (1, 2, 1.0), (2, 4, 1.0), (3, 4, 1.0), (4, 0, 1.0)])
    path, score = strongest_path(snap, Seeds(entities={0: 1.0}), 0)
    assert path == [1, 2, 4, 0] and score == pytest.approx(0.5 * 0.5 * (1 / 3))


def test_top_passages_are_the_k_best_with_ties_by_node():
    from hipgraph.query.graph import top_passages

    scores = np.array([0.1, 0.3, 0.0, 0.3, 0.2, 0.3])
    assert top_passages(scores, 2) == [(1, 0.3), (3, 0.3)]  # three tied at 0.3: the smaller nodes
    assert top_passages(scores, 4) == [(1, 0.3), (3, 0.3), (5, 0.3), (4, 0.2)]
    assert top_passages(scores, 10) == [(1, 0.3), (3, 0.3), (5, 0.3), (4, 0.2), (0, 0.1)]  # no zeros
    assert top_passages(scores, 0) == [] and top_passages(np.zeros(0), 3) == []


def _brute_force_path_score(snap, seeds: dict[int, float], target: int) -> float:
    """Best seed-weighted walk probability over every walk of 1-3 edges ending at ``target``
    whose inner nodes after the first step are entities (enumerated, no search)."""
    p, out = snap.n_passages, snap.out_weight

    def step(u, v):
        nb, w = snap.neighbors(u)
        hit = np.flatnonzero(nb == v)
        return float(w[hit[0]] / out[u]) if hit.size and out[u] > 0 else 0.0

    best = 0.0
    for e, weight in seeds.items():
        s = p + e
        for a in snap.neighbors(s)[0].tolist():
            if a == target:
                best = max(best, weight * step(s, a))
                continue
            for b in snap.neighbors(a)[0].tolist():
                if b == target and a >= p:
                    best = max(best, weight * step(s, a) * step(a, b))
                elif b >= p and b != target:
                    best = max(best, weight * step(s, a) * step(a, b) * step(b, target))
    return best


@pytest.mark.parametrize("seed", range(6))
def test_strongest_path_equals_brute_force_on_random_graphs(seed):
    from hipgraph.query.ppr import to_csr
    from hipgraph.query.snapshot import _assemble

    rng = np.random.default_rng(seed)
    n_p, n_e = 12, 15
    src = np.concatenate([rng.integers(0, n_p, 40), n_p + rng.integers(0, n_e, 25)])
    dst = n_p + rng.integers(0, n_e, 65)
    keep = src != dst
    indptr, indices, weights = to_csr(n_p + n_e, src[keep], dst[keep], rng.integers(1, 4, keep.sum()).astype(float))
    arrays = {"passage_ids": np.arange(n_p), "entity_ids": np.arange(n_e), "indptr": indptr, "indices": indices,
              "weights": weights, "entity_passage_indptr": np.zeros(n_e + 1, np.int64),
              "entity_passage_indices": np.zeros(0, np.int32), "fact_ids": np.zeros(0, np.int64),
              "fact_subject": np.zeros(0, np.int32), "fact_object": np.zeros(0, np.int32)}
    snap = _assemble(0, arrays)
    seeds = {int(e): float(rng.random() + 0.1) for e in rng.choice(n_e, 3, replace=False)}
    for target in range(n_p):
        path, score = strongest_path(snap, Seeds(entities=seeds), target)
        assert score == pytest.approx(_brute_force_path_score(snap, seeds, target), abs=1e-12)
        if path:  # the path is a walk along stored edges whose probability is the score
            assert path[-1] == target and path[0] - n_p in seeds and 2 <= len(path) <= 4
            prob = seeds[path[0] - n_p]
            for u, v in zip(path, path[1:], strict=False):
                nb, w = snap.neighbors(u)
                prob *= float(w[nb == v][0] / snap.out_weight[u])
            assert prob == pytest.approx(score, abs=1e-12)


def test_snapshot_is_cached_memory_mapped_and_invalidated_by_writes(inline_index, inline_docs):
    hg = inline_index
    hg.retrieve(MULTIHOP, k=2)
    folder = cache_dir(hg.path)
    stamp = json.loads((folder / "snapshot.json").read_text())
    assert stamp["generation"] == hg.store.meta_get("generation")
    snap = hg.retriever.snapshot()
    assert isinstance(snap.indptr, np.memmap) and snap.n_passages == hg.stats()["passages"]
    assert hg.retriever.snapshot() is snap  # reused while the index is unchanged
    hg.add_documents([{"id": "extra", "title": "Oak Park, Illinois",
                       "text": "Oak Park is a village next to Chicago, Illinois. Carl Rogers was born there."}])
    hits = hg.retrieve("Which village next to Chicago was Carl Rogers born in?", k=3)
    assert "extra" in [h.doc_id for h in hits]
    assert hg.retriever.snapshot().generation == hg.store.meta_get("generation") != snap.generation
    # a corrupt cache is rebuilt, not trusted
    (folder / "indptr.npy").write_bytes(b"broken")
    hg.retriever.views._view = None  # forget the read view: the snapshot is read from the cache again
    assert hg.retriever.snapshot().n_passages == hg.stats()["passages"]


def test_graph_cache_in_a_read_only_open_and_reopen(inline_template, tmp_path, embedder):
    path = copy_index(inline_template, tmp_path)
    with hipgraph.open(path, read_only=True, embedder=embedder) as hg:
        first = [h.doc_id for h in hg.retrieve(MULTIHOP, k=3)]
    assert (cache_dir(path) / "snapshot.json").exists()
    with hipgraph.open(path, read_only=True, embedder=embedder) as hg:
        assert [h.doc_id for h in hg.retrieve(MULTIHOP, k=3)] == first


def test_batched_retrieval_equals_single_queries(inline_index):
    questions = [MULTIHOP, "Where was Carl Rogers born?", "Which supermarket chain is based in Lakeland?",
                 "Who founded the Niels Bohr Institute?"]
    for mode in ("graph", "dense", "bm25", "hybrid"):
        batch = inline_index.retrieve_many(questions, k=4, mode=mode)
        single = [inline_index.retrieve(q, k=4, mode=mode) for q in questions]
        assert [[(h.doc_id, h.passage_id) for h in hits] for hits in batch] == \
               [[(h.doc_id, h.passage_id) for h in hits] for hits in single], mode
        for hits_b, hits_s in zip(batch, single, strict=True):
            assert [h.score for h in hits_b] == pytest.approx([h.score for h in hits_s], rel=1e-5, abs=1e-9)


def test_dense_bm25_and_hybrid_modes(inline_index):
    dense = inline_index.retrieve("Where is the headquarters of Publix?", k=3, mode="dense")
    assert dense[0].doc_id == "publix" and dense[0].why["mode"] == "dense"
    bm25 = inline_index.retrieve("Lakeland", k=3, mode="bm25")
    assert [h.doc_id for h in bm25] == ["publix"]  # only one passage holds the term
    assert bm25[0].why["mode"] == "bm25" and bm25[0].score > 0
    assert (inline_index.path / "cache" / "bm25").is_dir()
    hybrid = inline_index.retrieve(MULTIHOP, k=5, mode="hybrid")
    assert hybrid[0].why["mode"] == "hybrid" and set(hybrid[0].why["ranks"]) <= {"graph", "dense", "bm25"}
    # reciprocal-rank fusion (k = 60) of the three rankings, each retrieved on its own
    fused: dict[int, float] = {}
    ranks: dict[int, dict[str, int]] = {}
    for mode in ("graph", "dense", "bm25"):
        for rank, hit in enumerate(inline_index.retrieve(MULTIHOP, k=100, mode=mode), start=1):
            fused[hit.passage_id] = fused.get(hit.passage_id, 0.0) + 1 / (60 + rank)
            ranks.setdefault(hit.passage_id, {})[mode] = rank
    best = sorted(fused, key=lambda pid: (-fused[pid], pid))[:5]
    assert [h.passage_id for h in hybrid] == best
    assert [h.score for h in hybrid] == pytest.approx([fused[pid] for pid in best], rel=1e-9)
    assert [h.why["ranks"] for h in hybrid] == [ranks[pid] for pid in best]
    assert len(ranks[best[0]]) == 3  # the best passage is ranked by all three modes
    only = RetrievalConfig(hybrid_modes=("dense",))
    assert [h.doc_id for h in inline_index.retrieve(MULTIHOP, k=4, mode="hybrid", config=only)] == \
           [h.doc_id for h in inline_index.retrieve(MULTIHOP, k=4, mode="dense")]


def test_dense_fallback_when_nothing_links(inline_index):
    cfg = RetrievalConfig(graph=GraphRetrievalConfig(fact_weight=0.0))
    question = "which one is about health care research?"
    graph = inline_index.retrieve(question, k=3, config=cfg)
    dense = inline_index.retrieve(question, k=3, mode="dense")
    assert [h.doc_id for h in graph] == [h.doc_id for h in dense]
    assert all("fallback" in h.why for h in graph)


@pytest.mark.parametrize(("call", "message"), [
    (lambda hg: hg.retrieve("", k=3), "question 0 is empty"),
    (lambda hg: hg.retrieve("   ", k=3), "question 0 is empty"),
    (lambda hg: hg.retrieve("fine", k=0), "k must be an integer >= 1"),
    (lambda hg: hg.retrieve("fine", k=2.5), "k must be an integer >= 1"),
    (lambda hg: hg.retrieve("fine", mode="sparse"), "unknown retrieval mode 'sparse'"),
    (lambda hg: hg.retrieve(None), "question must be a string"),
    (lambda hg: hg.retrieve_many("one string"), "not one string"),
    (lambda hg: hg.retrieve_many(["ok", 3]), "question 1 is not a string"),
])
def test_bad_retrieval_input(inline_index, call, message):
    with pytest.raises(ConfigError, match=message):
        call(inline_index)


def test_bad_retrieval_config():
    with pytest.raises(ConfigError, match="damping"):
        GraphRetrievalConfig(damping=1.0)
    with pytest.raises(ConfigError, match="ppr_method"):
        GraphRetrievalConfig(ppr_method="magic")
    with pytest.raises(ConfigError, match="hybrid_modes"):
        RetrievalConfig(hybrid_modes=("graph", "colbert"))


def test_missing_index_is_a_clear_error(tmp_path):
    with pytest.raises(IndexNotFoundError, match="no index at"):
        hipgraph.open(tmp_path / "nowhere", read_only=True)
    proc = run_cli("query", "--db", str(tmp_path / "nowhere"), "anything")
    assert proc.returncode == 1 and "no index at" in proc.stderr


def test_question_entity_linking_prefers_whole_titles(inline_index):
    linker = inline_index.retriever._spans
    names = inline_index.retriever.entity_names()
    (pairs,) = linker.link(["Who published the Journal of Mathematical Physics in Copenhagen?"], names)
    linked = {normalize_entity(t): eid for t, eid in pairs}
    assert set(linked) == {"journal of mathematical physics", "copenhagen"}  # not "mathematical physics"
    assert linked["journal of mathematical physics"] == names.exact("Journal of Mathematical Physics")
    assert linked["copenhagen"] == names.exact("Copenhagen") is not None


def test_cli_query_modes_and_eval_per_mode_and_hop(inline_template, tmp_path, inline_docs):
    db = copy_index(inline_template, tmp_path)
    out = json.loads(run_cli("query", "--db", str(db), "--json", "-k", "2", MULTIHOP, check=True).stdout)
    assert out["mode"] == "graph" and {h["doc_id"] for h in out["hits"]} == {"jpi", "apa"}
    bad = run_cli("query", "--db", str(db), "--mode", "sparse", "x")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr

    # a bundle over a fresh index: eval indexes its corpus (ids str(idx)) before scoring
    corpus = [{"idx": i, "title": d["title"], "text": d["text"]} for i, d in enumerate(inline_docs)]
    questions = [
        {"id": "2hop__1", "question": MULTIHOP, "gold_idx": [0, 2]},
        {"id": "2hop__2", "question": "In which state was the psychologist Carl Rogers born?", "gold_idx": [4]},
        {"id": "3hop1__3", "question": "Where did the country artist who recorded Hello Love die?",
         "gold_idx": [11, 10]},
        {"id": "nogold", "question": "What is this?", "gold_idx": []},
    ]
    bundle = tmp_path / "bundle.json"
    bundle.write_text(json.dumps({"corpus": corpus, "questions": questions}))
    fresh = tmp_path / "fresh"
    rankings = tmp_path / "rankings.jsonl"
    res = json.loads(run_cli("eval", "--db", str(fresh), str(bundle), "--json", "-q", "--k", "1,2,5",
                             "--modes", "graph,dense,bm25,hybrid", "--out", str(rankings), check=True).stdout)
    assert res["questions"] == 3
    by_mode = {r["mode"]: r for r in res["results"]}
    assert set(by_mode) == {"graph", "dense", "bm25", "hybrid"}
    for r in by_mode.values():
        assert 0 <= r["recall@1"] <= r["recall@2"] <= r["recall@5"] <= 100
        assert r["by_hops"]["2hop"]["questions"] == 2 and r["by_hops"]["3hop"]["questions"] == 1
    assert by_mode["graph"]["by_hops"]["2hop"]["recall@2"] >= 75  # MULTIHOP is found by the graph
    lines = [json.loads(line) for line in rankings.read_text().splitlines()]
    assert [row["id"] for row in lines] == ["2hop__1", "2hop__2", "3hop1__3"]
    assert set(lines[0]["rankings"]) == set(by_mode) and len(lines[0]["rankings"]["graph"]) == 5
    # recall recomputed from the written rankings matches the printed figure
    r2 = [len(set(row["gold"]) & set(row["rankings"]["dense"][:2])) / len(row["gold"]) for row in lines]
    assert by_mode["dense"]["recall@2"] == pytest.approx(round(100 * sum(r2) / 3, 2))
    text = run_cli("eval", "--db", str(fresh), str(bundle), "--modes", "dense", "--k", "2", check=True).stdout
    assert "dense" in text and "2hop" in text
    for args, message in ((["--modes", "colbert"], "unknown mode"), (["--k", "0"], "cut-offs"),
                          (["--k", "a"], "comma-separated")):
        proc = run_cli("eval", "--db", str(fresh), str(bundle), *args)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    missing = run_cli("eval", "--db", str(fresh), str(tmp_path / "none.json"))
    assert missing.returncode == 2 and "file not found" in missing.stderr


# ------------------------------------------------------------------ recognition-memory filter
def _filter_server(reply_for):
    try:
        from tests.openai_server import ScriptedOpenAIServer
    except ImportError:  # tests/ is not a package: pytest puts it on sys.path
        from openai_server import ScriptedOpenAIServer

    def handler(body):
        user = body["messages"][-1]["content"]
        candidates = json.loads(user.split("Candidate facts: ", 1)[1].rsplit("\nOutput:", 1)[0])["fact"]
        return reply_for(candidates)

    return ScriptedOpenAIServer(chat_handler=handler)


def test_llm_fact_filter_keeps_only_the_chosen_facts(inline_index):
    from hipgraph.config import ChatConfig

    chosen = []

    def keep_publisher_facts(candidates):
        kept = [c for c in candidates if "published" in c[1]]
        chosen.append(kept)
        return json.dumps({"fact": kept + [["made", "up", "fact"]]})  # invented facts are ignored

    with _filter_server(keep_publisher_facts) as srv:
        cfg = RetrievalConfig(llm=ChatConfig(base_url=srv.base_url, model="judge", max_retries=0))
        hits = inline_index.retrieve(MULTIHOP, k=3, config=cfg)
        assert len(srv.chat_requests) == 1
        body = srv.chat_requests[0][1]
        assert MULTIHOP in body["messages"][-1]["content"] and body["response_format"]["type"] == "json_object"
    why = hits[0].why
    kept = {(f["subject"], f["relation"], f["object"]) for f in why["seed_facts"]}
    assert kept == {tuple(c) for c in chosen[0]} and kept
    assert why["fact_filter"].startswith(f"kept {len(kept)} of ")
    # a model that keeps nothing leaves only the question's own entities as graph seeds
    with _filter_server(lambda c: json.dumps({"fact": []})) as srv:
        cfg = RetrievalConfig(llm=ChatConfig(base_url=srv.base_url, model="judge", max_retries=0))
        why = inline_index.retrieve(MULTIHOP, k=3, config=cfg)[0].why
    assert why["seed_facts"] == [] and all(e["via"] == "question" for e in why["seed_entities"])


def test_llm_fact_filter_failure_falls_back_to_the_threshold(inline_index):
    from hipgraph.config import ChatConfig

    plain = inline_index.retrieve(MULTIHOP, k=3)
    with _filter_server(lambda c: "this is not JSON") as srv:
        cfg = RetrievalConfig(llm=ChatConfig(base_url=srv.base_url, model="judge", max_retries=0))
        hits = inline_index.retrieve(MULTIHOP, k=3, config=cfg)
    assert hits[0].why["fact_filter"].startswith("not applied (unusable reply")
    assert [h.doc_id for h in hits] == [h.doc_id for h in plain]


def test_graph_retrieval_with_fewer_entities_than_passages(make_index):
    # many passages over a handful of names: the entity -> passage matrix is wider than tall
    hg = make_index("few-entities")
    hg.add_documents([{"id": f"d{i}", "text": "Alice Varga met Bob Stone at the spring fair."}
                      for i in range(40)])
    stats = hg.stats()
    assert stats["entities"] < stats["passages"] == 40
    hits = hg.retrieve("Who met Bob Stone?", k=3)
    assert len(hits) == 3 and hits[0].why["mode"] == "graph"
