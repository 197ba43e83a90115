"""A write made while reads are coming derives the next read view from the previous one and the
ids it touched (hipgraph/query/snapshot_delta.py, view_delta.py): the graph snapshot, entity
names, memory units and turns must equal a view built from every committed row, after every
kind of write; the splice kernel must equal a CSR rebuilt from scratch on random graphs."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import MULTIHOP_QUESTION, index_config

from hipgraph.config import SynonymConfig
from hipgraph.query import snapshot_delta
from hipgraph.query.ppr import to_csr
from hipgraph.query.turns import MemoryTurns
from hipgraph.query.view import ReadView
from hipgraph.store import reads
from hipgraph.types import LearnedFact

ARRAYS = ("passage_ids", "entity_ids", "indptr", "indices", "weights", "entity_passage_indptr",
          "entity_passage_indices", "fact_ids", "fact_subject", "fact_object")


def _session(n: int, text: str | None = None) -> dict:
    return {"id": str(n), "time": f"2024-03-{1 + n:02d} 10:00", "turns": [
        {"speaker": "Ana", "text": text or f"I visited Porto with Marta on day {n} and bought {n + 2} azulejos."},
        {"speaker": "Ben", "text": f"Did Marta like the Ribeira market on day {n}?"},
        {"speaker": "Ana", "text": "Yes, Marta bought cheese from Serra da Estrela there."}]}


def _conversation(*sessions: dict) -> dict:
    return {"id": "trip", "speakers": ["Ana", "Ben"], "sessions": list(sessions)}


def assert_view_is_a_full_build(hg) -> None:
    """The published view's parts equal those of a view built from the committed rows."""
    nxt = hg.retriever.views._view
    assert nxt.generation == hg.store.generation
    with hg.store.lock.shared():
        fresh = ReadView(hg.store, hg.vectors, nxt.generation, persist=False)
        a, b = nxt.snapshot(), fresh.snapshot()
        for name in ARRAYS:
            x, y = getattr(a, name), getattr(b, name)
            assert x.dtype == y.dtype and np.array_equal(x, y), name  # weights bit for bit
        for table in ("by_id", "by_name", "label_by_id"):
            assert getattr(nxt.entity_names(), table) == getattr(fresh.entity_names(), table), table
        assert nxt._unit_rows() == fresh._unit_rows()
        assert nxt.memory_units() == fresh.memory_units()
        got, want = nxt.memory_turns(), fresh.memory_turns()
        for field in ("ids", "speakers", "texts", "times", "by_unit"):
            assert getattr(got, field) == getattr(want, field), field
        assert np.array_equal(got.unit, want.unit) and np.array_equal(got.position, want.position)
        assert nxt.passage_count() == fresh.passage_count()
        for key in [k for k in nxt._parts if isinstance(k, tuple) and k[0] == "turn_bm25"]:
            questions = ["Where did Ana go with Marta?", "azulejos cheese market", "dog Lince"]
            assert np.array_equal(nxt._parts[key].scores_all(questions),
                                  fresh.turn_bm25(*key[1:]).scores_all(questions)), key


class FullBuilds:
    """Counts whole builds (every row of the graph read, the turns' BM25 built over every turn)
    during writes; writes on
    these small indexes touch a large share of the graph, so splicing is forced on."""

    def __init__(self, monkeypatch):
        monkeypatch.setattr(snapshot_delta, "REBUILD_SHARE", float("inf"))
        self.calls = 0
        self.bm25_calls = 0
        original = reads.snapshot_columns
        original_bm25 = MemoryTurns.bm25

        def counted(store):
            self.calls += 1
            return original(store)

        def counted_bm25(turns, k1, b):  # the turns' BM25 built over every turn
            self.bm25_calls += 1
            return original_bm25(turns, k1, b)
        monkeypatch.setattr(reads, "snapshot_columns", counted)
        monkeypatch.setattr(MemoryTurns, "bm25", counted_bm25)


def _read(hg, question: str = MULTIHOP_QUESTION) -> None:
    """A read that builds the view's parts (so the next write derives them)."""
    assert hg.retrieve(question, k=3)
    with hg.store.lock.shared():
        view = hg.retriever.views.current()
        view.memory_units()
        view.memory_turns()
        view.turn_bm25(1.5, 0.75)


