"""Pure helpers: normalization, chunking, config validation, registry, precomputed import."""

from __future__ import annotations

import json

import pytest

from hipgraph import registry
from hipgraph.config import ChunkConfig, EmbedderConfig, ExtractorConfig, IndexConfig
from hipgraph.errors import BackendUnavailableError, ConfigError, InputError
from hipgraph.indexers.chunking import chunk_document
from hipgraph.indexers.extract_precomputed import PrecomputedExtractor, load_extractions
from hipgraph.text.normalize import normalize_entity, normalize_relation
from hipgraph.types import Chunk, Document


@pytest.mark.parametrize(("raw", "expected"), [
    ("The Beatles", "beatles"),
    ("  the   American Institute of Physics ", "american institute of physics"),
    ("Men\u2019s Studies Press", "men's studies press"),
    ("Einstein's", "einstein"),
    ("\u201cCasablanca\u201d", "casablanca"),
    ("A Tale of Two Cities", "tale of two cities"),
    ("U.S.", "u.s"),
    ("...", ""),
])
def test_normalize_entity(raw, expected):
    assert normalize_entity(raw) == expected


def test_normalize_relation():
    assert normalize_relation("  Published   BY ") == "published by"


def test_short_document_is_one_chunk():
    doc = Document("d", "  One sentence only.  ", "T")
    [chunk] = chunk_document(doc, ChunkConfig())
    assert chunk.text == "One sentence only." and doc.text[chunk.start:chunk.end] == chunk.text
    assert chunk.title == "T"


def test_long_document_chunks_overlap_and_offsets():
    sentences = [f"Sentence number {i} talks about topic {i % 7}." for i in range(60)]
    doc = Document("d", " ".join(sentences))
    cfg = ChunkConfig(max_tokens=40, overlap=8)
    chunks = chunk_document(doc, cfg)
    assert len(chunks) > 5
    for i, chunk in enumerate(chunks):
        assert chunk.ordinal == i
        assert doc.text[chunk.start:chunk.end] == chunk.text
        assert len(chunk.text.split()) <= 40
    assert chunks[0].start == 0 and chunks[-1].end == len(doc.text)
    for prev, nxt in zip(chunks, chunks[1:], strict=False):
        assert nxt.start < prev.end  # overlap
        assert nxt.start > prev.start
    assert chunks[0].text.endswith(".")  # cut at a sentence end


@pytest.mark.parametrize(("factory", "message"), [
    (lambda: ChunkConfig(max_tokens=4), "chunk.max_tokens"),
    (lambda: ChunkConfig(max_tokens=50, overlap=50), "chunk.overlap"),
    (lambda: EmbedderConfig(precision="fp8"), "embedder.precision"),
    (lambda: EmbedderConfig(name="openai"), "embedder.base_url"),
    (lambda: ExtractorConfig(name="no such-extractor"), "extractor.name"),
    (lambda: ExtractorConfig(name="llm"), "extractor.chat"),
])
def test_config_validation_names_the_field(factory, message):
    with pytest.raises(ConfigError, match=message):
        factory()


def test_config_round_trip_and_unknown_fields():
    cfg = IndexConfig(chunk=ChunkConfig(max_tokens=99, overlap=9), batch_size=7)
    assert IndexConfig.from_dict(json.loads(cfg.to_json())) == cfg
    with pytest.raises(ConfigError, match=r"config\.chunk: unknown field"):
        IndexConfig.from_dict({"chunk": {"size": 3}})


def test_registry_unknown_backend_lists_available():
    with pytest.raises(BackendUnavailableError, match="available: .*minilm"):
        registry.resolve("embedder", "word2vec")


def test_registry_missing_module_gives_install_hint():
    registry.register("embedder", "_test_missing", "nowhere:Thing", requires=("no_such_module_xyz",),
                      hint="pip install no-such-module")
    with pytest.raises(BackendUnavailableError, match="pip install no-such-module"):
        registry.resolve("embedder", "_test_missing")


def test_precomputed_extractions(tmp_path):
    path = tmp_path / "openie.json"
    path.write_text(json.dumps({"extractions": [
        {"idx": 0, "entities": ["Paris", "France"], "triples": [["Paris", "capital of", "France"], ["bad"]]},
        {"idx": 1, "entities": ["Berlin"], "triples": []},
    ]}))
    data = load_extractions(path)
    assert [t.relation for t in data["0"].triples] == ["capital of"]  # malformed triple dropped
    ex = PrecomputedExtractor(ExtractorConfig(name="precomputed", precomputed_path=str(path)))
    chunks = [Chunk("0", 0, "Paris is the capital.", 0, 21), Chunk("0", 1, "France is big.", 22, 36),
              Chunk("7", 0, "No extraction here.", 0, 19)]
    a, b, c = ex.extract(chunks)
    assert "Paris" in a.entities and "France" in b.entities and "Paris" not in b.entities
    assert a.triples and not b.triples  # the triple goes where its subject is mentioned
    assert c.entities == () and ex.missing == 1


def test_precomputed_malformed_file_names_file_and_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"extractions": [\n{"idx": 0,}\n]}')
    with pytest.raises(InputError, match=r"bad\.json:2"):
        load_extractions(path)
