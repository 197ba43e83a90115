"""hipgraph.query.validity: when conversation facts held, as a view over the stored facts.

``FactTime`` and ``fact_weights`` are pure; ``fact_times`` reads a real DuckDB index whose facts,
fact_sources and entities rows are written here with SQL, so each case states exactly which
conversation unit (and so which time) stated which fact.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta

import numpy as np
import pytest

from hipgraph.query.validity import FactTime, fact_times, fact_weights
from hipgraph.store.database import GraphStore

T1 = datetime(2023, 1, 15, 10, 0)
T2 = datetime(2023, 6, 10, 18, 0)
T3 = datetime(2023, 9, 2, 9, 30)
SECOND = timedelta(seconds=1)


# ------------------------------------------------------------------ FactTime
REPLACED = FactTime(7, T1, T2, 9)  # stated at T1, replaced at T2 by fact 9
CURRENT = FactTime(9, T2)
TIMELESS = FactTime(3, None)  # a fact without a stated time


def test_fact_times_are_immutable_values():
    # as_of hands out the cached object itself: nobody may change it in place
    with pytest.raises(dataclasses.FrozenInstanceError):
        REPLACED.invalid_at = None  # type: ignore[misc]
    assert {FactTime(7, T1, T2, 9), REPLACED} == {REPLACED}  # hashable, equal by value


def test_as_of_now_is_the_fact_itself():
    assert REPLACED.as_of(None) is REPLACED and CURRENT.as_of(None) is CURRENT


def test_as_of_before_the_fact_was_stated_is_nothing():
    assert REPLACED.as_of(T1 - SECOND) is None
    assert CURRENT.as_of(T1) is None and CURRENT.as_of(T2 - SECOND) is None


def test_as_of_from_the_moment_it_was_stated():
    assert CURRENT.as_of(T2) is CURRENT  # stated at that very time: known
    assert TIMELESS.as_of(T1) is TIMELESS


def test_as_of_before_the_replacement_drops_the_invalidation():
    for when in (T1, T1 + SECOND, T2 - SECOND):
        assert REPLACED.as_of(when) == FactTime(7, T1, None, None)


def test_as_of_from_the_replacement_on_keeps_it():
    assert REPLACED.as_of(T2) is REPLACED and REPLACED.as_of(T3) is REPLACED


@pytest.mark.parametrize(("fact", "when", "held"), [
    (REPLACED, None, False), (CURRENT, None, True), (TIMELESS, None, True),
    (REPLACED, T1 - SECOND, False),  # not stated yet
    (REPLACED, T1, True),  # from the moment it was stated
    (REPLACED, T2 - SECOND, True),
    (REPLACED, T2, False),  # replaced at that very time
    (REPLACED, T3, False),
    (CURRENT, T1, False), (CURRENT, T2, True), (CURRENT, T3, True),
    (TIMELESS, T1, True),
    (FactTime(5, None, T2, 9), T2 - SECOND, True), (FactTime(5, None, T2, 9), T2, False),
])
def test_valid_at_a_time(fact, when, held):
    assert fact.valid(when) is held


# ------------------------------------------------------------------ fact_weights
TIMES = {7: REPLACED, 9: CURRENT, 3: TIMELESS}
IDS = np.array([7, 9, 3, 42], dtype=np.int64)  # 42: a fact from a plain document (no entry)


@pytest.mark.parametrize(("when", "past", "weights"), [
    (None, False, [0.25, 1, 1, 1]),  # now: the replaced fact weighs stale_weight
    (None, True, [1, 1, 1, 1]),  # a question about the past: no demotion
    (T1 - SECOND, False, [0, 0, 1, 1]),  # as of before anything was stated
    (T1 - SECOND, True, [0, 0, 1, 1]),  # not yet stated stays 0 for the past too
    (T1, False, [1, 0, 1, 1]),
    (T2 - SECOND, False, [1, 0, 1, 1]),
    (T2, False, [0.25, 1, 1, 1]),  # the replacement is stated: the old fact is stale
    (T2, True, [1, 1, 1, 1]),
])
def test_fact_weights(when, past, weights):
    got = fact_weights(TIMES, IDS, when, past, 0.25)
    assert got.dtype == np.float64 and got.tolist() == weights


def test_fact_weights_of_no_candidates():
    assert fact_weights(TIMES, np.array([], dtype=np.int64), None, False, 0.5).shape == (0,)


# ------------------------------------------------------------------ fact_times over a real index
ENTITIES = {  # name -> NER label (None: a noun chunk)
    "ana": "PERSON", "ben": "PERSON", "carl": "PERSON", "lisbon": "GPE", "berlin": "GPE",
    "paris": "GPE", "acme": "ORG", "dance routines": None, "pottery": None, "30": "CARDINAL",
    "31": "CARDINAL",
}
ENTITY_ID = {name: 100 + i for i, name in enumerate(ENTITIES)}
# conversation units (passage id -> the unit's start time); passage 200 is a plain document
UNITS = {1: T1, 2: T2, 3: T3, 4: T2}
PLAIN = 200


@pytest.fixture(scope="module")
def index_with_entities(tmp_path_factory):
    store = GraphStore.open(tmp_path_factory.mktemp("validity") / "index", create=True,
                            new_schema=lambda: (4, {}))
    with store.transaction() as con:
        for name, label in ENTITIES.items():
            con.execute("INSERT INTO entities (id, name, label, surface_forms) VALUES (?, ?, ?, ?)",
                        [ENTITY_ID[name], name, label, [name]])
    yield store
    store.close()


@pytest.fixture
def store(index_with_entities):
    """The index with its entities and no facts (each test states its own)."""
    with index_with_entities.transaction() as con:
        con.execute("DELETE FROM fact_sources")
        con.execute("DELETE FROM facts")
    return index_with_entities


def add_fact(store: GraphStore, fid: int, subject: str, relation: str, obj: str,
             passages: list[int], kind: str = "triple") -> None:
    """Fact ``fid`` stated in ``passages`` (in this order)."""
    with store.transaction() as con:
        con.execute("INSERT INTO facts VALUES (?, ?, ?, ?, ?)",
                    [fid, ENTITY_ID[subject], relation, ENTITY_ID[obj], kind])
        for pid in passages:
            con.execute("INSERT INTO fact_sources VALUES (?, ?, 'spacy')", [fid, pid])


def test_without_conversation_units_there_are_no_times(store):
    add_fact(store, 10, "ana", "live in", "lisbon", [1])
    assert fact_times(store, {}) == {}


@pytest.mark.parametrize(("relation", "first", "later"), [
    ("live in", "lisbon", "berlin"),  # a place for a place
    ("marry", "ben", "carl"),  # a person for a person
])
def test_a_later_named_object_of_the_same_type_replaces_the_earlier(store, relation, first, later):
    add_fact(store, 10, "ana", relation, first, [1])
    add_fact(store, 11, "ana", relation, later, [2])
    assert fact_times(store, UNITS) == {10: FactTime(10, T1, T2, 11), 11: FactTime(11, T2)}


def test_a_chain_of_replacements_links_each_fact_to_the_next(store):
    # ids deliberately not in time order: the chain follows the times
    add_fact(store, 10, "ana", "live in", "paris", [3])
    add_fact(store, 11, "ana", "live in", "lisbon", [1])
    add_fact(store, 12, "ana", "live in", "berlin", [2])
    assert fact_times(store, UNITS) == {
        11: FactTime(11, T1, T2, 12), 12: FactTime(12, T2, T3, 10), 10: FactTime(10, T3)}


@pytest.mark.parametrize(("relation", "first", "later"), [
    ("work at", "acme", "lisbon"),  # an organization, then a place: not the same type
    ("practice", "dance routines", "pottery"),  # noun chunks, not named things
    ("turn", "30", "31"),  # numbers are mentioned in passing
])
def test_objects_of_another_type_or_unnamed_never_replace(store, relation, first, later):
    add_fact(store, 10, "ana", relation, first, [1])
    add_fact(store, 11, "ana", relation, later, [2])
    assert fact_times(store, UNITS) == {10: FactTime(10, T1), 11: FactTime(11, T2)}


def test_another_subject_or_relation_never_replaces(store):
    add_fact(store, 10, "ana", "live in", "lisbon", [1])
    add_fact(store, 11, "ben", "live in", "berlin", [2])
    add_fact(store, 12, "ana", "move to", "paris", [3])
    assert fact_times(store, UNITS) == {10: FactTime(10, T1), 11: FactTime(11, T2),
                                        12: FactTime(12, T3)}


@pytest.mark.parametrize("relation", ["visited", "likes", "has", "went to"])
def test_multi_valued_relations_never_replace(store, relation):
    add_fact(store, 10, "ana", relation, "lisbon", [1])
    add_fact(store, 11, "ana", relation, "berlin", [2])
    add_fact(store, 12, "ana", relation, "paris", [3])
    assert fact_times(store, UNITS) == {10: FactTime(10, T1), 11: FactTime(11, T2),
                                        12: FactTime(12, T3)}


def test_the_earliest_stating_unit_gives_valid_at(store):
    add_fact(store, 10, "ana", "live in", "lisbon", [2, PLAIN, 1])  # T2 first, then T1
    add_fact(store, 11, "ana", "live in", "berlin", [3])
    assert fact_times(store, UNITS) == {10: FactTime(10, T1, T3, 11), 11: FactTime(11, T3)}


def test_restating_a_replaced_fact_does_not_make_it_current_again(store):
    # lisbon (T1), berlin (T2), lisbon again (T3): the lisbon fact is valid from its earliest
    # statement, so it stays replaced by berlin, and nothing replaces berlin
    add_fact(store, 10, "ana", "live in", "lisbon", [1, 3])
    add_fact(store, 11, "ana", "live in", "berlin", [2])
    assert fact_times(store, UNITS) == {10: FactTime(10, T1, T2, 11), 11: FactTime(11, T2)}


@pytest.mark.parametrize(("lisbon_units", "berlin_units"), [([1], [1]), ([2], [4])])
def test_facts_stated_at_the_same_time_do_not_replace_each_other(store, lisbon_units, berlin_units):
    add_fact(store, 10, "ana", "live in", "lisbon", lisbon_units)
    add_fact(store, 11, "ana", "live in", "berlin", berlin_units)
    t = UNITS[lisbon_units[0]]
    assert fact_times(store, UNITS) == {10: FactTime(10, t), 11: FactTime(11, t)}


def test_a_tie_after_a_replaced_fact_links_it_to_the_lowest_id(store):
    add_fact(store, 10, "ana", "live in", "lisbon", [1])
    add_fact(store, 12, "ana", "live in", "berlin", [2])
    add_fact(store, 11, "ana", "live in", "paris", [4])  # also T2
    assert fact_times(store, UNITS) == {
        10: FactTime(10, T1, T2, 11), 11: FactTime(11, T2), 12: FactTime(12, T2)}


def test_only_triples_stated_in_conversation_units_get_times(store):
    add_fact(store, 10, "ana", "live in", "lisbon", [1])
    add_fact(store, 11, "ana", "live in", "berlin", [PLAIN])  # a plain document: no time
    add_fact(store, 12, "ana", "co-occurs with", "paris", [1], kind="cooccurrence")
    add_fact(store, 13, "ana", "co-occurs with", "berlin", [2], kind="cooccurrence")
    assert fact_times(store, UNITS) == {10: FactTime(10, T1)}


def test_fact_times_drive_the_weights_of_an_as_of_question(store):
    add_fact(store, 10, "ana", "live in", "lisbon", [1])
    add_fact(store, 11, "ana", "live in", "berlin", [2])
    times = fact_times(store, UNITS)
    ids = np.array([10, 11])
    assert fact_weights(times, ids, T2 - SECOND, False, 0.5).tolist() == [1.0, 0.0]
    assert fact_weights(times, ids, None, False, 0.5).tolist() == [0.5, 1.0]
