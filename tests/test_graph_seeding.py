"""Graph-mode seeding against an independent reference of the README's recipe.

README "Retrieval", mode ``graph``: facts with cosine >= 0.65 among the top 5 seed their subject
and object with score ÷ passages mentioning the entity (max over facts, strongest 5 kept); the
question's entities (linked by name, or by embedding at cosine >= 0.9) add 1 ÷ passage count;
the best 1,000 passages get 0.02 × min-max normalised dense score; PPR (damping 0.5) over the
passage–entity graph ranks passages; with no fact and no linked entity the dense ranking is
returned. The reference recomputes all of it from the DuckDB rows (brute-force cosines over the
stored vectors, counts from ``mentions``, igraph PPR over ``edges``) and the question embedding,
never through ``make_seeds``/``reset_matrix``. The corpus is written so that every rule moves
passages in the ranking; each rule's test checks the move the reference predicts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import igraph
import numpy as np
import pytest
from conftest import build_template

import hipgraph
from hipgraph.config import GraphRetrievalConfig, RetrievalConfig

# Three small worlds: a fishing town mentioned in five passages (a hub), a concert hall mentioned
# in five, and a railway line whose three passages share no entity with the others.
DOCS = [
    ("finch", "Orla Finch", "Orla Finch is a painter who lives in Brackwater. Orla Finch painted the "
     "Harbour Mural in 1998."),
    ("mural", "Harbour Mural", "The Harbour Mural is a large painting on the sea wall of Brackwater. "
     "It shows fishing boats at dawn."),
    ("town", "Brackwater", "Brackwater is a fishing town on the north coast. Brackwater has a "
     "lighthouse and a covered market."),
    ("lighthouse", "Brackwater Lighthouse", "The Brackwater Lighthouse was built in 1871 by the "
     "engineer Silas Marr. It stands on a rocky point."),
    ("marr", "Silas Marr", "Silas Marr was a Scottish engineer. Silas Marr designed iron bridges and "
     "coastal lighthouses."),
    ("market", "Brackwater Market", "The covered market of Brackwater sells fresh fish every "
     "Saturday morning."),
    ("quill", "Tessa Quill", "Tessa Quill is a novelist. Tessa Quill wrote The Salt Road, a novel set "
     "in Brackwater."),
    ("saltroad", "The Salt Road", "The Salt Road is a novel about a smuggler. The Salt Road won the "
     "Heron Prize in 2004."),
    ("railway", "Kestrel Valley Railway", "The Kestrel Valley Railway connects Dunmore and Pellam. "
     "The Kestrel Valley Railway opened in 1902."),
    ("dunmore", "Dunmore", "Dunmore is a market town in the hills. Dunmore has a famous cheese fair."),
    ("pellam", "Pellam", "Pellam is a small village with a stone church. Pellam lies at the end of "
     "the railway line."),
    ("heron", "Heron Prize", "The Heron Prize is a literary award for novels about the sea. Tessa "
     "Quill later chaired the Heron Prize jury."),
    ("wren", "Ada Wren", "Ada Wren is a cellist. Ada Wren performed at Corvin Hall in 2011."),
    ("hall", "Corvin Hall", "Corvin Hall is a concert venue with a glass roof. Corvin Hall seats nine "
     "hundred people."),
    ("choir", "Glenn Choir", "The Glenn Choir rehearses in Corvin Hall on Mondays."),
    ("fire", "Restoration", "After the fire of 1990, Corvin Hall was restored by local builders."),
    ("jazz", "Blue Note Club", "The Blue Note Club was a jazz bar next to Corvin Hall."),
]


@dataclass(frozen=True)
class Question:
    """A question and its entity spans as written: ``names`` equal an entity name (normalised),
    ``spans`` do not and are linked only by embedding, if at all."""

    text: str
    names: tuple[str, ...] = ()
    spans: tuple[str, ...] = ()


Q_FACT_DIVISION = Question("Could Corvin Hall be moved to the town on the north coast?",
                           names=("corvin hall", "north coast"))
Q_LINK_DIVISION = Question("Has Tessa Quill been to Corvin Hall?", names=("tessa quill", "corvin hall"))
Q_TOP_K = Question("What is there to see in Brackwater?", names=("brackwater",))
Q_DENSE_SEEDS = Question("which fishing town is on the north coast?", names=("north coast",))
Q_BELOW = Question("which fishing town has a lighthouse?")  # best fact just below 0.65
Q_ABOVE = Question("Did Silas Marr ever visit Brackwater?", names=("silas marr", "brackwater"))
Q_EMBEDDING = Question("Did Silas-Marr write novels about the sea?", spans=("Silas-Marr",))
Q_FALLBACK = Question("is the weather nice today?", spans=("today",))
QUESTIONS = [
    Q_FACT_DIVISION, Q_LINK_DIVISION, Q_TOP_K, Q_DENSE_SEEDS, Q_BELOW, Q_ABOVE, Q_EMBEDDING,
    Q_FALLBACK,
    Question("Where did Tessa Quil grow up?", spans=("Tessa Quil",)),
    Question("What does the Kestrel-Valley Railway connect?", spans=("the Kestrel-Valley Railway",)),
    Question("When did Ada Wren perform?", names=("ada wren",)),
    Question("Which novel won the Heron Prize?", names=("heron prize",)),
]


# ------------------------------------------------------------------ the reference
@dataclass(frozen=True)
class Recipe:
    """The README's numbers; the two switches remove the ÷ passage count terms (reference only)."""

    min_fact_score: float = 0.65
    fact_top_k: int = 5
    entity_top_k: int = 5
    fact_weight: float = 1.0
    link_weight: float = 1.0
    link_threshold: float = 0.9
    passage_weight: float = 0.02
    passage_candidates: int = 1000
    damping: float = 0.5
    divide_fact_seeds: bool = True
    divide_link_seeds: bool = True

    def replace(self, **changes) -> Recipe:
        return dataclasses.replace(self, **changes)


