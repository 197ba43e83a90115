"""The spaCy extractor on real sentences (real en_core_web_sm pipeline)."""

from __future__ import annotations

import pytest

from hipgraph.config import ExtractorConfig
from hipgraph.indexers.extract_spacy import COOCCURS, SpacyExtractor
from hipgraph.text.normalize import normalize_entity
from hipgraph.types import Chunk


@pytest.fixture(scope="module")
def extractor() -> SpacyExtractor:
    return SpacyExtractor()


def _extract(extractor, text: str, title: str = ""):
    [result] = extractor.extract([Chunk("d", 0, text, 0, len(text), title)])
    facts = {(normalize_entity(t.subject), t.relation, normalize_entity(t.object))
             for t in result.triples if t.relation != COOCCURS}
    cooc = {frozenset((normalize_entity(t.subject), normalize_entity(t.object)))
            for t in result.triples if t.relation == COOCCURS}
    return result, facts, cooc


def test_passive_and_participle_clauses(extractor):
    text = ("The Journal of Psychotherapy Integration is a peer-reviewed academic journal published by "
            "the American Psychological Association.")
    result, facts, _ = _extract(extractor, text, title="Journal of Psychotherapy Integration")
    assert ("journal of psychotherapy integration", "published by", "american psychological association") in facts
    names = {normalize_entity(e) for e in result.entities}
    assert {"journal of psychotherapy integration", "american psychological association"} <= names
    assert result.entity_labels["Journal of Psychotherapy Integration"] == "TITLE"


def test_copula_with_prepositional_object(extractor):
    _, facts, _ = _extract(extractor, "G. Stanley Hall was the first president of the American Psychological Association.")
    assert ("g. stanley hall", "was president of", "american psychological association") in facts


def test_active_verb_with_direct_object(extractor):
    _, facts, _ = _extract(extractor, "Marie Curie discovered polonium in Paris.")
    assert ("marie curie", "discovered", "polonium") in facts
    assert ("marie curie", "discovered in", "paris") in facts


def test_cooccurrence_only_between_named_entities_not_already_linked(extractor):
    text = "Barack Obama met Angela Merkel in Berlin."
    _, facts, cooc = _extract(extractor, text)
    assert ("barack obama", "met", "angela merkel") in facts
    assert frozenset(("barack obama", "angela merkel")) not in cooc  # linked by a triple already
    assert frozenset(("angela merkel", "berlin")) in cooc


def test_cooccurrence_can_be_disabled():
    ex = SpacyExtractor(ExtractorConfig(cooccurrence=False))
    _, _, cooc = _extract(ex, "Barack Obama met Angela Merkel in Berlin.")
    assert cooc == set()


def test_pronouns_and_bare_common_nouns_are_not_entities(extractor):
    result, _, _ = _extract(extractor, "It was a journal. He liked it very much.")
    names = {normalize_entity(e) for e in result.entities}
    assert "it" not in names and "he" not in names and "journal" not in names


def test_one_extraction_per_chunk_in_order(extractor):
    chunks = [Chunk(str(i), 0, text, 0, len(text)) for i, text in
              enumerate(["Paris is in France.", "", "Berlin is the capital of Germany."])]
    results = extractor.extract(chunks)
    assert len(results) == 3
    assert results[1].entities == () and results[1].triples == ()
    assert "Germany" in results[2].entities
