"""Budget-aware evaluation of conversation memory: evidence recall within B retrieved turns and
within N tokens of turns, hand-computed on small hit lists, then end to end on the first sessions
of the repo's LoCoMo conversation (real DuckDB, FAISS, MiniLM, spaCy) against an independent numpy
ranking of turns and a recomputation from the mode's own hits, and through the CLI."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from conftest import REPO, index_config

import hipgraph
from hipgraph.cli import main as cli_main
from hipgraph.indexers.conversations import read_conversation_file
from hipgraph.memory_eval import (
    BASELINE,
    budget_recall,
    budget_turns,
    evaluate_memory,
    token_budget_turns,
    turn_tokens,
)
from hipgraph.types import Conversation, Session, Turn

LOCOMO = REPO / "data" / "locomo_conv30.json"
SESSIONS = 3  # the first three sessions of conv-30: 58 turns, 33 questions with evidence in them

# ------------------------------------------------------------------ the fills, by hand
HITS = [["a", "b"], ["b", "c", "d"], ["e"], ["a", "f"]]


def test_turn_budget_takes_distinct_turns_in_hit_order():
    assert budget_turns(HITS, 1) == ["a"]
    assert budget_turns(HITS, 2) == ["a", "b"]  # ends exactly with the first hit
    assert budget_turns(HITS, 3) == ["a", "b", "c"]  # the repeated "b" is skipped, not counted
    assert budget_turns(HITS, 4) == ["a", "b", "c", "d"]
    assert budget_turns(HITS, 5) == ["a", "b", "c", "d", "e"]
    assert budget_turns(HITS, 6) == ["a", "b", "c", "d", "e", "f"]  # "a" again skipped
    assert budget_turns(HITS, 50) == ["a", "b", "c", "d", "e", "f"]  # the hits run out
    assert budget_turns([], 5) == []
    assert budget_recall(["c", "f"], budget_turns(HITS, 5)) == 0.5
    assert budget_recall(["f", "f"], budget_turns(HITS, 6)) == 1.0  # evidence counted once
    assert budget_recall(["f"], budget_turns(HITS, 5)) == 0.0


def test_token_budget_stops_at_the_first_turn_that_does_not_fit():
    cost = {"a": 10, "b": 5, "c": 20, "d": 1, "e": 3, "f": 2}
    assert token_budget_turns(HITS, 15, cost) == ["a", "b"]  # 10 + 5: exactly the budget
    assert token_budget_turns(HITS, 14, cost) == ["a"]  # "b" overflows; the fill stops there
    assert token_budget_turns(HITS, 9, cost) == []  # a first turn over the budget leaves nothing
    # 10 + 5 + 20 = 35, then "d" (1) overflows 35; the repeated "b" is neither taken nor charged
    assert token_budget_turns(HITS, 35, cost) == ["a", "b", "c"]
    assert token_budget_turns(HITS, 36, cost) == ["a", "b", "c", "d"]
    assert token_budget_turns(HITS, 38, cost) == ["a", "b", "c", "d"]  # "e" (3) makes 39
    assert token_budget_turns(HITS, 41, cost) == ["a", "b", "c", "d", "e", "f"]  # all 41
    assert token_budget_turns(HITS, 10**6, cost) == ["a", "b", "c", "d", "e", "f"]


def test_turn_tokens_count_speaker_and_text_at_1_3_per_word_or_mark():
    conv = Conversation("c", (Session("1", (Turn("1:1", "Ana", "I live in Lisbon now."),
                                            Turn("1:2", "Ben", "Lisbon?! Wow..."))),))
    # "Ana : I live in Lisbon now ." = 8 words and marks -> ceil(10.4) = 11;
    # "Ben : Lisbon ? ! Wow . . ." = 9 -> ceil(11.7) = 12
    assert turn_tokens(conv) == {"1:1": 11, "1:2": 12}


# ------------------------------------------------------------------ end to end on LoCoMo
@pytest.fixture(scope="module")
def first_sessions(tmp_path_factory):
    """conv-30 cut to its first sessions (a LoCoMo file), with the questions whose evidence
    turns all lie in them (keeps indexing to a few seconds)."""
    raw = json.loads(LOCOMO.read_text(encoding="utf-8"))
    conv = dict(raw["conversations"][0])
    conv["turns"] = [t for t in conv["turns"] if t["session"] <= SESSIONS]
    sessions = {f"D{s}" for s in range(1, SESSIONS + 1)}
    conv["questions"] = [q for q in conv["questions"] if q.get("evidence_dia_ids")
                         and {e.split(":")[0] for e in q["evidence_dia_ids"]} <= sessions]
    path = tmp_path_factory.mktemp("locomo") / "conv30_first_sessions.json"
    path.write_text(json.dumps({**raw, "conversations": [conv]}), encoding="utf-8")
    return path


def _open(embedder):
    def open_index(path, create=False, read_only=False):
        return hipgraph.open(path, create=create, read_only=read_only, embedder=embedder,
                             config=index_config())
    return open_index


@pytest.fixture(scope="module")
def memory_root(tmp_path_factory, first_sessions, embedder):
    """The eval root with the conversation's index built once (fp32 MiniLM, saved in it) for
    the API and CLI tests to reuse."""
    (conv,), _ = read_conversation_file(first_sessions, "locomo")
    root = tmp_path_factory.mktemp("memory-eval")
    with _open(embedder)(root / conv.id, create=True) as hg:
        hg.add_conversation(conv)
    return root


def _tokens(line: str) -> int:
    """The documented estimate, written out: ceil(1.3 x words and punctuation marks)."""
    return math.ceil(1.3 * len(re.findall(r"\w+|[^\w\s]", line)))


def _first_turns(ranked_units, budget):
    out = []
    for unit in ranked_units:
        for t in unit:
            if t not in out and len(out) < budget:
                out.append(t)
    return out


def _within_tokens(ranked_units, budget, cost):
    out, used = [], 0
    for t in [t for unit in ranked_units for t in unit]:
        if t in out:
            continue
        if used + cost[t] > budget:
            break
        out.append(t)
        used += cost[t]
    return out


def _mean(values):
    return round(100 * sum(values) / len(values), 2)


def test_budget_recall_end_to_end_against_numpy_and_the_modes_own_hits(first_sessions, memory_root,
                                                                        embedder):
    (conv,), questions = read_conversation_file(first_sessions, "locomo")
    assert len(questions) == 33 and sum(q["category"] == "adversarial" for q in questions) == 9
    answerable = [q for q in questions if q["category"] != "adversarial"]
    open_index = _open(embedder)
    results, seconds = evaluate_memory(memory_root, [conv], questions, ["graph"], [1, 5],
                                       open_index=open_index, token_budgets=(500, 1000))
    assert seconds == {}  # the module's index
    by_mode = {r.mode: r for r in results}
    graph, base = by_mode["graph"], by_mode[BASELINE]
    assert graph.budget_questions == base.budget_questions == 24

    turns = [t for s in conv.sessions for t in s.turns]
    cost = {t.id: _tokens(f"{t.speaker}: {t.text}") for t in turns}
    # the baseline: every turn ranked by cosine in numpy (ties by turn order)
    tv = embedder.embed([f"{t.speaker}: {t.text}" for t in turns])
    qv = embedder.embed([q["question"] for q in questions])
    order = np.argsort(-(qv @ tv.T), axis=1, kind="stable")
    base_units = {q["id"]: [[turns[i].id] for i in row] for q, row in zip(questions, order, strict=True)}
    # the mode: its own turn hits, the whole ranking (fewer units than the 50 candidates ranked,
    # and turn hits at depth k are the first k of any deeper request, so deeper retrieval only
    # appends)
    with open_index(memory_root / conv.id, read_only=True) as hg:
        units = hg.stats()["passages"]
        assert units < 50
        hits = hg.retrieve_many([q["question"] for q in questions], k=len(turns), mode="graph",
                                question_dates=[q["question_date"] for q in questions])
    graph_units = {q["id"]: [list(h.turn_ids) for h in hs] for q, hs in zip(questions, hits, strict=True)}

    def recall(q, taken):
        return len(set(q["evidence"]) & set(taken)) / len(set(q["evidence"]))

    for res, ranked in ((base, base_units), (graph, graph_units)):
        for b in (5, 10, 20):
            assert res.turn_budget[b] == _mean([recall(q, _first_turns(ranked[q["id"]], b))
                                                for q in answerable]), (res.mode, b)
            for cat in ("multi-hop", "temporal", "single-hop"):
                in_cat = [q for q in answerable if q["category"] == cat]
                assert res.turn_budget_by_category[cat][b] == _mean(
                    [recall(q, _first_turns(ranked[q["id"]], b)) for q in in_cat]), (res.mode, cat, b)
        for n in (500, 1000):
            assert res.token_budget[n] == _mean([recall(q, _within_tokens(ranked[q["id"]], n, cost))
                                                 for q in answerable]), (res.mode, n)
        assert "adversarial" not in res.turn_budget_by_category | res.token_budget_by_category
        # unit recall@k stays as it was: every question with evidence, adversarial ones included
        for k in (1, 5):
            assert res.recall[k] == _mean([recall(q, [t for u in ranked[q["id"]][:k] for t in u])
                                           for q in questions]), (res.mode, k)
        assert res.counts["adversarial"] == 9
    assert base.turn_budget[20] > base.turn_budget[5] and graph.token_budget[1000] > 0

    # depth 2 (cut-off 1, budget 2 turns) is too shallow for 1,000 tokens: retrieved again deeper;
    # a budget over the whole memory takes every turn (on a few questions, to stay cheap)
    few = questions[:6] + [q for q in questions if q["category"] == "adversarial"][:2]
    assert {q["category"] for q in few} >= {"temporal", "adversarial"}
    results, _ = evaluate_memory(memory_root, [conv], few, ["graph"], [1], open_index=open_index,
                                 turn_budgets=[2], token_budgets=[1000, 10**6])
    by_mode = {r.mode: r for r in results}
    few_answerable = [q for q in few if q["category"] != "adversarial"]
    for res, ranked in ((by_mode[BASELINE], base_units), (by_mode["graph"], graph_units)):
        assert res.token_budget[1000] == _mean([recall(q, _within_tokens(ranked[q["id"]], 1000, cost))
                                                for q in few_answerable]), res.mode
        assert res.token_budget[10**6] == 100.0
        assert res.turn_budget[2] == _mean([recall(q, _first_turns(ranked[q["id"]], 2))
                                            for q in few_answerable])
    d = by_mode["graph"].to_dict()
    assert (d["turns@2"], d["tokens@1000"], d["budget_questions"]) == (
        by_mode["graph"].turn_budget[2], by_mode["graph"].token_budget[1000], len(few_answerable))
    assert d["by_category"]["temporal"]["tokens@1000"] == by_mode["graph"].token_budget_by_category[
        "temporal"][1000]
    assert set(d["by_category"]["adversarial"]) == {"questions", "recall@1"}


def test_cli_reports_budget_columns_first_with_the_difference_to_turn_dense(first_sessions, memory_root,
                                                                           capsys):
    args = ["eval", "--db", str(memory_root), "--format", "locomo", str(first_sessions), "--modes",
            "graph", "--k", "1,5", "--turn-budgets", "5,10", "--token-budgets", "500", "-q"]
    assert cli_main([*args, "--json"]) == 0  # the index (and its fp32 embedder) is reused
    out = json.loads(capsys.readouterr().out)
    assert out["index_seconds"] == {}
    rows = {r["mode"]: r for r in out["results"]}
    columns = ["turns@5", "turns@10", "tokens@500", "recall@1", "recall@5"]
    graph, base = rows["graph"], rows[BASELINE]
    assert graph["budget_questions"] == 24 and set(columns) <= set(graph) and "turns@20" not in graph
    delta = out["vs_turn-dense"]["graph"]
    assert delta == {**{c: round(graph[c] - base[c], 2) for c in columns}, "by_category": {
        c: {k: round(v[k] - base["by_category"][c][k], 2) for k in columns if k in v}
        for c, v in graph["by_category"].items()}}
    assert cli_main(args) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("mode / category"))
    assert header.split()[3:] == ["T@5", "T@10", "tok@500", "R@1", "R@5", "ms/q"]
    assert "24 non-adversarial" in text

    def row(label, start):
        return next(line for line in lines[start:] if line.strip().startswith(label)).split()

    g = row("graph", 0)
    assert [float(x) for x in g[1:11]] == [x for c in columns
                                           for x in (round(graph[c], 1), round(graph[c] - base[c], 1))]
    b = row(BASELINE, 0)
    assert [float(x) for x in b[1:6]] == [round(base[c], 1) for c in columns] and len(b) == 7
    after_base = lines.index(next(line for line in lines if line.startswith(BASELINE)))
    adversarial = row("adversarial", after_base)
    assert adversarial[1:4] == ["-", "-", "-"] and adversarial[-1] == "(n=9)"
    temporal = row("temporal", after_base)
    assert float(temporal[1]) == round(base["by_category"]["temporal"]["turns@5"], 1)