def _unit(x) -> np.ndarray:
    x = np.asarray(x, np.float64)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


class IndexRows:
    """What the reference reads from DuckDB: vectors, passage counts and the edges table."""

    def __init__(self, con):
        def rows(sql):
            return con.execute(sql).fetchall()

        self.passage_ids = [int(r[0]) for r in rows("SELECT id FROM passages ORDER BY id")]
        self.doc = {int(p): key for p, key in rows(
            "SELECT p.id, d.key FROM passages p JOIN documents d ON d.id = p.doc_id")}
        self.passage_of = {key: p for p, key in self.doc.items()}
        self.entity_ids = [int(r[0]) for r in rows("SELECT id FROM entities ORDER BY id")]
        self.name = {int(e): n for e, n in rows("SELECT id, name FROM entities")}
        self.entity_named = {n: e for e, n in self.name.items()}
        self.count = {int(e): int(c) for e, c in rows(
            "SELECT entity_id, count(DISTINCT passage_id) FROM mentions GROUP BY entity_id")}
        facts = rows("""SELECT f.id, f.subject_id, f.object_id, v.vec FROM facts f
                        JOIN fact_vectors v ON v.id = f.id WHERE f.kind = 'triple' ORDER BY f.id""")
        self.fact_ids = [int(r[0]) for r in facts]
        self.fact_ends = [(int(r[1]), int(r[2])) for r in facts]
        self.fact_vecs = _unit([r[3] for r in facts])
        vec = dict(rows("SELECT id, vec FROM passage_vectors"))
        self.passage_vecs = _unit([vec[p] for p in self.passage_ids])
        ents = rows("SELECT id, vec FROM entity_vectors ORDER BY id")
        self.entity_vec_ids = [int(r[0]) for r in ents]
        self.entity_vecs = _unit([r[1] for r in ents])
        # passages then entities; every stored edge in both directions, with its stored weight
        self.node = {("p", p): i for i, p in enumerate(self.passage_ids)}
        self.node.update({("e", e): len(self.passage_ids) + i for i, e in enumerate(self.entity_ids)})
        self.graph = igraph.Graph(n=len(self.node), directed=True)
        edges, self.weights = [], []
        for etype, src, dst, w in rows("SELECT type, src, dst, weight FROM edges"):
            a = self.node[("p", src)] if etype == "mention" else self.node[("e", src)]
            b = self.node[("e", dst)]
            edges += [(a, b), (b, a)]
            self.weights += [float(w), float(w)]
        self.graph.add_edges(edges)

    def nearest_entity(self, span_vec: np.ndarray) -> tuple[int, float]:
        cos = self.entity_vecs @ _unit(span_vec)
        best = int(np.argmax(cos))
        return self.entity_vec_ids[best], float(cos[best])


