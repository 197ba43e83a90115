"""``mode="expand"``: query-time KG expansion on real indexes (DuckDB, FAISS, MiniLM, spaCy), with
a real local OpenAI-compatible server standing in for the LLM that proposes and verifies facts."""

from __future__ import annotations

import json

import pytest
from conftest import MULTIHOP_QUESTION, check_consistency, copy_index

import hipgraph
from hipgraph.config import ChatConfig, ExpandConfig, RetrievalConfig
from hipgraph.errors import ConfigError, StoreError
from hipgraph.query.expand import Expander, Expansion, SubgraphFact, parse_facts, parse_verdict
from hipgraph.types import LearnedFact

try:
    from tests.openai_server import ScriptedOpenAIServer
except ImportError:  # tests/ is not a package: pytest puts it on sys.path
    from openai_server import ScriptedOpenAIServer

MULTIHOP = MULTIHOP_QUESTION
SUPPORTED = ["American Psychological Association", "had first president", "G. Stanley Hall"]
UNGROUNDED = ["Journal of Psychotherapy Integration", "is edited by", "Niels Bohr"]  # no passage has both
NOT_ENTAILED = ["American Psychological Association", "was founded by", "G. Stanley Hall"]


def _llm_server(proposals=(SUPPORTED, UNGROUNDED, NOT_ENTAILED), on_propose=None):
    """A scripted model: keeps every candidate in graph mode's fact filter, proposes
    ``proposals`` and judges only the "first president" fact entailed; ``on_propose()`` runs
    (in the server's thread) before each proposal reply."""

    def handler(body):
        user = body["messages"][-1]["content"]
        if "Candidate facts: " in user:  # graph mode's recognition-memory filter: keep all
            facts = json.loads(user.split("Candidate facts: ", 1)[1].rsplit("\nOutput:", 1)[0])
            return json.dumps(facts)
        if "Known facts: " in user:
            if on_propose is not None:
                on_propose()
            return json.dumps({"facts": [list(p) for p in proposals]})
        if user.startswith("Fact: "):
            fact = json.loads(user.split("\n", 1)[0][len("Fact: "):])
            ok = fact[1] == "had first president"
            return json.dumps({"supported": ok, "passages": [1] if ok else []})
        return "{}"

    return ScriptedOpenAIServer(chat_handler=handler)


def _llm_config(srv, **expand) -> RetrievalConfig:
    return RetrievalConfig(llm=ChatConfig(base_url=srv.base_url, model="judge", max_retries=0),
                           expand=ExpandConfig(**expand))


def _doc_of(hg, pid: int) -> str:
    return hg.store.con.execute(
        "SELECT d.key FROM passages p JOIN documents d ON d.id = p.doc_id WHERE p.id = ?", [pid]).fetchall()[0][0]


def test_offline_expansion_finds_the_bridge_and_equals_retrieve(inline_index):
    hg = inline_index
    exp = hg.expand(MULTIHOP, k=3)
    assert isinstance(exp, Expansion) and exp.question == MULTIHOP
    docs = [h.doc_id for h in exp.hits]
    assert {"jpi", "apa"} <= set(docs[:2]), docs  # entry passage and bridge passage
    # the subgraph leads from the question's journal to the association that publishes it
    assert any(f.triple == ("journal of psychotherapy integration", "published by",
                            "american psychological association") for f in exp.facts)
    assert {"journal of psychotherapy integration", "american psychological association"} <= \
        {e.name for e in exp.entities}
    for f in exp.facts:  # offline: stored facts only, each backed by its source passages
        assert isinstance(f, SubgraphFact) and f.verified and f.fact_id is not None
        assert f.source in {"graph", "retrieval"} and f.passage_ids
        assert f.support >= ExpandConfig().min_support
    assert exp.persisted == 0 and exp.path_queries
    why = exp.hits[0].why
    assert why["mode"] == "expand" and why["ranks"]["question"] >= 1
    apa = next(h for h in exp.hits if h.doc_id == "apa")
    assert apa.why["supports"]  # the subgraph facts this passage supports
    retrieved = hg.retrieve(MULTIHOP, k=3, mode="expand")
    assert [(h.passage_id, h.score, h.why) for h in retrieved] == \
           [(h.passage_id, h.score, h.why) for h in exp.hits]
    assert hg.retrieve_many([MULTIHOP, "Where was Carl Rogers born?"], k=3, mode="expand")[0] == retrieved
    json.dumps(exp.to_dict())  # JSON-able


