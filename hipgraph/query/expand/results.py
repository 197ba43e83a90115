"""What dynamic KG expansion returns: the verified query subgraph, its passages and trace."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hipgraph.query.hits import Ranked
from hipgraph.types import Hit, LearnedFact

GRAPH, RETRIEVAL, LLM = "graph", "retrieval", "llm"  # where a subgraph fact came from

Key = tuple[str, str, str]  # normalised (subject, relation, object)


@dataclass(frozen=True)
class SubgraphFact:
    """One fact of a query subgraph, with provenance.

    ``source``: ``graph`` (a stored fact of a frontier entity), ``retrieval`` (a stored fact found
    by fact search) or ``llm`` (proposed by the model; unverified until checked). ``fact_id`` and
    the entity ids are None for what the index does not hold. ``support``: best cosine between the
    fact and a supporting passage; ``relevance``: cosine between the fact and the question.
    """

    subject: str
    relation: str
    object: str
    subject_id: int | None
    object_id: int | None
    fact_id: int | None
    source: str
    support: float
    passage_ids: tuple[int, ...]
    verified: bool
    iteration: int
    relevance: float = 0.0

    @property
    def triple(self) -> Key:
        return self.subject, self.relation, self.object

    def to_dict(self) -> dict[str, Any]:
        return {"subject": self.subject, "relation": self.relation, "object": self.object,
                "subject_id": self.subject_id, "object_id": self.object_id, "fact_id": self.fact_id,
                "source": self.source, "support": round(self.support, 6),
                "relevance": round(self.relevance, 6), "passage_ids": list(self.passage_ids),
                "verified": self.verified, "iteration": self.iteration}


@dataclass(frozen=True)
class SubgraphEntity:
    """An entity of a query subgraph: ``via`` question (linked span), fact or llm (new name)."""

    name: str
    entity_id: int | None
    relevance: float
    hop: int
    via: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "entity_id": self.entity_id, "relevance": round(self.relevance, 6),
                "hop": self.hop, "via": self.via}


@dataclass
class Expansion:
    """One question's verified subgraph, passage ranking (best first) and per-iteration trace.

    ``new_facts``: the verified facts the model proposed that the index does not hold yet, with
    their supporting passages - what ``persist=True`` hands to the indexer, which then fills
    ``persisted`` and the written facts' ids.
    """

    question: str
    facts: list[SubgraphFact]
    entities: list[SubgraphEntity]
    ranking: Ranked
    hits: list[Hit] = field(default_factory=list)  # the top k as hits, filled by the retriever
    trace: list[dict[str, Any]] = field(default_factory=list)
    persisted: int = 0  # new facts this expansion wrote into the index (persist=True)
    path_queries: list[str] = field(default_factory=list)  # the refined queries fused into ranking
    asked_relations: list[str] = field(default_factory=list)  # with an LLM: what the question asks
    new_facts: list[LearnedFact] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"question": self.question, "facts": [f.to_dict() for f in self.facts],
                "entities": [e.to_dict() for e in self.entities], "trace": self.trace,
                "path_queries": self.path_queries, "persisted": self.persisted,
                "asked_relations": self.asked_relations,
                "hits": [h.to_dict() for h in self.hits]}


def verified_new_facts(facts: list[SubgraphFact]) -> list[LearnedFact]:
    """The verified facts among ``facts`` that are not stored yet and have supporting passages."""
    return [LearnedFact(f.subject, f.relation, f.object, tuple(f.passage_ids)) for f in facts
            if f.verified and f.fact_id is None and f.passage_ids]