@dataclass
class Expected:
    fact_cosines: np.ndarray
    dense: dict[int, float]  # passage id -> cosine to the question
    facts: list[tuple[int, float]] = field(default_factory=list)  # seeding facts, best first
    fact_entities: dict[int, float] = field(default_factory=dict)  # before the entity_top_k cut
    entities: dict[int, float] = field(default_factory=dict)  # entity id -> seed weight
    linked: set[int] = field(default_factory=set)
    passages: dict[int, float] = field(default_factory=dict)  # passage id -> seed weight
    scores: dict[int, float] = field(default_factory=dict)  # passage id -> PPR mass (or cosine)
    fallback: bool = False

    def ranking(self, k: int | None = None) -> list[int]:
        # PageRank leaves passages unreachable from every seed without mass (and without a hit);
        # the dense fallback ranks every passage, negative cosines included
        order = sorted((p for p, s in self.scores.items() if self.fallback or s > 1e-12),
                       key=lambda p: (-self.scores[p], p))
        return order[:k]


def reference(rows: IndexRows, qvec: np.ndarray, span_vecs: dict[str, np.ndarray],
              question: Question, recipe: Recipe) -> Expected:
    """The documented recipe over the stored rows, by brute force."""
    cos = rows.fact_vecs @ _unit(qvec)
    dense = rows.passage_vecs @ _unit(qvec)
    out = Expected(fact_cosines=cos, dense=dict(zip(rows.passage_ids, dense.tolist(), strict=True)))
    order = np.argsort(-cos, kind="stable")
    for i in [int(i) for i in order if cos[i] >= recipe.min_fact_score][: recipe.fact_top_k]:
        out.facts.append((rows.fact_ids[i], float(cos[i])))
        for ent in rows.fact_ends[i]:
            weight = recipe.fact_weight * float(cos[i])
            if recipe.divide_fact_seeds:
                weight /= rows.count[ent]
            out.fact_entities[ent] = max(out.fact_entities.get(ent, 0.0), weight)
    strongest = sorted(out.fact_entities.items(), key=lambda kv: (-kv[1], kv[0]))
    out.entities = {e: w for e, w in strongest[: recipe.entity_top_k] if w > 0}
    linked = [rows.entity_named[n] for n in question.names]
    for span in question.spans:
        ent, similarity = rows.nearest_entity(span_vecs[span])
        if similarity >= recipe.link_threshold:
            linked.append(ent)
    for ent in dict.fromkeys(linked):
        weight = recipe.link_weight / (rows.count[ent] if recipe.divide_link_seeds else 1)
        out.entities[ent] = out.entities.get(ent, 0.0) + weight
        out.linked.add(ent)
    if not out.entities:
        out.fallback = True
        out.scores = dict(out.dense)
        return out
    best = np.argsort(-dense, kind="stable")[: recipe.passage_candidates]
    lo, hi = dense[best].min(), dense[best].max()
    for i in best:
        weight = recipe.passage_weight * (dense[i] - lo) / (hi - lo)
        if weight > 0:
            out.passages[rows.passage_ids[i]] = float(weight)
    reset = np.zeros(len(rows.node))
    for p, w in out.passages.items():
        reset[rows.node[("p", p)]] += w
    for e, w in out.entities.items():
        reset[rows.node[("e", e)]] += w
    mass = rows.graph.personalized_pagerank(directed=True, weights=rows.weights,
                                            reset=reset.tolist(), damping=recipe.damping)
    out.scores = {p: float(mass[rows.node[("p", p)]]) for p in rows.passage_ids}
    return out


# ------------------------------------------------------------------ fixtures and checks
@pytest.fixture(scope="module")
def seeding(tmp_path_factory, embedder):
    docs = [{"id": key, "title": title, "text": text} for key, title, text in DOCS]
    path = build_template(tmp_path_factory, embedder, "seeding", docs)
    with hipgraph.open(path, read_only=True, embedder=embedder) as hg:
        yield hg, IndexRows(hg.store.con)


def expect(seeding, embedder, question: Question, recipe: Recipe = Recipe()) -> Expected:
    _, rows = seeding
    vecs = embedder.embed([question.text, *question.spans])
    return reference(rows, vecs[0], dict(zip(question.spans, vecs[1:], strict=True)), question, recipe)