def test_budget_is_respected_and_every_iteration_traced(inline_index):
    hg = inline_index
    one = hg.expand(MULTIHOP, k=3, config=RetrievalConfig(expand=ExpandConfig(max_iterations=1)))
    assert [t["iteration"] for t in one.trace] == [0]
    assert one.trace[0]["frontier"] == ["journal of psychotherapy integration"]
    assert {f.iteration for f in one.facts} == {0}
    two = hg.expand(MULTIHOP, k=3)
    assert [t["iteration"] for t in two.trace] == [0, 1]
    assert set(two.trace[1]["frontier"]) <= {e.name for e in two.entities}
    assert any(f.iteration == 1 for f in two.facts)
    for t in two.trace:
        assert {"frontier", "candidates", "added", "entities_added", "dropped"} <= set(t)
    # a tight entity budget stops growth and says why
    small = hg.expand(MULTIHOP, k=3, config=RetrievalConfig(expand=ExpandConfig(max_entities=3)))
    assert len(small.entities) <= 3
    reasons = [d["reason"] for t in small.trace for d in t["dropped"]]
    assert reasons and all("max_entities=3" in r for r in reasons)
    assert {"jpi", "apa"} <= {h.doc_id for h in small.hits}
    cfg = RetrievalConfig(expand=ExpandConfig(frontier_size=1, facts_per_entity=1, retrieval_facts=0))
    narrow = hg.expand(MULTIHOP, k=3, config=cfg)
    for t in narrow.trace:
        assert len(t["frontier"]) <= 1 and len(t["added"]) <= 1


def test_llm_proposals_are_checked_against_passages(inline_index):
    hg = inline_index
    with _llm_server() as srv:
        exp = hg.expand(MULTIHOP, k=3, config=_llm_config(srv))
        prompts = [b["messages"][-1]["content"] for _, b, _ in srv.requests]
    assert any(p.startswith("Question: ") and "Known facts: " in p for p in prompts)
    new = [f for f in exp.facts if f.source == "llm"]
    assert [f.triple for f in new] == [("american psychological association", "had first president",
                                        "g. stanley hall")]
    fact = new[0]
    assert fact.verified and fact.fact_id is None and fact.iteration == 0
    assert fact.subject_id is not None and fact.object_id is not None  # both names are graph entities
    assert _doc_of(hg, fact.passage_ids[0]) == "apa" and fact.support >= ExpandConfig().min_support
    dropped = {tuple(d["fact"]): d["reason"] for t in exp.trace for d in t["dropped"]}
    assert "no passage mentions both" in dropped[("journal of psychotherapy integration", "is edited by",
                                                  "niels bohr")]
    assert "not entailed" in dropped[("american psychological association", "was founded by", "g. stanley hall")]
    # only the grounded proposals reached the model's verifier
    verified = [json.loads(p.split("\n", 1)[0][len("Fact: "):]) for p in prompts if p.startswith("Fact: ")]
    assert sorted(v[1] for v in verified) == ["had first president", "was founded by"]
    assert exp.trace[0]["proposed"] and exp.persisted == 0
    # what persist=True would hand to the indexer: the verified new fact with its passages
    assert exp.new_facts == [LearnedFact(*fact.triple, fact.passage_ids)]
    assert not hg.store.con.execute("SELECT * FROM facts WHERE relation = 'had first president'").fetchall()
    assert {"jpi", "apa"} <= {h.doc_id for h in exp.hits}
    assert any(fact.triple == tuple(s) for h in exp.hits for s in h.why["supports"])


def test_unusable_llm_replies_leave_the_offline_expansion(inline_index):
    hg = inline_index
    with ScriptedOpenAIServer(chat_handler=lambda body: "not JSON at all") as srv:
        cfg = _llm_config(srv)
        exp = hg.expand(MULTIHOP, k=3, config=cfg)
    assert "unusable proposal reply" in exp.trace[0]["llm"]
    assert all(f.source != "llm" for f in exp.facts)
    assert {"jpi", "apa"} <= {h.doc_id for h in exp.hits}
    with pytest.raises(ValueError, match="three non-empty strings"):
        parse_facts('{"facts": [["a", "b"]]}', 5)
    with pytest.raises(ValueError, match="supported"):
        parse_verdict('{"verdict": "yes"}', 2)
    with pytest.raises(ValueError, match="between 1 and 2"):
        parse_verdict('{"supported": true, "passages": [3]}', 2)
    assert parse_verdict('{"supported": true, "passages": [2]}', 2) == (True, [1])


