"""The per-document work of indexing, as pure functions of a batch of documents.

Chunking, extraction (normalized into mention and fact rows) and embedding depend on nothing but
the documents, the index config and the models, so any executor may run them anywhere: in a
thread, in worker processes, or as Ray tasks and actors. The global steps (entity and fact ids,
synonym edges, the write) stay with the index (:mod:`hipgraph.indexers.pipeline`).

A batch's results travel between processes as one Arrow row (:func:`to_arrow` /
:func:`from_arrow`): lists of passages, mentions and facts, and raw float32 vector bytes.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from hipgraph.config import IndexConfig
from hipgraph.errors import InputError
from hipgraph.indexers.chunking import chunk_document
from hipgraph.indexers.conversations import compress_key, resolve_speakers
from hipgraph.indexers.extract_base import Extractor
from hipgraph.indexers.extract_spacy import COOCCURS
from hipgraph.models.base import Embedder
from hipgraph.text.facts import fact_text
from hipgraph.text.memory_units import SESSION_KIND, unit_turns
from hipgraph.text.normalize import clean_surface, normalize_entity, normalize_relation
from hipgraph.types import Chunk, Document, Extraction

Mention = tuple[int, str, str, str | None]  # chunk, entity name, surface form, label
FactRow = tuple[int, str, str, str, str]  # chunk, subject, relation, object, kind


def passage_embedding_text(chunk: Chunk, prepend_title: bool) -> str:
    return f"{chunk.title}\n{chunk.text}" if prepend_title and chunk.title else chunk.text


@dataclass
class BatchWork:
    """What the per-document stages made of one batch of documents."""

    chunks: list[Chunk] = field(default_factory=list)
    chunk_doc: list[int] = field(default_factory=list)  # index into the batch's documents
    mentions: list[Mention] = field(default_factory=list)
    facts: list[FactRow] = field(default_factory=list)
    key_texts: list[str] = field(default_factory=list)  # what each passage is embedded as
    passage_vectors: np.ndarray | None = None
    names: list[str] = field(default_factory=list)  # distinct entity names, sorted
    name_vectors: np.ndarray | None = None
    fact_texts: list[str] = field(default_factory=list)  # distinct texts of 'triple' facts, sorted
    fact_vectors: np.ndarray | None = None
    # conversation memory: each turn of each unit, as (chunk, position in the session's turns)
    turn_keys: list[tuple[int, int]] = field(default_factory=list)
    turn_texts: list[str] = field(default_factory=list)  # ``Speaker: text``, as stored
    turn_vectors: np.ndarray | None = None
    seconds: dict[str, float] = field(default_factory=dict)

    def name_vector_rows(self, names: list[str]) -> np.ndarray:
        return _rows(self.names, self.name_vectors, names)

    def fact_vector_rows(self, texts: list[str]) -> np.ndarray:
        return _rows(self.fact_texts, self.fact_vectors, texts)


def _rows(keys: list[str], matrix: np.ndarray | None, wanted: list[str]) -> np.ndarray:
    if matrix is None:
        raise ValueError("the batch has not been embedded")
    where = {k: i for i, k in enumerate(keys)}
    return matrix[[where[w] for w in wanted]] if wanted else matrix[:0]


# ---------------------------------------------------------------------- stages
def extract_batch(docs: list[Document], config: IndexConfig, extractor: Extractor) -> BatchWork:
    """Chunk ``docs``, run the extractor over the passages and normalize what it found."""
    t0 = time.perf_counter()
    work = BatchWork()
    for i, doc in enumerate(docs):
        for chunk in chunk_document(doc, config.chunk):
            work.chunks.append(chunk)
            work.chunk_doc.append(i)
    extractions = extractor.extract([_for_extraction(c, docs[i]) for c, i in zip(work.chunks, work.chunk_doc, strict=True)])
    if len(extractions) != len(work.chunks):
        raise InputError(f"extractor {extractor.name} returned {len(extractions)} results "
                         f"for {len(work.chunks)} passages")
    extractions = [_with_speakers(e, c, docs[i]) for e, c, i in zip(extractions, work.chunks, work.chunk_doc, strict=True)]
    _collect_graph_items(work, extractions)
    work.key_texts = _key_texts(work, docs, config)
    work.names = sorted({m[1] for m in work.mentions})
    work.fact_texts = sorted({fact_text(s, r, o) for _, s, r, o, kind in work.facts if kind == "triple"})
    work.turn_keys, work.turn_texts = batch_turns(work.chunks, [docs[i] for i in work.chunk_doc])
    work.seconds["extract"] = time.perf_counter() - t0
    return work


def embed_batch(work: BatchWork, embedder: Embedder) -> BatchWork:
    """Embed the batch's passages (as their key texts), entity names, fact texts and the turns
    of its conversation memory units."""
    t0 = time.perf_counter()
    work.passage_vectors = embedder.embed(work.key_texts)
    work.name_vectors = embedder.embed(work.names)
    work.fact_vectors = embedder.embed(work.fact_texts)
    work.turn_vectors = embedder.embed(work.turn_texts)
    work.seconds["embed"] = time.perf_counter() - t0
    return work


def batch_turns(chunks: list[Chunk], docs: list[Document]) -> tuple[list[tuple[int, int]], list[str]]:
    """The turns of the conversation memory units among ``chunks`` (``docs[i]`` is chunk ``i``'s
    document): ``(chunk, position in the session's turns)`` and each turn's ``Speaker: text`` line."""
    keys, texts = [], []
    for ci, (chunk, doc) in enumerate(zip(chunks, docs, strict=True)):
        if doc.metadata.get("kind") == SESSION_KIND:
            for pos, turn in unit_turns(doc.metadata, chunk.start, chunk.end):
                keys.append((ci, pos))
                texts.append(doc.text[turn[2]:turn[3]])
    return keys, texts


def _key_texts(work: BatchWork, docs: list[Document], config: IndexConfig) -> list[str]:
    """Passage keys: title and text; a conversation unit's text without filler lines when
    ``conversation.compress_keys`` is on, followed by its facts when ``conversation.fact_keys``."""
    prepend = config.chunk.prepend_title
    conv = config.conversation
    texts = []
    for ci, chunk in enumerate(work.chunks):
        if conv.compress_keys and docs[work.chunk_doc[ci]].metadata.get("kind") == SESSION_KIND:
            chunk = dataclasses.replace(chunk, text=compress_key(chunk.text))
        texts.append(passage_embedding_text(chunk, prepend))
    if not conv.fact_keys:
        return texts
    facts: dict[int, list[str]] = {}
    for ci, subj, rel, obj, kind in work.facts:
        if kind == "triple":
            facts.setdefault(ci, []).append(fact_text(subj, rel, obj))
    for ci in facts:
        if docs[work.chunk_doc[ci]].metadata.get("kind") == SESSION_KIND:
            texts[ci] += "\nFacts: " + "; ".join(facts[ci])
    return texts


def _collect_graph_items(work: BatchWork, extractions: list[Extraction]) -> None:
    """Normalize extractor output into mention and fact rows keyed by entity names."""
    for ci, extraction in enumerate(extractions):
        seen_mentions: set[tuple[str, str]] = set()

        def mention(surface: str, label: str | None, _ci=ci, _seen=seen_mentions) -> str | None:
            surface = clean_surface(surface)
            name = normalize_entity(surface)
            if not name:
                return None
            if (name, surface) not in _seen:
                _seen.add((name, surface))
                work.mentions.append((_ci, name, surface, label))
            return name

        for surface in extraction.entities:
            mention(surface, extraction.entity_labels.get(surface))
        seen_facts: set[tuple[str, str, str]] = set()
        for triple in extraction.triples:
            subj = mention(triple.subject, extraction.entity_labels.get(triple.subject))
            obj = mention(triple.object, extraction.entity_labels.get(triple.object))
            rel = normalize_relation(triple.relation)
            if not subj or not obj or not rel or subj == obj:
                continue
            kind = "cooccurrence" if triple.relation == COOCCURS else "triple"
            if kind == "cooccurrence":
                subj, obj = sorted((subj, obj))
            key = (subj, rel, obj)
            if key not in seen_facts:
                seen_facts.add(key)
                work.facts.append((ci, subj, rel, obj, kind))


def _for_extraction(chunk: Chunk, doc: Document) -> Chunk:
    """The chunk as the extractor reads it: conversation turns speak in the first person, so
    "Ana: I moved to Berlin" is read as "Ana: Ana moved to Berlin" (facts about the speaker)."""
    if doc.metadata.get("kind") != SESSION_KIND:
        return chunk
    return dataclasses.replace(chunk, text=resolve_speakers(chunk.text))


def _with_speakers(extraction: Extraction, chunk: Chunk, doc: Document) -> Extraction:
    """A conversation unit's speakers are entities it mentions (label PERSON)."""
    if doc.metadata.get("kind") != SESSION_KIND:
        return extraction
    speakers = [line.split(": ", 1)[0] for line in chunk.text.split("\n") if ": " in line]
    new = [sp for sp in dict.fromkeys(speakers) if sp and sp not in extraction.entities]
    if not new:
        return extraction
    labels = {**extraction.entity_labels, **{sp: "PERSON" for sp in new}}
    return dataclasses.replace(extraction, entities=(*extraction.entities, *new), entity_labels=labels)


# ---------------------------------------------------------------------- Arrow transport
def documents_to_json(docs: list[Document]) -> str:
    return json.dumps([[d.id, d.text, d.title, d.metadata] for d in docs], ensure_ascii=False)


def documents_from_json(text: str) -> list[Document]:
    return [Document(i, t, ti, m) for i, t, ti, m in json.loads(text)]


_STR = pa.list_(pa.string())
_INT = pa.list_(pa.int32())


def to_arrow(work: BatchWork, seq: int) -> dict[str, Any]:
    """One batch as the columns of a one-row Arrow batch (``seq`` keeps the input order)."""
    def vec(m: np.ndarray | None) -> bytes | None:
        return None if m is None else np.ascontiguousarray(m, dtype=np.float32).tobytes()

    cols: dict[str, tuple[Any, pa.DataType]] = {
        "seq": (seq, pa.int64()),
        "chunk_doc": (work.chunk_doc, _INT),
        "chunk_doc_id": ([c.doc_id for c in work.chunks], _STR),
        "chunk_ordinal": ([c.ordinal for c in work.chunks], _INT),
        "chunk_title": ([c.title for c in work.chunks], _STR),
        "chunk_text": ([c.text for c in work.chunks], _STR),
        "chunk_start": ([c.start for c in work.chunks], _INT),
        "chunk_end": ([c.end for c in work.chunks], _INT),
        "mention_chunk": ([m[0] for m in work.mentions], _INT),
        "mention_name": ([m[1] for m in work.mentions], _STR),
        "mention_surface": ([m[2] for m in work.mentions], _STR),
        "mention_label": ([m[3] for m in work.mentions], _STR),
        "fact_chunk": ([f[0] for f in work.facts], _INT),
        "fact_subject": ([f[1] for f in work.facts], _STR),
        "fact_relation": ([f[2] for f in work.facts], _STR),
        "fact_object": ([f[3] for f in work.facts], _STR),
        "fact_kind": ([f[4] for f in work.facts], _STR),
        "key_texts": (work.key_texts, _STR),
        "names": (work.names, _STR),
        "fact_texts": (work.fact_texts, _STR),
        "passage_vectors": (vec(work.passage_vectors), pa.large_binary()),
        "name_vectors": (vec(work.name_vectors), pa.large_binary()),
        "fact_vectors": (vec(work.fact_vectors), pa.large_binary()),
        "turn_chunk": ([c for c, _ in work.turn_keys], _INT),
        "turn_position": ([p for _, p in work.turn_keys], _INT),
        "turn_texts": (work.turn_texts, _STR),
        "turn_vectors": (vec(work.turn_vectors), pa.large_binary()),
        "seconds": (json.dumps(work.seconds), pa.string()),
    }
    return {name: pa.array([value], type) for name, (value, type) in cols.items()}


def from_arrow(row: dict[str, Any], dimension: int) -> tuple[int, BatchWork]:
    """``(seq, work)`` from one row of :func:`to_arrow` columns (as Python values)."""
    def vec(raw: bytes | None) -> np.ndarray | None:
        return None if raw is None else np.frombuffer(raw, dtype=np.float32).reshape(-1, dimension).copy()

    chunks = [Chunk(d, o, t, s, e, ti) for d, o, t, s, e, ti in zip(
        row["chunk_doc_id"], row["chunk_ordinal"], row["chunk_text"], row["chunk_start"], row["chunk_end"],
        row["chunk_title"], strict=True)]
    work = BatchWork(
        chunks=chunks,
        chunk_doc=list(row["chunk_doc"]),
        mentions=list(zip(row["mention_chunk"], row["mention_name"], row["mention_surface"],
                          row["mention_label"], strict=True)),
        facts=list(zip(row["fact_chunk"], row["fact_subject"], row["fact_relation"], row["fact_object"],
                       row["fact_kind"], strict=True)),
        key_texts=list(row["key_texts"]),
        passage_vectors=vec(row["passage_vectors"]),
        names=list(row["names"]),
        name_vectors=vec(row["name_vectors"]),
        fact_texts=list(row["fact_texts"]),
        fact_vectors=vec(row["fact_vectors"]),
        turn_keys=list(zip(row["turn_chunk"], row["turn_position"], strict=True)),
        turn_texts=list(row["turn_texts"]),
        turn_vectors=vec(row["turn_vectors"]),
        seconds=json.loads(row["seconds"]),
    )
    return int(row["seq"]), work