def retrieve(seeding, question: Question, **graph_changes) -> list:
    hg, rows = seeding
    config = RetrievalConfig(graph=GraphRetrievalConfig(**graph_changes)) if graph_changes else None
    return hg.retrieve(question.text, k=len(rows.passage_ids), mode="graph", config=config)


def docs(rows: IndexRows, passage_ids) -> list[str]:
    return [rows.doc[p] for p in passage_ids]


def assert_matches(seeding, hits, exp: Expected) -> None:
    """Hits, scores and every seed in ``why`` equal the reference."""
    _, rows = seeding
    got = [h.passage_id for h in hits]
    assert sorted(got) == sorted(exp.ranking()), (docs(rows, got), docs(rows, exp.ranking()))
    for hit in hits:
        assert hit.score == pytest.approx(exp.scores[hit.passage_id], abs=1e-6), hit.doc_id
    # in the reference's order, up to float noise between near-equal scores
    ref = [exp.scores[p] for p in got]
    assert all(a >= b - 1e-6 for a, b in zip(ref, ref[1:], strict=False)), docs(rows, got)
    if exp.fallback:
        assert all(h.why["mode"] == "dense" and "fallback" in h.why for h in hits)
        return
    why = hits[0].why
    assert why["mode"] == "graph" and "fallback" not in why
    assert [f["fact_id"] for f in why["seed_facts"]] == [f for f, _ in exp.facts]
    assert [f["score"] for f in why["seed_facts"]] == pytest.approx([s for _, s in exp.facts], abs=1e-5)
    seeds = {e["entity_id"]: e for e in why["seed_entities"]}
    assert set(seeds) == set(exp.entities), (
        sorted(e["name"] for e in seeds.values()), sorted(rows.name[e] for e in exp.entities))
    for ent, weight in exp.entities.items():
        assert seeds[ent]["weight"] == pytest.approx(weight, abs=1e-5), rows.name[ent]
        assert seeds[ent]["via"] == ("question" if ent in exp.linked else "fact"), rows.name[ent]
    for hit in hits:
        assert hit.why["dense_seed"] == pytest.approx(exp.passages.get(hit.passage_id, 0.0), abs=1e-6)


def rank_of(ranking: list[int], rows: IndexRows, key: str) -> int:
    return ranking.index(rows.passage_of[key])


# ------------------------------------------------------------------ tests
@pytest.mark.parametrize("question", QUESTIONS, ids=lambda q: q.text[:40])
def test_graph_retrieval_equals_the_reference_recipe(seeding, embedder, question):
    _, rows = seeding
    exp = expect(seeding, embedder, question)
    # the written names are entities and are linked; no tie decides the entity_top_k cut
    assert all(n in rows.entity_named for n in question.names)
    weights = sorted(exp.fact_entities.values(), reverse=True)
    assert len(weights) <= 5 or weights[4] > weights[5] + 1e-9
    assert_matches(seeding, retrieve(seeding, question), exp)


def test_fact_seeds_are_divided_by_the_entity_passage_count(seeding, embedder):
    _, rows = seeding
    exp = expect(seeding, embedder, Q_FACT_DIVISION)
    undivided = expect(seeding, embedder, Q_FACT_DIVISION, Recipe(divide_fact_seeds=False))
    hall = rows.entity_named["corvin hall"]
    assert rows.count[hall] == 5 and hall in exp.fact_entities
    # corvin hall is seeded by a fact and linked: 0.71 / 5 + 1 / 5, not 0.71 + 1 / 5
    assert exp.entities[hall] == pytest.approx(exp.fact_entities[hall] + 1 / 5)
    assert undivided.entities[hall] == pytest.approx(5 * exp.fact_entities[hall] + 1 / 5)
    # divided, the town linked through "north coast" leads; undivided, the restoration passage
    # (the fact's source, about the five-passage hall) would overtake it
    assert docs(rows, exp.ranking(2)) == ["town", "fire"]
    assert docs(rows, undivided.ranking(2)) == ["fire", "town"]
    hits = retrieve(seeding, Q_FACT_DIVISION)
    assert [h.doc_id for h in hits[:2]] == ["town", "fire"]
    assert_matches(seeding, hits, exp)


