"""Conversation memory: readers and their errors, topical segmentation, time parsing and relative
time expressions, sessions as documents (hits with turn ids, time-aware ranking, as_of), deleting
a session, the LoCoMo evaluation and the CLI - on real DuckDB, FAISS, MiniLM and spaCy."""

from __future__ import annotations

import json
from datetime import datetime

import numpy as np
import pytest
from conftest import REPO, check_consistency, run_cli

from hipgraph.config import ConversationConfig, RetrievalConfig
from hipgraph.errors import InputError
from hipgraph.indexers.conversations import read_conversation_file, to_conversation
from hipgraph.indexers.segmentation import depth_scores, gap_similarity, segment
from hipgraph.memory_eval import evaluate_memory, evidence_recall
from hipgraph.temporal import parse_time, resolve_range
from hipgraph.text.memory_units import session_key

LOCOMO = REPO / "data" / "locomo_conv30.json"  # one LoCoMo conversation, kept in the repo

COOKING = ["I tried a new pasta recipe last night with fresh basil and garlic.",
           "Nice! Did you make the pasta dough yourself?",
           "Yes, flour and eggs, then I rolled it thin and cut tagliatelle.",
           "How long did you boil the noodles?",
           "Only three minutes, fresh pasta cooks fast. The tomato sauce simmered for an hour.",
           "I should cook more Italian food, my sauces always burn."]
FOOTBALL = ["By the way, did you watch the football match on Sunday?",
            "Yes! Our team scored two goals in the second half.",
            "The goalkeeper saved a penalty in the final minute, unbelievable.",
            "The striker has scored in five league games in a row now.",
            "If they win the next match they lead the league table.",
            "I already bought tickets for the stadium next month."]


def _turns(texts, session, speakers=("Ana", "Ben")):
    return [{"id": f"S{session}:{i + 1}", "speaker": speakers[i % 2], "text": t} for i, t in enumerate(texts)]


def _conversation():
    """Ana moves from Lisbon (January) to Berlin (June); pasta and football in between."""
    return {"id": "ana-ben", "speakers": ["Ana", "Ben"], "sessions": [
        {"id": "1", "time": "10:00 am on 15 January, 2023", "turns": _turns(
            ["Hi Ben! I just moved into a flat in Lisbon, near the river.",
             "Lisbon is lovely. Do you like the new job at Acme Bank?",
             "Yes, Acme Bank gave me a desk with a view of the Tagus."], 1)},
        {"id": "2", "time": "8:30 pm on 20 May, 2023", "turns": _turns(COOKING + FOOTBALL, 2)},
        {"id": "3", "time": "6:00 pm on 10 June, 2023", "turns": _turns(
            ["Big news: I left Lisbon and moved to Berlin last week.",
             "Berlin! What about Acme Bank?",
             "I quit Acme Bank and joined Zeta Robotics in Berlin as an engineer."], 3)},
    ]}


# ------------------------------------------------------------------ segmentation
def test_two_topic_dialogue_is_cut_between_the_topics(embedder):
    lines = [f"{'Ana' if i % 2 == 0 else 'Ben'}: {t}" for i, t in enumerate(COOKING + FOOTBALL)]
    vectors = embedder.embed(lines)
    depth = depth_scores(gap_similarity(vectors, 2))
    assert int(np.argmax(depth)) == 5  # the gap between turn 6 (cooking) and turn 7 (football)
    units = segment(vectors, ConversationConfig())
    assert any(a == 6 for a, _ in units)  # a unit starts where football starts
    assert units[0][0] == 0 and units[-1][1] == 12 and all(a < b for a, b in units)
    assert all(b == c for (_, b), (c, _) in zip(units, units[1:], strict=False))
    assert not any(a < 6 < b for a, b in units), "no unit mixes the two topics"
    assert all(b - a >= ConversationConfig().min_turns for a, b in units)
    assert segment(vectors, ConversationConfig(granularity="turn")) == [(i, i + 1) for i in range(12)]
    assert segment(vectors, ConversationConfig(granularity="session")) == [(0, 12)]
    assert all(b - a <= 3 for a, b in segment(vectors, ConversationConfig(max_turns=3, min_turns=1)))