def test_every_kind_of_write_derives_a_view_equal_to_a_full_build(inline_index, monkeypatch):
    hg = inline_index
    hg.add_documents([{"id": "warm", "title": "Warm", "text": "The first write loads the extractor."}])
    _read(hg)
    builds = FullBuilds(monkeypatch)

    def learned():  # facts learned at query time: mention edges for stored passages, a new entity
        pid = int(hg.store.con.execute("SELECT min(id) FROM passages").fetchall()[0][0])
        hg.indexer.persist_learned_facts([
            LearnedFact("mira quell", "founded", "zorblax academy", (pid,)),
            LearnedFact("american psychological association", "based in", "washington", (pid,))],
            extractor="test")

    steps = [
        # new entities, facts among entities already stored (touched pairs)
        lambda: hg.add_documents([
            {"id": "zorblax", "title": "Zorblax Institute",
             "text": "The Zorblax Institute was founded by Mira Quell in 1931 in Tallinn."},
            {"id": "apa2", "title": "American Psychological Association",
             "text": "The American Psychological Association published the Journal of Psychotherapy "
                     "Integration. Mira Quell admired the American Psychological Association."}]),
        # a passage that mentions no entity is a node all the same
        lambda: hg.add_documents([{"id": "hmm", "title": "", "text": "hmm, maybe later then."}]),
        # a replaced document: its passages go, new ones come
        lambda: hg.add_documents([{"id": "zorblax", "title": "Zorblax Institute",
                                   "text": "The Zorblax Institute moved from Tallinn to Riga in 1950."}]),
        # a deleted document: entities and facts left without sources go too
        lambda: hg.delete_documents(["zorblax"]),
        lambda: hg.add_conversation(_conversation(_session(1), _session(2))),
        lambda: hg.add_conversation(_conversation(_session(1), _session(2), _session(3))),  # appended
        # a replaced session: a memory unit from the middle goes
        lambda: hg.add_conversation(_conversation(
            _session(1), _session(2, "I moved to Coimbra and adopted a dog named Lince."), _session(3))),
        learned,
        lambda: hg.delete_documents(["trip#2"]),
        lambda: hg.add_documents([{"id": "apa2", "title": "APA", "text": "The APA is in Washington."}]),
        # an entity stored before changes its label (the most frequent one of its mentions)
        lambda: hg.add_documents([{"id": "j1", "title": "Painter",
                                   "text": "Jordan painted the portrait. Jordan is a painter who lives in Paris."}]),
        lambda: hg.add_documents([
            {"id": f"j{i}", "title": "Levant",
             "text": "Amman is the capital of Jordan. Tourists fly to Jordan every spring."} for i in (2, 3)]),
    ]

    labels = []
    removes_turns = {6, 8}  # a replaced and a deleted session: turn rows renumber, BM25 rebuilt
    for n, step in enumerate(steps):
        before, bm25_before = builds.calls, builds.bm25_calls
        step()
        assert builds.calls == before, f"step {n} re-read the whole graph"
        assert (builds.bm25_calls == bm25_before) == (n not in removes_turns), f"step {n}"
        assert_view_is_a_full_build(hg)
        _read(hg, "Where did Ana go with Marta?")
        labels.append(hg.retriever.views._view.entity_names().label_by_id.get(
            hg.retriever.views._view.entity_names().by_name.get("jordan"), ""))
    assert labels[-2:] == ["PERSON", "GPE"], labels  # the relabelling happened
    assert hg.retrieve("Who founded the Zorblax Academy?", k=1)