def test_linked_entity_seeds_are_divided_by_the_entity_passage_count(seeding, embedder):
    _, rows = seeding
    exp = expect(seeding, embedder, Q_LINK_DIVISION)
    undivided = expect(seeding, embedder, Q_LINK_DIVISION, Recipe(divide_link_seeds=False))
    hall, quill = rows.entity_named["corvin hall"], rows.entity_named["tessa quill"]
    assert (rows.count[hall], rows.count[quill]) == (5, 2)
    assert exp.entities[hall] == pytest.approx(1 / 5) and hall not in exp.fact_entities
    assert exp.linked == {hall, quill}
    # undivided, the hall's passages (weight 1 instead of 1/5) would pass The Salt Road
    ranked, ranked_undivided = exp.ranking(), undivided.ranking()
    assert rank_of(ranked, rows, "saltroad") < rank_of(ranked, rows, "fire")
    assert rank_of(ranked_undivided, rows, "fire") < rank_of(ranked_undivided, rows, "saltroad")
    hits = retrieve(seeding, Q_LINK_DIVISION)
    assert [h.doc_id for h in hits[:3]] == ["quill", "heron", "saltroad"]
    assert_matches(seeding, hits, exp)


def test_fact_score_threshold_is_065_and_inclusive(seeding, embedder):
    hg, rows = seeding
    below, above = expect(seeding, embedder, Q_BELOW), expect(seeding, embedder, Q_ABOVE)
    # one question's best fact lies just below the documented 0.65, another's just above
    assert 0.60 <= below.fact_cosines.max() < 0.65 <= above.fact_cosines.max() < 0.70
    assert below.fallback and not below.facts and len(above.facts) == 1
    hits = retrieve(seeding, Q_BELOW)
    assert_matches(seeding, hits, below)
    assert_matches(seeding, retrieve(seeding, Q_ABOVE), above)
    # the threshold set to exactly the best fact's cosine (as FAISS computes it) lets it seed
    qvec = embedder.embed([Q_BELOW.text])  # no spans: the engine embeds the question alone
    scores, ids = hg.vectors.search("fact", qvec, 2)
    best, runner_up = float(scores[0, 0]), float(scores[0, 1])
    assert best == pytest.approx(below.fact_cosines.max(), abs=1e-6) and best - runner_up > 1e-3
    at = expect(seeding, embedder, Q_BELOW, Recipe(min_fact_score=best - 1e-6))
    assert [f for f, _ in at.facts] == [int(ids[0, 0])]
    hits_at = retrieve(seeding, Q_BELOW, min_fact_score=best)
    assert_matches(seeding, hits_at, at)
    # the fact "brackwater has lighthouse" seeds the town's hub: its market passage overtakes
    # the lighthouse passage that follows the town in the dense ranking
    assert docs(rows, below.ranking(2)) == ["town", "lighthouse"]
    assert [h.doc_id for h in hits_at[:2]] == ["town", "market"]
    over = retrieve(seeding, Q_BELOW, min_fact_score=float(np.nextafter(best, 2.0)))
    assert [h.doc_id for h in over] == [h.doc_id for h in hits] and "fallback" in over[0].why


def test_entity_top_k_keeps_only_the_strongest_fact_entities(seeding, embedder):
    _, rows = seeding
    exp = expect(seeding, embedder, Q_TOP_K)
    top1 = expect(seeding, embedder, Q_TOP_K, Recipe(entity_top_k=1))
    weights = sorted(exp.fact_entities.values(), reverse=True)
    assert len(weights) == 5 and weights[0] > weights[1]  # no tie decides the cut
    lighthouse, brackwater = rows.entity_named["lighthouse"], rows.entity_named["brackwater"]
    assert set(top1.entities) == {lighthouse, brackwater}  # the strongest + the linked entity
    assert len(exp.entities) == 5
    # with five entities the novel (via "novel set in brackwater") is second; with one it drops
    assert docs(rows, exp.ranking(2)) == ["town", "quill"]
    assert docs(rows, top1.ranking(2)) == ["town", "market"]
    assert rank_of(top1.ranking(), rows, "quill") > rank_of(exp.ranking(), rows, "quill")
    assert_matches(seeding, retrieve(seeding, Q_TOP_K), exp)
    hits = retrieve(seeding, Q_TOP_K, entity_top_k=1)
    assert [h.doc_id for h in hits[:2]] == ["town", "market"]
    assert_matches(seeding, hits, top1)