def test_depth_scores_follow_texttiling():
    sims = np.array([0.9, 0.8, 0.2, 0.7, 0.9, 0.85])
    depth = depth_scores(sims)
    assert depth[2] == pytest.approx((0.9 - 0.2) + (0.9 - 0.2))  # climbs to both peaks
    assert depth[0] == 0 and depth[4] == 0
    assert depth[5] == pytest.approx(0.05)


# ------------------------------------------------------------------ time
def test_parse_time_formats_and_errors():
    assert parse_time("1:56 pm on 8 May, 2023") == datetime(2023, 5, 8, 13, 56)
    assert parse_time("2023/05/20 (Sat) 02:21") == datetime(2023, 5, 20, 2, 21)
    assert parse_time("2023-05-08T10:00:00+02:00") == datetime(2023, 5, 8, 10, 0)
    assert parse_time("May 2023") == datetime(2023, 5, 1)
    with pytest.raises(InputError, match="sessions\\[2\\].time: cannot read 'next blue moon'"):
        parse_time("next blue moon", where="sessions[2].time")


@pytest.mark.parametrize(("question", "start", "end"), [
    ("What did Ana do yesterday?", "2023-08-19", "2023-08-20"),
    ("What happened last week?", "2023-08-07", "2023-08-14"),
    ("Where did she go last May?", "2023-05-01", "2023-06-01"),
    ("Where did she go last September?", "2022-09-01", "2022-10-01"),
    ("What did he buy in May 2023?", "2023-05-01", "2023-06-01"),
    ("What did she do in 2022?", "2022-01-01", "2023-01-01"),
    ("What did they do two weeks ago?", "2023-07-31", "2023-08-07"),
    ("What happened on 8 May 2023?", "2023-05-08", "2023-05-09"),
    ("What did he do on May 7, 2023?", "2023-05-07", "2023-05-08"),
    ("What has she painted since 2022?", "2022-01-01", "2023-08-21"),
    ("What did she do before June 2023?", "0001-01-01", "2023-06-01"),
    ("What did he do in the last 3 months?", "2023-05-20", "2023-08-21"),
    ("What did she do in July?", "2023-07-01", "2023-08-01"),
])
def test_relative_time_expressions_against_a_fixed_question_date(question, start, end):
    span = resolve_range(question, datetime(2023, 8, 20, 15, 0))
    assert (span.start.date().isoformat(), span.end.date().isoformat()) == (start, end)


def test_questions_without_a_fixed_time_resolve_to_nothing():
    date = datetime(2023, 8, 20)
    assert resolve_range("When did Melanie paint a sunrise?", date) is None
    assert resolve_range("What happened two weeks before the trip?", date) is None


# ------------------------------------------------------------------ memory
def test_conversation_memory_hits_time_and_as_of(make_index):
    hg = make_index("mem")
    report = hg.add_conversation(_conversation())
    assert report.added == 3 and report.passages >= 4
    keys = [k for (k,) in hg.store.con.execute("SELECT key FROM documents ORDER BY key").fetchall()]
    assert keys == [session_key("ana-ben", s) for s in ("1", "2", "3")]
    # turn hits (the default): the question's turn and its answer lead, each hit one turn
    turns = hg.retrieve("How long did the fresh pasta boil?", k=3)
    assert [h.turn_ids for h in turns[:2]] in ([("S2:4",), ("S2:5",)], [("S2:5",), ("S2:4",)])
    assert turns[0].text == "Ben: How long did you boil the noodles?" or turns[0].text.startswith("Ana: Only")
    assert all(len(h.turn_ids) == 1 and h.session == "2" and h.title == "20 May 2023" for h in turns[:2])
    assert [h.rank for h in turns] == [1, 2, 3] and turns[0].score >= turns[1].score >= turns[2].score
    assert turns[0].why["unit_rank"] == 1 and set(turns[0].why["turn_score"]) == {"cosine", "bm25", "unit_prior"}
    # unit hits: one memory unit with all its turns
    hits = hg.retrieve("How long did the fresh pasta boil?", k=2, config=RetrievalConfig(memory_hits="unit"))
    top = hits[0]
    assert top.conversation == "ana-ben" and top.session == "2" and "S2:5" in top.turn_ids
    assert top.time == "2023-05-20T20:30:00" and top.title == "20 May 2023"
    assert set(top.speakers) == {"Ana", "Ben"} and top.time_end == top.time
    assert set(top.turn_ids) <= {f"S2:{i}" for i in range(1, 13)}
    assert all(t.startswith("S2:") for t in top.turn_ids)
    assert top.to_dict()["turn_ids"] == list(top.turn_ids)
    # time expressions move the units of the asked-about time ahead
    asked = "Where did Ana live and work last January?"
    hits = hg.retrieve(asked, k=3, question_date="2023-08-01")
    assert hits[0].session == "1" and hits[0].why["time_match"] == "last January"
    # as_of: memory as it stood in February has no later session
    past = hg.retrieve("Where does Ana work?", k=5, as_of="2023-02-01")
    assert past and {h.session for h in past} == {"1"}
    now = hg.retrieve("Where does Ana work?", k=5)
    assert "3" in {h.session for h in now}
    # re-adding is a no-op; a changed session is replaced
    again = hg.add_conversation(_conversation())
    assert again.unchanged == 3 and again.added == 0
    changed = _conversation()
    changed["sessions"][0]["turns"][0]["text"] = "Hi Ben! I just moved into a flat in Porto."
    assert hg.add_conversation(changed).replaced == 1
    check_consistency(hg)


