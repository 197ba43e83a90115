"""Typed records that cross module boundaries."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class Document:
    """One input document: ``id`` is the user's stable key, ``text`` its content."""

    id: str
    text: str
    title: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Turn:
    """One utterance of a conversation; ``time`` defaults to its session's."""

    id: str
    speaker: str
    text: str
    time: datetime | None = None


@dataclass(frozen=True)
class Session:
    """A sitting of a conversation: its turns in order, at ``time`` (None when unknown)."""

    id: str
    turns: tuple[Turn, ...]
    time: datetime | None = None


@dataclass(frozen=True)
class Conversation:
    """A conversation (chat history) to remember: sessions in order, its speakers."""

    id: str
    sessions: tuple[Session, ...]
    speakers: tuple[str, ...] = ()


@dataclass(frozen=True)
class Chunk:
    """A passage cut from a document, with character offsets into ``Document.text``."""

    doc_id: str
    ordinal: int
    text: str
    start: int
    end: int
    title: str = ""


@dataclass(frozen=True)
class Triple:
    """A raw (subject, relation, object) as an extractor produced it (surface forms)."""

    subject: str
    relation: str
    object: str


@dataclass(frozen=True)
class Extraction:
    """What an extractor found in one passage: entity surface forms and triples.

    ``entity_labels`` maps a surface form to its type label (e.g. spaCy's NER label) when known.
    """

    entities: tuple[str, ...]
    triples: tuple[Triple, ...]
    entity_labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Fact:
    """A stored fact: entity ids and names, relation, and the passages that state it."""

    id: int
    subject_id: int
    subject: str
    relation: str
    object_id: int
    object: str
    passage_ids: tuple[int, ...] = ()
    # facts stated in conversations: when first stated, and when a later fact replaced it
    valid_at: datetime | None = None
    invalid_at: datetime | None = None
    invalidated_by: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "subject": self.subject, "relation": self.relation, "object": self.object,
                "subject_id": self.subject_id, "object_id": self.object_id,
                "passage_ids": list(self.passage_ids),
                "valid_at": self.valid_at.isoformat() if self.valid_at else None,
                "invalid_at": self.invalid_at.isoformat() if self.invalid_at else None,
                "invalidated_by": self.invalidated_by}


@dataclass(frozen=True)
class LearnedFact:
    """A fact learned at query time, to store: normalised entity names, relation, supporting
    passage ids (dynamic KG expansion hands these to the indexer)."""

    subject: str
    relation: str
    object: str
    passage_ids: tuple[int, ...]

    @property
    def key(self) -> tuple[str, str, str]:
        return self.subject, self.relation, self.object


@dataclass
class IndexReport:
    """What one ``add_documents`` / ``delete_documents`` call did."""

    added: int = 0
    replaced: int = 0
    unchanged: int = 0
    deleted: int = 0
    skipped: int = 0
    passages: int = 0
    entities_new: int = 0
    facts_new: int = 0
    synonym_edges_new: int = 0  # net change in synonym edges
    seconds: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def merge(self, other: IndexReport) -> None:
        """Add ``other``'s counts and timings into this report."""
        for name in (
            "added", "replaced", "unchanged", "deleted", "skipped", "passages",
            "entities_new", "facts_new", "synonym_edges_new",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for stage, secs in other.seconds.items():
            self.seconds[stage] = self.seconds.get(stage, 0.0) + secs
        self.warnings.extend(other.warnings)

    def to_dict(self) -> dict[str, Any]:
        return {
            "added": self.added, "replaced": self.replaced, "unchanged": self.unchanged,
            "deleted": self.deleted, "skipped": self.skipped, "passages": self.passages,
            "entities_new": self.entities_new, "facts_new": self.facts_new,
            "synonym_edges_new": self.synonym_edges_new,
            "seconds": {k: round(v, 4) for k, v in self.seconds.items()},
            "warnings": list(self.warnings),
        }


@dataclass(frozen=True)
class Hit:
    """One retrieved passage: where it comes from, its score and rank, and why it was chosen."""

    doc_id: str
    passage_id: int
    title: str
    text: str
    score: float
    rank: int
    why: dict[str, Any] = field(default_factory=dict)
    # conversation memory: the turns the unit covers, its conversation, session and time span
    turn_ids: tuple[str, ...] = ()
    speakers: tuple[str, ...] = ()
    conversation: str = ""
    session: str = ""
    time: str = ""  # ISO 8601 start of the unit ("" outside conversations)
    time_end: str = ""

    def _repr_html_(self) -> str:
        from hipgraph.display import hits_html  # noqa: PLC0415

        return hits_html([self])

    def to_dict(self) -> dict[str, Any]:
        out = {"doc_id": self.doc_id, "passage_id": self.passage_id, "title": self.title,
               "text": self.text, "score": self.score, "rank": self.rank, "why": self.why}
        if self.turn_ids:
            out.update({"turn_ids": list(self.turn_ids), "speakers": list(self.speakers),
                        "conversation": self.conversation,
                        "session": self.session, "time": self.time, "time_end": self.time_end})
        return out


class Hits(list):
    """The hits of one question (a plain list that renders as a table in notebooks)."""

    def _repr_html_(self) -> str:
        from hipgraph.display import hits_html  # noqa: PLC0415

        return hits_html(self)


class Stats(dict):
    """Index statistics (a plain dict that renders as a table in notebooks)."""

    def _repr_html_(self) -> str:
        from hipgraph.display import stats_html  # noqa: PLC0415

        return stats_html(self)


@dataclass(frozen=True)
class Answer:
    """A generated answer with the hits it cites and the context the generator saw.

    ``abstained`` is true when the generator said the context does not hold the answer (then
    ``text`` is empty and nothing is cited). ``hits`` are all retrieved passages, ``citations``
    the ones the answer cites; with the ``none`` generator ``citations`` are the context's hits.
    """

    question: str
    text: str
    citations: list[Hit]
    context: str
    abstained: bool
    usage: dict[str, Any] = field(default_factory=dict)
    hits: list[Hit] = field(default_factory=list)
    generator: str = ""

    def _repr_html_(self) -> str:
        from hipgraph.display import answer_html  # noqa: PLC0415

        return answer_html(self)

    def to_dict(self) -> dict[str, Any]:
        return {"question": self.question, "answer": self.text, "abstained": self.abstained,
                "citations": [{"doc_id": h.doc_id, "passage_id": h.passage_id, "title": h.title,
                               "text": h.text, "rank": h.rank} for h in self.citations],
                "context": self.context, "usage": dict(self.usage), "generator": self.generator}