def test_passage_seeds_are_min_max_normalised_dense_scores(seeding, embedder):
    _, rows = seeding
    exp = expect(seeding, embedder, Q_DENSE_SEEDS)
    no_dense = expect(seeding, embedder, Q_DENSE_SEEDS, Recipe(passage_weight=0.0))
    # every passage is a candidate: the best gets 0.02, the worst 0 (and no seed)
    assert max(exp.passages.values()) == pytest.approx(0.02)
    assert len(exp.passages) == len(rows.passage_ids) - 1
    worst = min(exp.dense, key=exp.dense.get)
    assert worst not in exp.passages
    # the mural (painting on the sea wall, close to "fishing town ... coast") beats Orla Finch's
    # passage by its dense seed; without passage seeds Finch's passage is third
    mural, finch = rows.passage_of["mural"], rows.passage_of["finch"]
    assert exp.passages[mural] > exp.passages[finch]
    assert docs(rows, exp.ranking(3)) == ["town", "market", "mural"]
    assert docs(rows, no_dense.ranking(3)) == ["town", "market", "finch"]
    hits = retrieve(seeding, Q_DENSE_SEEDS)
    assert_matches(seeding, hits, exp)
    hits_no_dense = retrieve(seeding, Q_DENSE_SEEDS, passage_weight=0.0)
    assert [h.doc_id for h in hits_no_dense[:3]] == ["town", "market", "finch"]
    assert_matches(seeding, hits_no_dense, no_dense)
    # without passage seeds the railway's component gets no mass at all
    assert not {"railway", "dunmore", "pellam"} & {h.doc_id for h in hits_no_dense}
    # passage_weight scales them: at 0.5 the best passage's seed is 0.5
    strong = expect(seeding, embedder, Q_DENSE_SEEDS, Recipe(passage_weight=0.5))
    assert max(strong.passages.values()) == pytest.approx(0.5)
    assert_matches(seeding, retrieve(seeding, Q_DENSE_SEEDS, passage_weight=0.5), strong)


def test_question_entities_link_by_embedding_when_spelt_differently(seeding, embedder):
    _, rows = seeding
    question = Q_EMBEDDING
    no_facts = {"min_fact_score": 1.0}  # isolate the link: no fact seeds
    exp = expect(seeding, embedder, question, Recipe(**no_facts))
    unlinked = expect(seeding, embedder, question, Recipe(link_threshold=1.0, **no_facts))
    marr = rows.entity_named["silas marr"]
    span_vec = embedder.embed(["Silas-Marr"])[0]
    assert "silas-marr" not in rows.entity_named
    entity, similarity = rows.nearest_entity(span_vec)
    assert entity == marr and 0.9 <= similarity < 1.0
    assert exp.entities == {marr: pytest.approx(1 / 2)} and exp.linked == {marr}
    assert unlinked.fallback
    # linked, both passages about Silas Marr lead; unlinked, the dense ranking puts the novel
    # passages (the question's "novels about the sea") before the lighthouse
    assert docs(rows, exp.ranking(2)) == ["marr", "lighthouse"]
    assert rank_of(unlinked.ranking(), rows, "lighthouse") > 2
    hits = retrieve(seeding, question, **no_facts)
    assert [h.doc_id for h in hits[:2]] == ["marr", "lighthouse"]
    assert hits[0].why["seed_entities"] == [
        {"entity_id": marr, "name": "silas marr", "weight": 0.5, "via": "question"}]
    assert_matches(seeding, hits, exp)
    hits_unlinked = retrieve(seeding, question, link_threshold=1.0, **no_facts)
    assert_matches(seeding, hits_unlinked, unlinked)


def test_dense_ranking_when_no_fact_clears_the_threshold_and_nothing_links(seeding, embedder):
    _, rows = seeding
    exp = expect(seeding, embedder, Q_FALLBACK)
    assert exp.fallback and exp.fact_cosines.max() < 0.2
    hits = retrieve(seeding, Q_FALLBACK)
    assert_matches(seeding, hits, exp)  # the cosine order of all passages, scores = cosines
    assert {h.why["fallback"] for h in hits} == {"no fact or question entity matched"}
    # let every fact seed: the ranking becomes the PageRank the reference predicts
    seeded = expect(seeding, embedder, Q_FALLBACK, Recipe(min_fact_score=-1.0))
    assert not seeded.fallback and len(seeded.facts) == 5
    hits_seeded = retrieve(seeding, Q_FALLBACK, min_fact_score=-1.0)
    assert_matches(seeding, hits_seeded, seeded)
    assert [h.doc_id for h in hits_seeded[:3]] != [h.doc_id for h in hits[:3]]