def test_deleting_a_session_removes_only_what_it_produced(make_index):
    hg = make_index("mem")
    hg.add_conversation(_conversation())

    def facts_of(session: str) -> set[int]:
        return {int(f) for (f,) in hg.store.con.execute("""
            SELECT DISTINCT fs.fact_id FROM fact_sources fs JOIN passages p ON p.id = fs.passage_id
            JOIN documents d ON d.id = p.doc_id WHERE d.key = ?""", [session_key("ana-ben", session)]).fetchall()}

    third, others = facts_of("3"), facts_of("1") | facts_of("2")
    assert third - others, "session 3 states facts no other session does"
    report = hg.delete_conversation("ana-ben", ["3"])
    assert report.deleted == 1
    remaining = {int(f) for (f,) in hg.store.con.execute("SELECT id FROM facts").fetchall()}
    assert not (third - others) & remaining and others <= remaining
    assert all(h.session != "3" for h in hg.retrieve("Zeta Robotics in Berlin", k=5))
    check_consistency(hg)
    assert hg.delete_conversation("ana-ben").deleted == 2 and hg.stats()["documents"] == 0


def test_malformed_conversations_name_the_record(tmp_path):
    good = _conversation()
    cases = [
        ({**good, "sessions": []}, "field 'sessions' must be a non-empty list"),
        ({**good, "sessions": [{"id": "1", "turns": [{"speaker": "Ana"}]}]},
         r"sessions\[0\].turns\[0\]: field 'text' must be a non-empty string"),
        ({**good, "sessions": [{"id": "1", "time": "someday", "turns": _turns(["hi"], 1)}]},
         r"sessions\[0\].time: cannot read 'someday'"),
        ({**good, "sessions": [{"id": "1", "turns": _turns(["hi"], 1)}, {"id": "1", "turns": _turns(["yo"], 2)}]},
         "session id '1' appears twice"),
        ({**good, "id": "a#b"}, "must not contain '#'"),
    ]
    for record, message in cases:
        with pytest.raises(InputError, match=message):
            to_conversation(record)
    bad = tmp_path / "bad_locomo.json"
    bad.write_text(json.dumps({"conversations": [{"id": "c1", "turns": [
        {"dia_id": "D1:1", "session": 1, "session_date_time": "1:56 pm on 8 May, 2023", "speaker": "A", "text": "hi"},
        {"session": 1, "session_date_time": "1:56 pm on 8 May, 2023", "speaker": "B", "text": "yo"}]}]}))
    with pytest.raises(InputError, match=r"bad_locomo.json: conversations\[0\].turns\[1\]: field 'dia_id'"):
        read_conversation_file(bad, "locomo")
    lme = tmp_path / "lme.json"
    lme.write_text(json.dumps([{"question_id": "q1", "question": "?", "haystack_sessions": [[]],
                                "haystack_session_ids": ["s1", "s2"], "haystack_dates": ["2023/05/20 (Sat) 02:21"]}]))
    with pytest.raises(InputError, match=r"lme.json: \[0\]: 'haystack_sessions'.*same length"):
        read_conversation_file(lme, "longmemeval")
    proc = run_cli("index", "--db", str(tmp_path / "ix"), "--format", "locomo", str(bad))
    assert proc.returncode == 2 and "turns[1]: field 'dia_id'" in proc.stderr
    assert not (tmp_path / "ix").exists() and proc.stdout == ""  # nothing written, no report