def test_persist_writes_the_verified_new_fact(inline_index, inline_template, tmp_path, embedder):
    hg = inline_index
    generation = hg.store.generation
    facts_before = hg.stats()["facts"]
    with _llm_server() as srv:
        exp = hg.expand(MULTIHOP, k=3, config=_llm_config(srv), persist=True)
        assert exp.persisted == 1
        assert hg.store.generation == generation + 1 and hg.stats()["facts"] == facts_before + 1
        check_consistency(hg)
        rows = hg.store.con.execute("""
            SELECT f.id, s.name, f.relation, o.name, f.kind, fs.extractor, fs.passage_id FROM facts f
            JOIN entities s ON s.id = f.subject_id JOIN entities o ON o.id = f.object_id
            JOIN fact_sources fs ON fs.fact_id = f.id WHERE f.relation = 'had first president'""").fetchall()
        assert [r[1:6] for r in rows] == [("american psychological association", "had first president",
                                           "g. stanley hall", "triple", "expand:judge")]
        assert _doc_of(hg, rows[0][6]) == "apa"
        fid = rows[0][0]
        assert [f.fact_id for f in exp.facts if f.source == "llm"] == [fid]
        # proposing it again finds it stored: nothing more is written
        again = hg.expand(MULTIHOP, k=3, config=_llm_config(srv), persist=True)
        assert again.persisted == 0 and hg.stats()["facts"] == facts_before + 1
        assert again.new_facts == []  # the proposal resolved to the stored fact
        assert [f.fact_id for f in again.facts if f.source == "llm"] == [fid]
    # a later retrieval sees the new fact: as a graph seed fact and in an offline expansion
    hits = hg.retrieve("Who was the first president of the American Psychological Association?", k=3)
    assert any(s["fact_id"] == fid for s in hits[0].why["seed_facts"])
    assert hits[0].doc_id == "apa"
    offline = hg.expand("Who was the first president of the American Psychological Association?", k=3)
    assert any(f.fact_id == fid and f.source in {"graph", "retrieval"} for f in offline.facts)
    # offline persistence has nothing new to write
    assert hg.expand(MULTIHOP, k=3, persist=True).persisted == 0
    check_consistency(hg)
    # a read-only handle refuses to persist
    path = copy_index(inline_template, tmp_path / "ro")
    with hipgraph.open(path, read_only=True, embedder=embedder) as ro:
        with pytest.raises(StoreError, match="read-only"):
            ro.expand(MULTIHOP, k=3, persist=True)
        assert ro.expand(MULTIHOP, k=3).hits


def test_persist_creates_a_new_entity_with_its_mention(inline_index):
    hg = inline_index
    proposal = ["Carl Rogers", "was born in", "Oak Park, Illinois"]  # "oak park, illinois": no entity yet
    assert hg.store.con.execute("SELECT count(*) FROM entities WHERE name = 'oak park, illinois'").fetchall()[0][0] == 0
    with _llm_server(proposals=[proposal]) as srv:
        cfg = _llm_config(srv, llm_verify=False)
        exp = hg.expand("Where was the psychologist Carl Rogers born?", k=3, config=cfg, persist=True)
    assert exp.persisted == 1
    (fact,) = [f for f in exp.facts if f.source == "llm"]
    assert fact.triple == ("carl rogers", "was born in", "oak park, illinois") and fact.object_id is not None
    assert _doc_of(hg, fact.passage_ids[0]) == "rogers"
    surfaces = hg.store.con.execute(
        "SELECT surface_forms FROM entities WHERE name = 'oak park, illinois'").fetchall()
    assert surfaces == [(["Oak Park, Illinois"],)]
    check_consistency(hg)
    hits = hg.retrieve("In which village in Illinois was Carl Rogers born?", k=2)
    assert hits[0].doc_id == "rogers"


