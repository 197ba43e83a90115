"""A write made while reads are coming builds the next generation's read view inside its
transaction and publishes it with the commit: the view equals one built lazily after the commit,
the write is seen by the next read, bulk writes without reads stay lazy, and a warm-up that fails
never fails the write."""

from __future__ import annotations

import logging

import numpy as np
from conftest import MULTIHOP_QUESTION

from hipgraph.query import snapshot as snapshot_module
from hipgraph.query import view as view_module
from hipgraph.query.view import ReadView
from hipgraph.store import reads

NEW_DOC = {"id": "zorblax", "title": "Zorblax Institute",
           "text": "The Zorblax Institute was founded by Mira Quell in 1931 in Tallinn."}
NEW_QUESTION = "Who founded the Zorblax Institute?"
ARRAYS = ("passage_ids", "entity_ids", "indptr", "indices", "weights", "entity_passage_indptr",
          "entity_passage_indices", "fact_ids", "fact_subject", "fact_object")


def lazily_built(hg, generation: int) -> ReadView:
    """A view of ``generation`` built from the committed rows, as a reader would build it."""
    with hg.store.lock.shared():
        fresh = ReadView(hg.store, hg.vectors, generation)
        fresh.snapshot()
        fresh.entity_names()
    return fresh


WARM_UP = {"id": "warm", "title": "Warm", "text": "The first write loads the extractor."}


def test_a_write_during_reads_publishes_the_next_view_built(inline_index):
    hg = inline_index
    hg.add_documents([WARM_UP])  # the extractor loads (seconds): the reads below are recent
    assert hg.retrieve(MULTIHOP_QUESTION, k=3)
    views = hg.retriever.views
    old = views._view
    built_before = set(old._parts)
    assert {"snapshot", "names", "fingerprint"} <= built_before

    hg.add_documents([NEW_DOC])
    nxt = views._view
    assert nxt is not old and nxt.generation == hg.store.generation > old.generation
    warmed = {k if not isinstance(k, tuple) else k[0] for k in built_before} & set(view_module._WARMED_PARTS)
    assert warmed <= {k if not isinstance(k, tuple) else k[0] for k in nxt._parts}

    fresh = lazily_built(hg, nxt.generation)
    for name in ARRAYS:  # built inside the transaction = built from the committed rows
        assert np.array_equal(getattr(nxt.snapshot(), name), getattr(fresh.snapshot(), name)), name
    for table in ("by_id", "by_name", "label_by_id"):
        assert getattr(nxt.entity_names(), table) == getattr(fresh.entity_names(), table), table
    assert not nxt.persist and "fingerprint" not in nxt._parts  # built in memory, not stamped
    assert nxt.snapshot().passage_ids.size == old.snapshot().passage_ids.size + 1

    hits = hg.retrieve(NEW_QUESTION, k=1)
    assert hits[0].doc_id == "zorblax"
    assert views._view is nxt  # the read used the published view, it built none


def test_writes_without_recent_reads_leave_views_lazy(inline_index, monkeypatch):
    hg = inline_index
    hg.retrieve(MULTIHOP_QUESTION, k=3)
    old = hg.retriever.views._view
    monkeypatch.setattr(view_module, "WARM_AFTER_READ_S", -1.0)  # the last read is "too long ago"
    hg.add_documents([NEW_DOC])
    assert hg.retriever.views._view is old  # nothing built for the new generation
    assert hg.retrieve(NEW_QUESTION, k=1)[0].doc_id == "zorblax"
    assert hg.retriever.views._view.generation == hg.store.generation


def test_a_failing_warm_up_never_fails_the_write(inline_index, monkeypatch, caplog):
    hg = inline_index
    hg.retrieve(MULTIHOP_QUESTION, k=3)
    old = hg.retriever.views._view

    def broken(_view):
        raise RuntimeError("snapshot builder broke")

    monkeypatch.setitem(view_module._WARMED_PARTS, "snapshot", broken)
    with caplog.at_level(logging.WARNING, logger="hipgraph.store.database"):
        report = hg.add_documents([NEW_DOC])
    assert report.added == 1
    assert any("snapshot builder broke" in r.getMessage() for r in caplog.records)
    assert hg.retriever.views._view is old
    assert hg.retrieve(NEW_QUESTION, k=1)[0].doc_id == "zorblax"  # readers build it instead


def test_memory_parts_are_warmed_too(make_index):
    hg = make_index("mem")
    hg.add_documents([WARM_UP])
    conv = {"id": "c1", "speakers": ["Ana", "Ben"], "sessions": [
        {"id": "1", "time": "2024-01-05 10:00", "turns": [
            {"speaker": "Ana", "text": "I adopted a cat named Pixel last week."},
            {"speaker": "Ben", "text": "Lovely, what colour is Pixel?"},
            {"speaker": "Ana", "text": "Pixel is grey with white paws."}]}]}
    hg.add_conversation(conv)
    assert hg.retrieve("What is the name of Ana's cat?", k=2)
    conv["sessions"].append({"id": "2", "time": "2024-02-01 09:00", "turns": [
        {"speaker": "Ben", "text": "How is your garden doing?"},
        {"speaker": "Ana", "text": "I planted tomatoes and basil by the fence."}]})
    hg.add_conversation(conv)
    nxt = hg.retriever.views._view
    assert nxt.generation == hg.store.generation
    assert {"units", "turns", "fact_times"} <= set(nxt._parts)
    units, _ = nxt.memory_units()
    assert len(units) == len(lazily_units(hg, nxt.generation))
    with hg.store.lock.shared():
        assert nxt.fact_times() == ReadView(hg.store, hg.vectors, nxt.generation).fact_times()
    assert nxt.fact_times()  # the sessions' facts have times
    hits = hg.retrieve("What did Ana plant by the fence?", k=1)
    assert "tomatoes" in hits[0].text


def test_closing_saves_the_snapshot_a_write_built_in_memory(inline_index, tmp_path):
    hg = inline_index
    hg.add_documents([WARM_UP])
    assert hg.retrieve(MULTIHOP_QUESTION, k=3)
    hg.add_documents([NEW_DOC])
    nxt = hg.retriever.views._view
    folder = snapshot_module.cache_dir(hg.path)
    with hg.store.lock.shared():
        fingerprint = reads.content_fingerprint(hg.store)
    assert not nxt.persist
    assert snapshot_module.load_snapshot(folder, nxt.generation, fingerprint) is None  # not on disk yet
    built = nxt.snapshot()
    hg.close()
    saved = snapshot_module.load_snapshot(folder, nxt.generation, fingerprint)
    assert saved is not None  # the next open loads it instead of rebuilding it
    for name in ARRAYS:
        assert np.array_equal(getattr(saved, name), getattr(built, name)), name


def lazily_units(hg, generation: int):
    with hg.store.lock.shared():
        return ReadView(hg.store, hg.vectors, generation).memory_units()[0]