def test_locomo_session_times_are_read_from_every_turn_and_a_bad_one_is_named(tmp_path):
    """A bad session time is an InputError naming the file, the field where it is, the conversation
    and the session, whichever turn or session carries it (not only a session's first turn)."""
    raw = json.loads(LOCOMO.read_text(encoding="utf-8"))
    turns = raw["conversations"][0]["turns"]
    second = [j for j, t in enumerate(turns) if t["session"] == 2][1]  # not its session's first turn
    path = tmp_path / "locomo_bad_time.json"
    for value, message in [
        ("the day after", "cannot read 'the day after' as a date/time"),
        ("9:00 am on 1 January, 2020", r"'9:00 am on 1 January, 2020' differs from the session's "
                                       r"time '2:32 pm on 29 January, 2023' \(.*turns\[\d+\]\)"),
    ]:
        bad = json.loads(json.dumps(raw))
        bad["conversations"][0]["turns"][second]["session_date_time"] = value
        path.write_text(json.dumps(bad), encoding="utf-8")
        where = (rf"locomo_bad_time.json: conversations\[0\].turns\[{second}\].session_date_time "
                 rf"\(conversation 'conv-30', session 2\): ")
        with pytest.raises(InputError, match=where + message):
            read_conversation_file(path, "locomo")
    # a session whose first turn has no time takes it from the next turn that has one
    turn = {"speaker": "A", "text": "hi"}
    path.write_text(json.dumps({"conversations": [{"id": "c1", "turns": [
        {**turn, "dia_id": "D1:1", "session": 1},
        {**turn, "dia_id": "D1:2", "session": 1, "session_date_time": "1:56 pm on 8 May, 2023"}]}]}))
    (conv,), _ = read_conversation_file(path, "locomo")
    assert conv.sessions[0].time == datetime(2023, 5, 8, 13, 56)
    # LoCoMo as released: the second session's session_2_date_time, named as the file has it
    original = tmp_path / "locomo10.json"
    sessions = {"session_1": [{**turn, "dia_id": "D1:1"}], "session_1_date_time": "1:56 pm on 8 May, 2023",
                "session_2": [{**turn, "dia_id": "D2:1"}], "session_2_date_time": "someday"}
    original.write_text(json.dumps([{"sample_id": "conv-x", "conversation": sessions, "qa": []}]))
    with pytest.raises(InputError, match=r"locomo10.json: \[0\].conversation.session_2_date_time "
                                         r"\(conversation 'conv-x', session 2\): cannot read 'someday'"):
        read_conversation_file(original, "locomo")


def _longmemeval_file(tmp_path, question: str, question_date: str, second_date: str):
    """A one-instance LongMemEval file: a bike bought on 2 May (the evidence), tomatoes later."""
    lme = tmp_path / "lme.json"
    lme.write_text(json.dumps([{
        "question_id": "q1", "question_type": "temporal-reasoning", "question": question,
        "answer": "a bike", "question_date": question_date,
        "haystack_session_ids": ["s1", "s2"], "haystack_dates": ["2023/05/02 (Tue) 09:00", second_date],
        "haystack_sessions": [[{"role": "user", "content": "I bought a bike today.", "has_answer": True},
                               {"role": "assistant", "content": "Congratulations on the new bike!"}],
                              [{"role": "user", "content": "Any tips for growing tomatoes?"},
                               {"role": "assistant", "content": "Water them in the morning."}]],
        "answer_session_ids": ["s1"]}]))
    return lme


def test_longmemeval_and_original_locomo_formats(tmp_path):
    lme = _longmemeval_file(tmp_path, "When did I buy the bike?", "2023/06/01 (Thu) 10:00",
                            "2023/05/20 (Sat) 02:21")
    convs, qs = read_conversation_file(lme, "longmemeval")
    assert [s.id for s in convs[0].sessions] == ["s1", "s2"]
    assert convs[0].sessions[0].time == datetime(2023, 5, 2, 9, 0)
    assert qs[0]["evidence"] == ["s1:1"] and qs[0]["question_date"] == "2023-06-01T10:00:00"
    original = tmp_path / "locomo10.json"
    original.write_text(json.dumps([{"sample_id": "conv-x", "conversation": {
        "speaker_a": "Caroline", "speaker_b": "Melanie", "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [{"speaker": "Caroline", "dia_id": "D1:1", "text": "I went to a support group."},
                      {"speaker": "Melanie", "dia_id": "D1:2", "text": "Look!", "blip_caption": "a photo of a lake"}]},
        "qa": [{"question": "What did Caroline attend?", "answer": "a support group", "evidence": ["D1:1"],
                "category": 4}]}]))
    convs, qs = read_conversation_file(original, "locomo")
    assert convs[0].speakers == ("Caroline", "Melanie")
    assert convs[0].sessions[0].turns[1].text == "Look! [shares an image: a photo of a lake]"
    assert qs[0]["category"] == "single-hop" and qs[0]["question_date"] == "2023-05-08T13:56:00"