@pytest.mark.parametrize(("call", "message"), [
    (lambda hg: hg.expand("", k=3), "question 0 is empty"),
    (lambda hg: hg.expand("  ", k=3), "question 0 is empty"),
    (lambda hg: hg.expand("fine", k=0), "k must be an integer >= 1"),
    (lambda hg: hg.retrieve("fine", k=0, mode="expand"), "k must be an integer >= 1"),
    (lambda hg: hg.expand(None), "question must be a string"),
    (lambda hg: hg.expand("fine", config=RetrievalConfig(expand=ExpandConfig(max_iterations=0))),
     "expand.max_iterations must be >= 1"),
])
def test_bad_expand_input(inline_index, call, message):
    with pytest.raises(ConfigError, match=message):
        call(inline_index)


def test_bad_expand_config():
    with pytest.raises(ConfigError, match="min_support"):
        ExpandConfig(min_support=2.0)
    with pytest.raises(ConfigError, match="path_weight"):
        ExpandConfig(path_weight=-1)
    with pytest.raises(ConfigError, match="max_entities"):
        ExpandConfig(max_entities=0)


def test_cli_query_expand_prints_the_subgraph(inline_template, tmp_path):
    from conftest import run_cli

    db = copy_index(inline_template, tmp_path)
    text = run_cli("query", "--db", str(db), "--mode", "expand", MULTIHOP, "-k", "3", check=True).stdout
    assert "fact: (journal of psychotherapy integration; published by; american psychological association)" in text
    out = json.loads(run_cli("query", "--db", str(db), "--mode", "expand", MULTIHOP, "--persist", "--json",
                             check=True).stdout)
    assert out["persisted"] == 0 and out["facts"] and out["trace"]
    assert {h["doc_id"] for h in out["hits"]} >= {"jpi", "apa"}


def test_llm_names_the_relations_the_question_asks_about(inline_index):
    hg = inline_index

    def handler(body):
        system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
        if "List the relations" in system:
            return json.dumps({"relations": ["published by", "first president of"]})
        if "Known facts: " in user:
            return json.dumps({"facts": []})
        return "{}"

    with ScriptedOpenAIServer(chat_handler=handler) as srv:
        exp = hg.expand(MULTIHOP, k=3, config=_llm_config(srv))
        asked = [b for _, b, _ in srv.chat_requests if "List the relations" in b["messages"][0]["content"]]
    assert len(asked) == 1 and exp.asked_relations == ["published by", "first president of"]
    assert exp.to_dict()["asked_relations"] == exp.asked_relations
    assert {"jpi", "apa"} <= {h.doc_id for h in exp.hits}
    # the relation-aware query scores the bridge fact at least as high as the question alone
    offline = {f.triple: f.relevance for f in hg.expand(MULTIHOP, k=3).facts}
    bridge = ("journal of psychotherapy integration", "published by", "american psychological association")
    with_rel = {f.triple: f.relevance for f in exp.facts}
    assert with_rel[bridge] >= offline[bridge]


def test_one_expander_serves_a_second_run_while_the_first_waits(inline_index):
    """Per-run state lives in the run, not on the Expander: a second run on the same instance,
    made from another thread (the model server's) while the first waits for the model's proposals,
    changes neither result."""
    hg = inline_index
    other = "Where was the psychologist Carl Rogers born?"
    offline = RetrievalConfig(expand=ExpandConfig(llm_propose=False, llm_verify=False))  # no model calls
    nested: list[Expansion] = []
    pending = [False]

    def second_run():
        if pending[0]:
            pending[0] = False
            nested.append(expander.run([other], 5, offline)[0])

    with _llm_server(on_propose=second_run) as srv, hg.retriever.reading() as view:
        cfg = _llm_config(srv)
        graph = hg.retriever.query(view, cfg).graph
        expander = Expander(graph, hg.embedder, hg.vectors, hg.store, hg.chat_client(cfg.llm))
        alone, other_alone = expander.run([MULTIHOP], 5, cfg)[0], expander.run([other], 5, offline)[0]
        pending[0] = True
        interleaved = expander.run([MULTIHOP], 5, cfg)[0]
    assert len(nested) == 1 and not pending[0]
    assert any(f.source == "llm" for f in alone.facts) and len(alone.trace) == 2
    assert interleaved.to_dict() == alone.to_dict() and interleaved.ranking == alone.ranking
    assert nested[0].to_dict() == other_alone.to_dict() and nested[0].ranking == other_alone.ranking
