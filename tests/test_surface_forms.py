"""Entity surface forms and labels kept in step with their mentions batch by batch: a batch
refreshes only the entities whose forms or label its mentions may change (a new surface or
label, or a count grown for a label other than the entity's), and those are enough."""

from __future__ import annotations

import pytest
from conftest import check_consistency, index_config

from hipgraph import registry
from hipgraph.config import ExtractorConfig
from hipgraph.indexers import graph_update
from hipgraph.types import Extraction


class ScriptedExtractor:
    """Mentions exactly as a passage spells them, ``Surface/LABEL`` per word; no facts."""

    name = "scripted:test"

    def __init__(self, config=None):
        pass

    def extract(self, chunks):
        out = []
        for chunk in chunks:
            pairs = [word.split("/") for word in chunk.text.split()]
            out.append(Extraction(tuple(s for s, _ in pairs), (), {s: lb for s, lb in pairs}))
        return out


@pytest.fixture
def scripted_index(make_index):
    registry.register("extractor", "scripted_test", "test_surface_forms:ScriptedExtractor")
    config = index_config()
    return make_index(config=config.replace(extractor=ExtractorConfig(name="scripted_test")))


def _entity(hg, name):
    (row,) = hg.store.con.execute("SELECT label, surface_forms FROM entities WHERE name = ?", [name]).fetchall()
    return row


def test_a_label_moves_when_counts_grow_for_another_label_and_forms_gain_new_surfaces(scripted_index, monkeypatch):
    hg = scripted_index
    refreshed: list[set[int]] = []
    original = graph_update.refresh_surface_forms
    monkeypatch.setattr("hipgraph.indexers.pipeline.refresh_surface_forms",
                        lambda store, ids: refreshed.append(set(ids)) or original(store, ids))

    def add(*texts):
        start = add.n
        add.n += len(texts)
        hg.add_documents([{"id": f"d{start + i}", "title": "", "text": t} for i, t in enumerate(texts)])
        check_consistency(hg, synonyms=False)  # labels and forms equal their mentions' aggregate
        return refreshed[-1]

    add.n = 0
    first = add("Jordan/PERSON", "Jordan/GPE Amman/GPE", "Jordan/GPE")
    ((jordan,),) = hg.store.con.execute("SELECT id FROM entities WHERE name = 'jordan'").fetchall()
    assert jordan in first and _entity(hg, "jordan") == ("GPE", ["Jordan"])
    # only grown counts, for a label other than the entity's: refreshed, and the label moves
    assert jordan in add("Jordan/PERSON", "Jordan/PERSON")
    assert _entity(hg, "jordan") == ("PERSON", ["Jordan"])
    # grown counts for its own label only: nothing can change, so it is not refreshed
    assert jordan not in add("Jordan/PERSON Amman/GPE")
    assert _entity(hg, "jordan") == ("PERSON", ["Jordan"])
    # a new surface is a new row: refreshed, the forms gain it
    assert jordan in add("JORDAN/PERSON")
    assert _entity(hg, "jordan") == ("PERSON", ["JORDAN", "Jordan"])
    # replacing documents subtracts counts: the label moves back (refreshed from provenance)
    hg.add_documents([{"id": f"d{i}", "title": "", "text": "Amman/GPE"} for i in (0, 3, 4)])
    check_consistency(hg, synonyms=False)
    assert _entity(hg, "jordan") == ("GPE", ["JORDAN", "Jordan"])