def test_locomo_reader_on_the_repo_sample():
    raw = json.loads(LOCOMO.read_text(encoding="utf-8"))
    (raw_conv,) = raw["conversations"]
    convs, qs = read_conversation_file(LOCOMO, "locomo")
    (conv,) = convs
    assert conv.id == "conv-30" and conv.speakers == ("Jon", "Gina")
    assert len(conv.sessions) == 19 and sum(len(s.turns) for s in conv.sessions) == 369 == len(raw_conv["turns"])
    # sessions and turns in file order, each turn with its id, speaker, text (+ the caption of an
    # image it shares) and session time
    read = [(s.id, s.time, t.id, t.speaker, t.text) for s in conv.sessions for t in s.turns]
    assert read == [(str(t["session"]), parse_time(t["session_date_time"]), t["dia_id"], t["speaker"],
                     t["text"] + (f" [shares an image: {t['blip_caption']}]" if "blip_caption" in t else ""))
                    for t in raw_conv["turns"]]
    assert sum("[shares an image: " in t.text for s in conv.sessions for t in s.turns) == 72
    first = conv.sessions[0]
    assert first.time == datetime(2023, 1, 20, 16, 4) and first.turns[2].id == "D1:3"
    # questions: LoCoMo's category numbers named, evidence turn ids kept, asked after the last session
    assert len(qs) == 105 == len(raw_conv["questions"])
    names = {1: "multi-hop", 2: "temporal", 4: "single-hop", 5: "adversarial"}
    assert [(q["question"], q["category"], q["evidence"]) for q in qs] == [
        (r["question"], names[r["category"]], r["evidence_dia_ids"]) for r in raw_conv["questions"]]
    assert conv.sessions[-1].time == datetime(2023, 7, 23, 18, 46)
    assert {q["question_date"] for q in qs} == {"2023-07-23T18:46:00"}


def test_evidence_recall_and_memory_eval(tmp_path, embedder):
    assert evidence_recall(["a", "b"], [["x"], ["a", "y"], ["b"]], 2) == 0.5
    assert evidence_recall(["a", "b"], [["x"], ["a", "y"], ["b"]], 3) == 1.0
    conv = to_conversation(_conversation())
    questions = [{"id": "q1", "question": "How long did the fresh pasta boil?", "evidence": ["S2:5"],
                  "category": "single-hop", "conversation": "ana-ben", "question_date": "2023-08-01"},
                 {"id": "q2", "question": "Which company did Ana join in Berlin?", "evidence": ["S3:3"],
                  "category": "temporal", "conversation": "ana-ben", "question_date": None}]
    from conftest import index_config

    import hipgraph

    def open_index(path, create):
        return hipgraph.open(path, create=create, embedder=embedder, config=index_config())

    results, seconds = evaluate_memory(tmp_path / "mem", [conv], questions, ["graph"], [1, 5],
                                       open_index=open_index)
    assert set(seconds) == {"ana-ben"}
    by_mode = {r.mode: r for r in results}
    assert set(by_mode) == {"graph", "turn-dense"}
    assert by_mode["graph"].recall[5] == 100.0
    assert by_mode["graph"].counts == {"single-hop": 1, "temporal": 1}
    # the baseline ranks single turns ("Speaker: text") by cosine: its recall@1 is the share of
    # questions whose evidence turn is the most similar one
    turns = [t for s in conv.sessions for t in s.turns]
    turn_vectors = embedder.embed([f"{t.speaker}: {t.text}" for t in turns])
    question_vectors = embedder.embed([q["question"] for q in questions])
    first = [turns[int(np.argmax(turn_vectors @ qv))].id for qv in question_vectors]
    expected = 100 * sum(f in q["evidence"] for f, q in zip(first, questions, strict=True)) / len(questions)
    assert by_mode["turn-dense"].recall[1] == expected == 50.0, first  # q1: "How long did you boil"
    results, seconds = evaluate_memory(tmp_path / "mem", [conv], questions, ["dense"], [5],
                                       open_index=open_index)
    assert seconds == {}  # the index is reused


