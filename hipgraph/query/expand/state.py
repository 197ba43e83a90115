"""What one expansion call reads and builds: its inputs (typed), and the per-run state that
:class:`~hipgraph.query.expand.Expander` creates for each call and never keeps."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from hipgraph.query.expand.results import Key, SubgraphFact
from hipgraph.store.reads import passage_rows

if TYPE_CHECKING:
    from hipgraph.config import ExpandConfig, RetrievalConfig
    from hipgraph.models.base import Embedder
    from hipgraph.models.chat import ChatClient
    from hipgraph.query.graph_search import GraphSearch
    from hipgraph.query.linking import EntityNames
    from hipgraph.query.snapshot import GraphSnapshot
    from hipgraph.store.database import GraphStore
    from hipgraph.store.vector_set import VectorSet


@dataclass
class Candidate:
    """A fact considered for the subgraph (stored, or proposed by the model)."""

    subject: str
    relation: str
    object: str
    s_idx: int  # entity index in the snapshot, -1 when not stored
    o_idx: int
    fact_id: int | None
    source: str
    row: int = -1  # snapshot fact row of a stored fact
    relevance: float = 0.0
    vec: np.ndarray | None = None
    surfaces: tuple[str, str] = ("", "")  # as the model wrote them (llm)
    via: int | None = None  # the frontier entity that pulled a graph fact

    @property
    def key(self) -> Key:
        return self.subject, self.relation, self.object

    @property
    def ends(self) -> tuple[Any, Any]:
        """The subgraph keys of both ends: the entity index, or the name when not stored."""
        return (self.s_idx if self.s_idx >= 0 else self.subject), (self.o_idx if self.o_idx >= 0 else self.object)


# a candidate's check: (candidate, support, supporting passage ids best first, drop reason or None)
Verdict = tuple[Candidate, float, tuple[int, ...], str | None]


@dataclass
class SubEntity:
    """An entity of a question's growing subgraph."""

    name: str
    idx: int  # snapshot entity index, -1 for a new name
    relevance: float
    hop: int
    via: str
    expanded: bool = False


@dataclass
class QuestionState:
    """One question's growing subgraph and trace."""

    question: str
    entities: dict[Any, SubEntity] = field(default_factory=dict)  # entity index, or name when new
    facts: dict[Key, SubgraphFact] = field(default_factory=dict)
    seen: set[Key] = field(default_factory=set)
    trace: list[dict[str, Any]] = field(default_factory=list)
    path_queries: list[str] = field(default_factory=list)
    shown: set[int] = field(default_factory=set)  # passages the model has read
    relations: list[str] = field(default_factory=list)  # asked about, from the LLM


@dataclass
class Run:
    """One :meth:`~hipgraph.query.expand.Expander.run` call: its inputs, the index snapshot it
    reads, and every question's state."""

    graph: GraphSearch
    embedder: Embedder
    vectors: VectorSet
    store: GraphStore
    client: ChatClient | None
    cfg: RetrievalConfig
    snap: GraphSnapshot
    names: EntityNames
    qvec: np.ndarray
    states: list[QuestionState]
    aug: np.ndarray | None = None  # question + asked relations, embedded (with an LLM)
    retrieved: list[list[int]] = field(default_factory=list)  # passages retrieved per question

    @property
    def ecfg(self) -> ExpandConfig:
        return self.cfg.expand

    @property
    def can_propose(self) -> bool:
        return self.client is not None and self.ecfg.llm_propose

    def name(self, idx: int) -> str:
        return self.names.by_id.get(int(self.snap.entity_ids[idx]), "")

    def entity_id(self, idx: int) -> int | None:
        return int(self.snap.entity_ids[idx]) if idx >= 0 else None

    def relevance(self, vec: np.ndarray, q: int) -> float:
        """Cosine to question ``q``, or to its asked relations when better."""
        score = float(vec @ self.qvec[q])
        if self.aug is not None and self.states[q].relations:
            score = max(score, float(vec @ self.aug[q]))
        return score

    def passage_texts(self, pids: set[int]) -> tuple[list[int], list[str]]:
        """The stored passages among ``pids`` (ascending) and their ``title: text``."""
        ids = sorted(pids)
        if not ids:
            return [], []
        rows = passage_rows(self.store, set(ids))
        ids = [i for i in ids if i in rows]
        return ids, [f"{rows[i][1]}: {rows[i][2]}" if rows[i][1] else rows[i][2] for i in ids]


def triple(c: Candidate | SubgraphFact) -> list[str]:
    return [c.subject, c.relation, c.object]

