"""Entity surface forms and labels kept in step with their mentions batch by batch: the label
moves when later batches grow another label's count past it (no new row in ``surface_counts``,
only larger counts), stays when they grow its own, gains new surfaces, and moves back when
replaced documents take their mentions away."""

from __future__ import annotations

import pytest
from conftest import check_consistency, index_config

from hipgraph import registry
from hipgraph.config import ExtractorConfig
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
    return make_index(config=index_config(extractor=ExtractorConfig(name="scripted_test")))


def _entity(hg, name):
    (row,) = hg.store.con.execute("SELECT label, surface_forms FROM entities WHERE name = ?", [name]).fetchall()
    return row


def test_a_label_moves_with_grown_counts_and_forms_gain_new_surfaces(scripted_index):
    hg = scripted_index
    n = 0

    def add(*texts):
        nonlocal n
        hg.add_documents([{"id": f"d{n + i}", "title": "", "text": t} for i, t in enumerate(texts)])
        n += len(texts)
        check_consistency(hg, synonyms=False)  # labels and forms equal their mentions' aggregate
        return _entity(hg, "jordan")

    assert add("Jordan/PERSON", "Jordan/GPE Amman/GPE", "Jordan/GPE") == ("GPE", ["Jordan"])
    # only grown counts (no new surface_counts row), for a label other than the entity's
    assert add("Jordan/PERSON", "Jordan/PERSON") == ("PERSON", ["Jordan"])
    assert add("Jordan/PERSON Amman/GPE") == ("PERSON", ["Jordan"])  # its own label grows
    assert add("JORDAN/PERSON") == ("PERSON", ["JORDAN", "Jordan"])  # a new surface
    # replacing documents subtracts their counts: the label moves back
    hg.add_documents([{"id": f"d{i}", "title": "", "text": "Amman/GPE"} for i in (0, 3, 4)])
    check_consistency(hg, synonyms=False)
    assert _entity(hg, "jordan") == ("GPE", ["JORDAN", "Jordan"])