def test_cli_conversation_index_query_and_eval(tmp_path):
    path = tmp_path / "conv.json"
    path.write_text(json.dumps(_conversation()))
    db = tmp_path / "ix"
    out = json.loads(run_cli("index", "--db", str(db), "--format", "conversation", str(path), "--json",
                             "--granularity", "session", check=True).stdout)
    assert out["conversations"] == 1 and out["report"]["added"] == 3
    assert out["report"]["passages"] == 3  # --granularity session: one memory unit per session
    text = run_cli("query", "--db", str(db), "How long did the fresh pasta boil?", "-k", "1",
                   "--question-date", "2023-08-01", check=True).stdout
    assert "turns S2:4 (session 2" in text and "Ben: How long did you boil the noodles?" in text
    text = run_cli("query", "--db", str(db), "How long did the fresh pasta boil?", "-k", "1",
                   "--question-date", "2023-08-01", "--memory-hits", "unit", check=True).stdout
    assert "turns " + ", ".join(f"S2:{i}" for i in range(1, 13)) + " (session 2" in text  # all of it
    hits = json.loads(run_cli("query", "--db", str(db), "Where does Ana work?", "--as-of", "2023-02-01",
                              "--json", check=True).stdout)["hits"]
    assert hits and all(h["session"] == "1" for h in hits)
    bad = run_cli("query", "--db", str(db), "x", "--as-of", "someday")
    assert bad.returncode == 2 and "as_of: cannot read 'someday'" in bad.stderr


def _moving():
    return {"id": "ana", "speakers": ["Ana", "Ben"], "sessions": [
        {"id": "1", "time": "2023-01-15 10:00", "turns": [
            {"speaker": "Ana", "text": "I live in Lisbon now."},
            {"speaker": "Ben", "text": "Lisbon is lovely, enjoy the sun!"}]},
        {"id": "2", "time": "2023-06-10 18:00", "turns": [
            {"speaker": "Ana", "text": "Big news: I live in Berlin now."},
            {"speaker": "Ben", "text": "Berlin! That is a big change."}]}]}


def test_contradicted_fact_is_invalidated_and_still_retrievable_as_of(make_index):
    hg = make_index("mem")
    hg.add_conversation(_moving())
    facts = {f.object: f for f in hg.facts("Ana") if f.relation == "live in"}
    lisbon, berlin = facts["lisbon"], facts["berlin"]  # first-person turns are about the speaker
    assert lisbon.subject == "ana" and lisbon.valid_at == datetime(2023, 1, 15, 10, 0)
    assert lisbon.invalid_at == datetime(2023, 6, 10, 18, 0) and lisbon.invalidated_by == berlin.id
    assert berlin.invalid_at is None and berlin.valid_at == datetime(2023, 6, 10, 18, 0)
    assert [f.object for f in hg.facts("ana", current_only=True) if f.relation == "live in"] == ["berlin"]
    # as it stood in February: Lisbon, still valid then; Berlin not yet stated
    then = {f.object: f for f in hg.facts("ana", as_of="2023-02-01") if f.relation == "live in"}
    assert set(then) == {"lisbon"} and then["lisbon"].invalid_at is None
    # now the current fact leads; as of February the old one does
    now = hg.retrieve("Where does Ana live?", k=2)
    assert now[0].session == "2"
    assert [f["object"] for f in now[0].why["seed_facts"]] == ["berlin"]  # the stale one seeds weaker
    past = hg.retrieve("Where does Ana live?", k=2, as_of="2023-02-01")
    assert {h.session for h in past} == {"1"} and "lisbon" in {f["object"] for f in past[0].why["seed_facts"]}
    assert past[0].text == "Ana: I live in Lisbon now."
    # turn hits: the turn stating the replaced fact is scored at stale_fact_weight, so the
    # current one leads; unit hits: the current fact's unit leads
    assert now[0].text == "Ana: Big news: I live in Berlin now."
    assert now[1].text == "Ana: I live in Lisbon now." and now[1].why["turn_score"]["stale_factor"] == 0.5
    units = hg.retrieve("Where does Ana live?", k=2, config=RetrievalConfig(memory_hits="unit"))
    assert [h.session for h in units] == ["2", "1"]
    # a question about the past does not demote the replaced fact
    before = hg.retrieve("Where did Ana live before moving?", k=2)
    assert "lisbon" in {f["object"] for f in before[0].why["seed_facts"]}
    assert before[0].text == "Ana: I live in Lisbon now." and "stale_factor" not in before[0].why["turn_score"]
    # nothing was deleted: forgetting the later session makes the old fact current again
    hg.delete_conversation("ana", ["2"])
    (only,) = [f for f in hg.facts("ana") if f.relation == "live in"]
    assert only.object == "lisbon" and only.invalid_at is None
    check_consistency(hg)