def test_synonym_hubs_crossing_their_cap_derive_an_equal_view(make_index, monkeypatch):
    """Entities whose synonym degree crosses ``max_neighbors`` lose (or regain) all their
    synonym edges: the write touches them whole."""
    hg = make_index("hubs", config=index_config(synonyms=SynonymConfig(threshold=0.8, max_neighbors=1)))
    hg.add_documents([{"id": "a", "title": "Acme Bank", "text": "Acme Bank opened a branch in Lisbon."}])
    _read(hg, "Where did Acme Bank open a branch?")  # (after the extractor loaded: reads are recent)
    builds = FullBuilds(monkeypatch)
    degrees = []
    for doc in ({"id": "b", "title": "Acme Banks", "text": "Acme Banks opened a branch in Porto."},
                {"id": "c", "title": "Acme Banking", "text": "Acme Banking opened a branch in Faro."}):
        before = builds.calls
        hg.add_documents([doc])
        assert builds.calls == before
        assert_view_is_a_full_build(hg)
        degrees.append(max(d for (d,) in hg.store.con.execute("SELECT synonym_degree FROM entities").fetchall()))
        _read(hg, "Where did Acme Bank open a branch?")
    before = builds.calls
    hg.delete_documents(["c"])  # back under the cap: the edges come back
    assert builds.calls == before
    assert_view_is_a_full_build(hg)
    assert degrees[-1] > 1, "no entity crossed the cap: the test lost its point"


def test_a_write_without_an_itemised_record_rebuilds_the_view(inline_index, monkeypatch):
    hg = inline_index
    _read(hg)
    builds = FullBuilds(monkeypatch)
    with hg.store.writing(), hg.store.transaction():
        hg.store.con.execute("UPDATE edges SET weight = weight + 1 WHERE type = 'fact'")
        hg.store.bump_generation()  # nothing recorded: the record is not trusted
    assert builds.calls == 1
    assert_view_is_a_full_build(hg)