# ------------------------------------------------------------------ the recipe by hand
def _hand_built_snapshot():
    """3 passages (nodes 0-2) and 4 entities (nodes 3-6). Mentions: e0 in p0; e1 in p0, p1; e2 in
    p2; e3 in p1. Facts (rows): 0 = e0-e1, 1 = e3-e2 (subject e3), 2 = e0-e2."""
    from hipgraph.query.ppr import to_csr
    from hipgraph.query.snapshot import _assemble

    src = np.array([0, 0, 1, 1, 2, 3, 6, 3])
    dst = np.array([3, 4, 4, 6, 5, 4, 5, 5])
    indptr, indices, weights = to_csr(7, src, dst, np.ones(src.size))
    arrays = {"passage_ids": np.array([10, 11, 12]), "entity_ids": np.array([20, 21, 22, 23]),
              "indptr": indptr, "indices": indices, "weights": weights,
              "entity_passage_indptr": np.array([0, 1, 3, 4, 5]),
              "entity_passage_indices": np.array([0, 0, 1, 2, 1], np.int32),
              "fact_ids": np.array([100, 101, 102]), "fact_subject": np.array([0, 3, 0], np.int32),
              "fact_object": np.array([1, 2, 2], np.int32)}
    return _assemble(0, arrays)


def test_make_seeds_follows_the_recipe_on_a_hand_built_snapshot():
    """Every rule of make_seeds on numbers worked out by hand (ties at the cut go to the smaller
    entity index; entity index 0 is an ordinary entity)."""
    from hipgraph.query.graph import make_seeds, reset_matrix

    snap = _hand_built_snapshot()
    rows = np.array([-1, 0, 1, 2])  # best first; -1: a fact FAISS knows but the snapshot does not
    scores = np.array([0.95, 0.9, 0.8, 0.7])
    cfg = GraphRetrievalConfig(entity_top_k=2)
    seeds = make_seeds(snap, rows, scores, {3: "Quill"}, np.array([2, 0, 1]), np.array([0.7, 0.5, 0.3]), cfg)
    assert seeds.facts == [(0, 0.9), (1, 0.8), (2, 0.7)]
    # fact entities: e0 max(0.9/1, 0.7/1) = 0.9, e1 0.9/2, e2 max(0.8/1, 0.7/1) = 0.8, e3 0.8/1;
    # the top 2 are e0 and e2 (e2 beats e3 at 0.8 by index, though e3 was seen first); the linked
    # e3 adds 1/1
    assert seeds.entities == pytest.approx({0: 0.9, 2: 0.8, 3: 1.0})
    assert seeds.linked == {3: "Quill"}
    # min-max of 0.7, 0.5, 0.3 is 1, 0.5, 0 -> x 0.02; a zero weight is no seed
    assert seeds.passages == pytest.approx({2: 0.02, 0: 0.01})
    reset = reset_matrix(snap, [seeds])
    assert reset.shape == (1, 7) and reset[0].tolist() == pytest.approx([0.01, 0.0, 0.02, 0.9, 0.0, 0.8, 1.0])

    # fact_top_k counts the facts that passed the threshold; a linked entity adds to a fact weight
    few = make_seeds(snap, rows, scores, {0: "Orla"}, np.zeros(0, np.int64), np.zeros(0),
                     dataclasses.replace(cfg, fact_top_k=1, min_fact_score=0.85))
    assert few.facts == [(0, 0.9)]
    assert few.entities == pytest.approx({0: 1.9, 1: 0.45}) and few.passages == {}
    # nothing clears the threshold and nothing links: no graph seeds (the caller falls back to dense)
    none = make_seeds(snap, rows, scores, {}, np.array([1]), np.array([0.4]),
                      dataclasses.replace(cfg, min_fact_score=0.96))
    assert not none.has_graph_seeds and none.facts == [] and none.passages == {1: 0.02}
    # equal dense scores give every candidate the full passage weight
    flat = make_seeds(snap, rows[:0], scores[:0], {}, np.array([0, 2]), np.array([0.5, 0.5]), cfg)
    assert flat.passages == pytest.approx({0: 0.02, 2: 0.02})