def test_speakers_are_entities_and_fact_keys_embed_the_facts(make_index, embedder):
    from conftest import index_config

    hg = make_index("keys", config=index_config(conversation=ConversationConfig(fact_keys=True)))
    hg.add_conversation(_moving())
    names = {n for (n,) in hg.store.con.execute("SELECT name FROM entities").fetchall()}
    assert {"ana", "ben"} <= names
    pid, title, text = hg.store.con.execute("""
        SELECT p.id, p.title, p.text FROM passages p JOIN documents d ON d.id = p.doc_id
        WHERE d.key = 'ana#1'""").fetchall()[0]
    facts = [f"{s} {r} {o}" for s, r, o in hg.store.con.execute("""
        SELECT s.name, f.relation, o.name FROM facts f JOIN fact_sources fs ON fs.fact_id = f.id
        JOIN entities s ON s.id = f.subject_id JOIN entities o ON o.id = f.object_id
        WHERE fs.passage_id = ? AND f.kind = 'triple'""", [pid]).fetchall()]
    assert "ana live in lisbon" in facts
    stored = hg.store.con.execute("SELECT vec FROM passage_vectors WHERE id = ?", [pid]).fetchall()[0][0]
    plain, keyed = embedder.embed([f"{title}\n{text}", f"{title}\n{text}\nFacts: " + "; ".join(facts)])
    assert float(np.dot(stored, keyed)) > 0.999 > float(np.dot(stored, plain))


def test_memory_eval_scores_answers_through_a_local_server(tmp_path, embedder):
    from conftest import index_config

    import hipgraph
    from hipgraph.config import ChatConfig, GeneratorConfig

    try:
        from tests.openai_server import ScriptedOpenAIServer
    except ImportError:
        from openai_server import ScriptedOpenAIServer

    conv = to_conversation(_conversation())
    questions = [
        {"id": "q1", "question": "How long did the fresh pasta boil?", "answer": "three minutes",
         "evidence": ["S2:5"], "category": "single-hop", "conversation": "ana-ben", "question_date": "2023-08-01"},
        {"id": "q2", "question": "What did Ana say about Mars?", "answer": "", "evidence": ["S2:1"],
         "category": "adversarial", "conversation": "ana-ben", "question_date": None}]

    def reply(body):
        user = body["messages"][-1]["content"]
        if "pasta" in user.rsplit("Question:", 1)[-1]:
            assert "20 May 2023" in user  # the unit's session date is in the context
            return json.dumps({"answer": "Only three minutes", "citations": [1], "sufficient": True})
        return json.dumps({"answer": "", "citations": [], "sufficient": False})

    def open_index(path, create):
        return hipgraph.open(path, create=create, embedder=embedder, config=index_config())

    with ScriptedOpenAIServer(chat_handler=reply) as srv:
        gen = GeneratorConfig(name="openai", chat=ChatConfig(base_url=srv.base_url, model="m", max_retries=0))
        results, _ = evaluate_memory(tmp_path / "mem", [conv], questions, ["graph"], [5],
                                     open_index=open_index, generator=gen)
    qa = {r.mode: r.qa for r in results}["graph"]
    assert qa["questions"] == 1 and qa["exact_match"] == 0.0 and qa["f1"] == pytest.approx(80.0)
    assert qa["adversarial_abstained"] == 100.0 and qa["abstention_rate"] == 0.0