# ------------------------------------------------------------------ the kernel alone
def _random_graph(rng, n: int, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
    keep = src != dst
    lo, hi = np.minimum(src, dst)[keep], np.maximum(src, dst)[keep]
    pairs = np.unique(np.stack([lo, hi], 1), axis=0)
    return pairs[:, 0], pairs[:, 1], rng.integers(1, 5, len(pairs)).astype(np.float64) + rng.random(len(pairs))


@pytest.mark.parametrize("seed", range(40))
def test_splice_equals_a_rebuild_on_random_graphs(seed):
    """Old graph A; touched nodes T (some removed), new nodes appended, touched pairs P: the
    splice of A with the edges of B that touch T or P equals B built from scratch."""
    rng = np.random.default_rng(seed)
    n_old = int(rng.integers(2, 60))
    src, dst, w = _random_graph(rng, n_old, int(rng.integers(0, 200)))
    a_ptr, a_idx, a_w = to_csr(n_old, src, dst, w, undirected=True)
    touched = np.flatnonzero(rng.random(n_old) < 0.15)
    removed = touched[rng.random(touched.size) < 0.4]
    n_added = int(rng.integers(0, 5))
    node_map = np.full(n_old, -1, np.int64)
    survivors = np.setdiff1d(np.arange(n_old), removed)
    node_map[survivors] = np.arange(survivors.size)
    n_new = survivors.size + n_added
    # B: A's edges without removed nodes, those touching T re-weighted or dropped, touched pairs
    # re-weighted, plus new edges at touched or added nodes
    pairs = set()
    if src.size:
        for i in rng.choice(src.size, size=min(3, src.size), replace=False):
            if src[i] not in touched and dst[i] not in touched:
                pairs.add((int(src[i]), int(dst[i])))
    b_edges = {}
    for s, d, x in zip(src.tolist(), dst.tolist(), w.tolist(), strict=True):
        if s in removed or d in removed:
            continue
        s2, d2 = int(node_map[s]), int(node_map[d])
        if (s in touched or d in touched or (s, d) in pairs) and rng.random() < 0.3:
            continue  # dropped
        if s in touched or d in touched or (s, d) in pairs:
            x = x + float(rng.integers(0, 3))
        b_edges[(s2, d2)] = x
    fresh_nodes = [int(node_map[t]) for t in touched if t not in removed] + list(range(survivors.size, n_new))
    for _ in range(int(rng.integers(0, 10))):
        if not fresh_nodes or n_new < 2:
            break
        u, v = int(rng.choice(fresh_nodes)), int(rng.integers(0, n_new))
        if u != v:
            b_edges[(min(u, v), max(u, v))] = float(rng.integers(1, 4))
    keys = sorted(b_edges)
    b_src = np.array([k[0] for k in keys], np.int64)
    b_dst = np.array([k[1] for k in keys], np.int64)
    b_w = np.array([b_edges[k] for k in keys])
    want = to_csr(n_new, b_src, b_dst, b_w, undirected=True)

    new_touched = set(fresh_nodes)
    mapped_pairs = {(int(node_map[s]), int(node_map[d])) for s, d in pairs}
    fresh = [i for i, k in enumerate(keys) if k[0] in new_touched or k[1] in new_touched or k in mapped_pairs]
    f = to_csr(n_new, b_src[fresh], b_dst[fresh], b_w[fresh], undirected=True)
    drop = np.zeros(n_old, np.bool_)
    drop[touched] = True
    new_to_old = np.full(n_new, -1, np.int64)
    new_to_old[node_map[survivors]] = survivors
    in_pair = np.zeros(n_old, np.bool_)
    pair_keys = np.array(sorted(min(s, d) * n_old + max(s, d) for s, d in pairs), np.int64)
    for s, d in pairs:
        in_pair[s] = in_pair[d] = True
    got = snapshot_delta._splice(new_to_old, a_ptr, a_idx, a_w, drop, drop, node_map, pair_keys, in_pair,
                                 n_old, *f)
    for x, y, name in zip(got, want, ("indptr", "indices", "weights"), strict=True):
        assert np.array_equal(x, y), name


def test_views_left_lazy_by_writes_without_reads_are_derived_on_the_next_read(inline_index, monkeypatch):
    """Writes while no reads come leave views lazy; the first read after them derives the view
    from the last one through the changes of all those writes (not from every row)."""
    from hipgraph.query import view as view_module

    hg = inline_index
    hg.add_documents([{"id": "warm", "title": "Warm", "text": "The first write loads the extractor."}])
    _read(hg)
    builds = FullBuilds(monkeypatch)
    monkeypatch.setattr(view_module, "WARM_AFTER_READ_S", -1.0)  # the last read is "too long ago"
    old = hg.retriever.views._view
    hg.add_documents([{"id": "zorblax", "title": "Zorblax Institute",
                       "text": "The Zorblax Institute was founded by Mira Quell in 1931 in Tallinn."}])
    hg.add_conversation(_conversation(_session(1), _session(2)))
    hg.delete_documents(["warm"])
    assert hg.retriever.views._view is old  # nothing built meanwhile
    _read(hg, "Who founded the Zorblax Institute?")
    assert builds.calls == 0, "the read re-read the whole graph"
    assert_view_is_a_full_build(hg)
    # a write that does not itemise its changes breaks the chain: the next view is built whole
    _read(hg)
    with hg.store.writing(), hg.store.transaction():
        hg.store.con.execute("UPDATE edges SET weight = weight + 1 WHERE type = 'fact'")
        hg.store.bump_generation()
    hg.add_documents([{"id": "later", "title": "Later", "text": "Mira Quell moved to Riga in 1950."}])
    before = builds.calls
    _read(hg)
    assert builds.calls == before + 1
    assert_view_is_a_full_build(hg)


def test_closing_saves_a_snapshot_derived_by_a_read(inline_index, monkeypatch):
    from hipgraph.query import snapshot as snapshot_module
    from hipgraph.query import view as view_module

    hg = inline_index
    _read(hg)
    monkeypatch.setattr(view_module, "WARM_AFTER_READ_S", -1.0)
    hg.add_documents([{"id": "zorblax", "title": "Zorblax Institute",
                       "text": "The Zorblax Institute was founded by Mira Quell in 1931 in Tallinn."}])
    _read(hg)
    view = hg.retriever.views._view
    assert "snapshot" in view.derived and view.persist
    with hg.store.lock.shared():
        fingerprint = reads.content_fingerprint(hg.store)
    folder = snapshot_module.cache_dir(hg.path)
    assert snapshot_module.load_snapshot(folder, view.generation, fingerprint) is None
    built = view.snapshot()
    hg.close()
    saved = snapshot_module.load_snapshot(folder, view.generation, fingerprint)
    assert saved is not None
    for name in ARRAYS:
        assert np.array_equal(getattr(saved, name), getattr(built, name)), name
