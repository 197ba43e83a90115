"""Turn hits over conversation memory: stored turn vectors, the turn score checked against a
computation from the conversation record, depth consistency, old indexes, mixed indexes, the
answer context and threads."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
from conftest import check_consistency

import hipgraph
from hipgraph.config import GeneratorConfig, RetrievalConfig
from hipgraph.errors import ConfigError
from hipgraph.query.bm25 import BM25Config, BM25Index

UNIT = RetrievalConfig(memory_hits="unit")
TURNS_A = ["I moved to Lisbon in January for a job at Acme Bank.",
           "Wow, how is the new flat near the river?",
           "Small, but I can see the Tagus from my desk.",
           "I adopted a puppy called Rex last weekend.",
           "Rex already learned to sit and to fetch a ball."]
TURNS_B = ["My pottery class started on Monday, we made bowls.",
           "Did the bowls survive the kiln?",
           "Two cracked, but the blue one is perfect.",
           "I am training for the Porto half marathon in October.",
           "How many kilometres do you run a week now?",
           "About forty, mostly along the river at dawn."]
QUESTIONS = ["What is the name of the puppy?", "Which city did Ana move to?",
             "What did they make in the pottery class?", "How far does Ana run each week?"]


def _conversation():
    def turns(texts, session):
        return [{"id": f"S{session}:{i}", "speaker": "Ana" if i % 2 else "Ben", "text": t}
                for i, t in enumerate(texts, start=1)]
    return {"id": "ana-ben", "speakers": ["Ana", "Ben"], "sessions": [
        {"id": "1", "time": "2023-01-20 10:00", "turns": turns(TURNS_A, 1)},
        {"id": "2", "time": "2023-03-05 18:30", "turns": turns(TURNS_B, 2)}]}


def _lines():
    return ([(f"S1:{i}", f"{'Ana' if i % 2 else 'Ben'}: {t}") for i, t in enumerate(TURNS_A, start=1)]
            + [(f"S2:{i}", f"{'Ana' if i % 2 else 'Ben'}: {t}") for i, t in enumerate(TURNS_B, start=1)])


@pytest.fixture
def memory(make_index):
    hg = make_index("mem", config=hipgraph.IndexConfig(
        embedder=hipgraph.EmbedderConfig(precision="fp32"),
        conversation=hipgraph.ConversationConfig(max_turns=3, min_turns=1)))
    hg.add_conversation(_conversation())
    return hg


def test_turn_vectors_are_stored_per_turn_and_leave_with_their_session(memory, embedder):
    con = memory.store.con
    assert con.execute("SELECT count(*) FROM turn_vectors").fetchall()[0][0] == len(TURNS_A) + len(TURNS_B)
    check_consistency(memory)  # one unit-norm vector per turn each unit covers
    # each is the embedding of the turn's "Speaker: text" line
    rows = con.execute("""SELECT d.key, p.start_char, t.turn, t.vec FROM turn_vectors t
                          JOIN passages p ON p.id = t.passage_id JOIN documents d ON d.id = p.doc_id
                          ORDER BY d.key, t.turn""").fetchall()
    lines = dict(_lines())
    expected = embedder.embed([lines[f"S{key[-1]}:{turn + 1}"] for key, _, turn, _ in rows])
    got = np.array([vec for *_, vec in rows], dtype=np.float32)
    assert np.abs(got - expected).max() < 1e-5
    # a changed session replaces its turn vectors; a deleted one takes them along
    changed = _conversation()
    changed["sessions"][1]["turns"] = changed["sessions"][1]["turns"][:2]
    assert memory.add_conversation(changed).replaced == 1
    assert con.execute("SELECT count(*) FROM turn_vectors").fetchall()[0][0] == len(TURNS_A) + 2
    check_consistency(memory)
    memory.delete_conversation("ana-ben", ["1"])
    assert con.execute("SELECT count(*) FROM turn_vectors").fetchall()[0][0] == 2
    check_consistency(memory)


def test_turn_hits_follow_the_documented_score(memory, embedder):
    """Each question's turn hits against the score computed here from the conversation record:
    cosine of the turn line's embedding, BM25 over all turn lines divided by the best among the
    candidates, 0.4 / sqrt(1 + rank of the unit) with the units as unit hits rank them."""
    cfg = RetrievalConfig()
    lines = _lines()
    ids = [i for i, _ in lines]
    tvec = embedder.embed([text for _, text in lines])
    bm25 = BM25Index.build(np.arange(len(lines)), [text for _, text in lines],
                           BM25Config(k1=cfg.bm25_k1, b=cfg.bm25_b))
    for mode in ("graph", "dense", "bm25"):
        units = memory.retrieve_many(QUESTIONS, k=100, mode=mode, config=UNIT)
        turns = memory.retrieve_many(QUESTIONS, k=100, mode=mode)
        qvec = embedder.embed(QUESTIONS)
        for qi, (unit_hits, turn_hits) in enumerate(zip(units, turns, strict=True)):
            rank_of = {t: r for r, h in enumerate(unit_hits) for t in h.turn_ids}
            # every turn of the ranked units once (fewer units than turn_units = 30); graph and
            # bm25 rank only the units their seeds reach or that share a word with the question
            assert len(turn_hits) == len(rank_of) and (mode != "dense" or len(rank_of) == len(ids))
            lexical = bm25.scores_all([QUESTIONS[qi]])[0].astype(np.float64)
            known = [j for j, t in enumerate(ids) if t in rank_of]
            best = lexical[known].max()
            score = {ids[j]: float(tvec[j] @ qvec[qi]) + 0.4 * (lexical[j] / best if best > 0 else 0.0)
                     + 0.4 / math.sqrt(1 + rank_of[ids[j]]) for j in known}
            expected = sorted(score, key=lambda t: (-score[t], rank_of[t], ids.index(t)))
            got = [h.turn_ids[0] for h in turn_hits]
            assert got == expected, (mode, QUESTIONS[qi])
            for h in turn_hits:
                assert h.score == pytest.approx(score[h.turn_ids[0]], abs=1e-4)
                assert h.text == dict(lines)[h.turn_ids[0]] and h.speakers == (h.text.split(":")[0],)
                assert h.why["unit_rank"] == rank_of[h.turn_ids[0]] + 1
                assert h.why["mode"] == mode or (mode == "graph" and "fallback" in h.why)
                assert h.time == ("2023-01-20T10:00:00" if h.session == "1" else "2023-03-05T18:30:00")
    top = memory.retrieve("What is the name of the puppy?", k=1)[0]
    assert top.turn_ids == ("S1:4",) and top.text == "Ben: I adopted a puppy called Rex last weekend."


def test_turn_hits_at_depth_k_are_the_first_k_of_any_deeper_request(memory):
    for cfg in (RetrievalConfig(), RetrievalConfig(turn_units=1), RetrievalConfig(turn_units=2)):
        for mode in ("graph", "dense", "bm25", "hybrid"):
            deep = memory.retrieve_many(QUESTIONS, k=11, mode=mode, config=cfg)
            for k in (1, 3, 5, 8):
                shallow = memory.retrieve_many(QUESTIONS, k=k, mode=mode, config=cfg)
                assert [[h.turn_ids for h in hs] for hs in shallow] == \
                       [[h.turn_ids for h in hs[:k]] for hs in deep], (cfg.turn_units, mode, k)
    # with turn_units=1 the best unit's turns lead, then the next unit's, unit by unit
    hits = memory.retrieve("What is the name of the puppy?", k=11, config=RetrievalConfig(turn_units=1))
    ranks = [h.why["unit_rank"] for h in hits]
    assert ranks == sorted(ranks)


def test_an_index_written_before_turn_vectors_embeds_its_turns_at_query_time(memory, tmp_path):
    before = [[(h.turn_ids, round(h.score, 4)) for h in hs] for hs in memory.retrieve_many(QUESTIONS, k=6)]
    path = memory.path
    memory.store.con.execute("DROP TABLE turn_vectors")  # as a version-1 index written before it
    memory.close()
    with hipgraph.open(path, read_only=True) as old:
        assert not old.store.con.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = 'turn_vectors'").fetchall()[0][0]
        got = [[(h.turn_ids, round(h.score, 4)) for h in hs] for hs in old.retrieve_many(QUESTIONS, k=6)]
        assert got == before
    # a writable open adds the table; sessions added from then on store their vectors
    with hipgraph.open(path) as hg:
        extra = _conversation()
        extra["id"] = "ana-cy"
        extra["sessions"] = extra["sessions"][:1]
        hg.add_conversation(extra)
        assert hg.store.con.execute("SELECT count(*) FROM turn_vectors").fetchall()[0][0] == len(TURNS_A)
        got = [[(h.turn_ids, round(h.score, 4)) for h in hs if h.conversation == "ana-ben"]
               for hs in hg.retrieve_many(QUESTIONS, k=30)]
        assert all(g for g in got)


def test_documents_beside_memory_compete_as_whole_passages(memory):
    memory.add_documents([{"id": "rex-doc", "text": "Rex is a common name for dogs in English-speaking "
                                                    "countries; the puppy Rex of Ana is a beagle."}])
    hits = memory.retrieve("What breed is Ana's puppy Rex?", k=4)
    doc = [h for h in hits if h.doc_id == "rex-doc"]
    assert doc and doc[0].turn_ids == () and doc[0].text.startswith("Rex is a common name")
    assert all(len(h.turn_ids) == 1 for h in hits if h.doc_id != "rex-doc")
    assert sum(1 for h in memory.retrieve("What breed is Ana's puppy Rex?", k=100)) == 12  # 11 turns + 1


def test_answer_context_fills_its_budget_with_turns_headed_by_their_day(memory):
    gen = GeneratorConfig(context_tokens=120)
    answer = memory.answer("What did Ana adopt and what did the puppy learn?", generator=gen)
    lines = answer.context.split("\n\n")[0].split("\n")
    assert len(lines) > 2 and answer.usage == {}
    assert lines[0].startswith("[1] 20 January 2023: ")
    assert any("Ben: I adopted a puppy called Rex" in line for line in lines[:3])
    assert any("Ana: Rex already learned to sit" in line for line in lines[:3])  # same unit, both kept
    assert len({h.passage_id for h in answer.citations}) < len(answer.citations)  # turns of one unit
    from hipgraph.generation.context import estimate_tokens
    assert estimate_tokens(answer.context) <= 120 + len(lines)
    # more budget, more turns; unit hits give whole units
    wide = memory.answer("What did Ana adopt and what did the puppy learn?", generator=GeneratorConfig(context_tokens=2000))
    assert len(wide.citations) == 11
    units = memory.answer("What did Ana adopt?", generator=gen, config=UNIT)
    assert len(units.citations) <= 5 and all(len(h.turn_ids) > 1 or h.text.count(": ") == 1 for h in units.citations)


def test_turn_hits_are_the_same_from_many_threads(memory):
    memory.store.con.execute("DROP TABLE turn_vectors")  # also the query-time embedding path
    expected = [[h.turn_ids for h in hs] for hs in memory.retrieve_many(QUESTIONS, k=7)]
    memory.close()
    with hipgraph.open(memory.path, read_only=True) as hg:
        errors, results = [], {}

        def work(i: int) -> None:
            try:
                for _ in range(3):
                    q = i % len(QUESTIONS)
                    results.setdefault(i, []).append([h.turn_ids for h in hg.retrieve(QUESTIONS[q], k=7)])
            except Exception as exc:  # noqa: BLE001 - collected and asserted below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        for i, got in results.items():
            assert got == [expected[i % len(QUESTIONS)]] * 3


def test_turn_settings_are_validated():
    for bad in ({"memory_hits": "turns"}, {"turn_units": 0}, {"turn_units": 2.5},
                {"turn_rank_weight": -0.1}, {"turn_bm25_weight": float("nan")}, {"turn_bm25_weight": True}):
        with pytest.raises(ConfigError):
            RetrievalConfig(**bad)