def test_llm_places_segment_boundaries_and_failures_fall_back(make_index):
    from hipgraph.config import ChatConfig
    from hipgraph.indexers.segmentation import parse_boundaries

    try:
        from tests.openai_server import ScriptedOpenAIServer
    except ImportError:
        from openai_server import ScriptedOpenAIServer

    def reply(body):
        turns = body["messages"][-1]["content"]
        if "football" in turns:  # session 2: cooking, then football from turn 7
            assert "7. Ana: By the way, did you watch the football match on Sunday?" in turns
            return json.dumps({"boundaries": [7]})
        return "no idea"  # sessions 1 and 3: unusable replies

    hg = make_index("llmseg")
    with ScriptedOpenAIServer(chat_handler=reply) as srv:
        report = hg.add_conversation(_conversation(), llm=ChatConfig(base_url=srv.base_url, model="m",
                                                                        max_retries=0))
    spans = {k: json.loads(m)["units"] for k, m in hg.store.con.execute(
        "SELECT key, metadata FROM documents").fetchall()}
    meta = json.loads(hg.store.con.execute(
        "SELECT metadata FROM documents WHERE key = 'ana-ben#2'").fetchall()[0][0])
    starts = [t[2] for t in meta["turns"]]
    assert [s for s, _ in spans["ana-ben#2"]] == [starts[0], starts[6]]  # exactly the LLM's cut
    assert sum("LLM segmentation failed" in w for w in report.warnings) == 2
    assert spans["ana-ben#1"] and spans["ana-ben#3"]  # segmented from embeddings instead
    assert parse_boundaries('{"boundaries": [3, 2, 3]}', 5) == [1, 2]
    for bad in ('{"boundaries": [1]}', '{"boundaries": [9]}', '{"cuts": []}', '{"boundaries": ["2"]}'):
        with pytest.raises(ValueError):
            parse_boundaries(bad, 5)


def test_extractive_key_compression_drops_filler_lines():
    from hipgraph.indexers.conversations import compress_key

    text = ("Caroline: Wow, that sounds great!\nMelanie: I ran a charity race for mental health last "
            "Saturday.\nCaroline: Thanks so much!")
    assert compress_key(text) == "Melanie: I ran a charity race for mental health last Saturday."
    assert compress_key("Ana: Wow!\nBen: Thanks!") == "Ana: Wow!\nBen: Thanks!"  # never empty


def test_event_anchored_time_expressions_resolve_through_memory(make_index):
    from hipgraph.temporal import event_relative

    ev = event_relative("What did Ana buy two weeks before the trip?")
    assert (ev.event, ev.direction, ev.offset_days) == ("the trip", -1, 14)
    span = ev.resolve(datetime(2023, 6, 10))
    assert span.start == datetime(2023, 5, 20) and span.end == datetime(2023, 6, 3)
    assert event_relative("When did Melanie paint a sunrise?") is None
    hg = make_index("events")
    hg.add_conversation({"id": "trip", "speakers": ["Ana", "Ben"], "sessions": [
        {"id": "1", "time": "2023-03-01 10:00", "turns": [
            {"speaker": "Ana", "text": "I bought a new camera for my photos."},
            {"speaker": "Ben", "text": "Show me the pictures soon."}]},
        {"id": "2", "time": "2023-05-27 10:00", "turns": [
            {"speaker": "Ana", "text": "I bought hiking boots today."},
            {"speaker": "Ben", "text": "Good boots matter."}]},
        {"id": "3", "time": "2023-06-10 10:00", "turns": [
            {"speaker": "Ana", "text": "Tomorrow we finally leave for the trip to Japan!"},
            {"speaker": "Ben", "text": "Have a safe flight."}]}]})
    hits = hg.retrieve("What did Ana buy two weeks before the trip?", k=3, question_date="2023-08-01")
    assert hits[0].session == "2" and hits[0].why["time_match"] == "two weeks before the trip"



def test_cli_eval_on_a_longmemeval_file(tmp_path):
    lme = _longmemeval_file(tmp_path, "What did I buy last month?", "2023/06/10 (Sat) 10:00",
                            "2023/06/01 (Thu) 08:00")
    out = json.loads(run_cli("eval", "--db", str(tmp_path / "ev"), "--format", "longmemeval", str(lme),
                             "--modes", "graph", "--k", "1,2", "--json", check=True).stdout)
    assert out["questions"] == 1 and set(out["index_seconds"]) == {"q1"}
    graph = next(r for r in out["results"] if r["mode"] == "graph")
    assert graph["recall@1"] == 100.0  # "last month" (May) puts the bike session first
    assert graph["by_category"]["temporal-reasoning"]["questions"] == 1
