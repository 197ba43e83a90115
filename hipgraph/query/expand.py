"""Dynamic knowledge-graph expansion at query time (``mode="expand"``).

A small query subgraph is grown from graph mode's seeds (question entities linked to the graph,
facts similar to the question). Each iteration expands the frontier: every frontier entity pulls
its stored facts most similar to the question, the first iteration also takes the best facts of
a fact search, and with an LLM the model proposes facts read from the best passages. Every
candidate is checked against passages before it joins (refinement): a stored fact against its
source passages, a proposed one against passages that mention both of its ends (embedding
support, then the model's entailment verdict); the rest are dropped with the reason in the
trace. Expansion stops at ``max_iterations`` or ``max_entities`` (:class:`ExpandConfig`).

Passages: the question's graph ranking is fused by reciprocal rank with the graph rankings of
path queries, the question followed by a verified fact that leads from a question entity to a new
one (the bridge the question is after); each hit's ``why`` names the subgraph facts the passage
supports. ``persist=True`` writes verified new facts (proposed by the LLM, not stored yet) into
the index in one transaction, with their supporting passages as provenance.
"""

from __future__ import annotations

import json
import logging
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa

from hipgraph.config import ExpandConfig, RetrievalConfig
from hipgraph.errors import LLMError, StoreError
from hipgraph.models.chat import ChatClient
from hipgraph.prompts import load_prompt
from hipgraph.query.dense import dense_rankings
from hipgraph.query.graph import top_passages
from hipgraph.query.hits import Ranked, passage_rows
from hipgraph.text.facts import fact_text
from hipgraph.text.json_reply import parse_json_reply
from hipgraph.text.normalize import clean_surface, normalize_entity, normalize_relation
from hipgraph.types import Hit

logger = logging.getLogger(__name__)

GRAPH, RETRIEVAL, LLM = "graph", "retrieval", "llm"
HUB_FACTS = 1000  # a frontier entity in more stored facts than this is too generic to expand
POOL_PASSAGES = 200  # passages of one entity checked for mentions of a proposed fact's other end
_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2013": "-", "\u2014": "-"})
_SPACES = re.compile(r"\s+")

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
    """One question's verified subgraph, passage ranking (best first) and per-iteration trace."""

    question: str
    facts: list[SubgraphFact]
    entities: list[SubgraphEntity]
    ranking: Ranked
    hits: list[Hit] = field(default_factory=list)  # the top k as hits, filled by the retriever
    trace: list[dict[str, Any]] = field(default_factory=list)
    persisted: int = 0  # new facts this expansion wrote into the index (persist=True)
    path_queries: list[str] = field(default_factory=list)  # the refined queries fused into ranking
    asked_relations: list[str] = field(default_factory=list)  # with an LLM: what the question asks

    def to_dict(self) -> dict[str, Any]:
        return {"question": self.question, "facts": [f.to_dict() for f in self.facts],
                "entities": [e.to_dict() for e in self.entities], "trace": self.trace,
                "path_queries": self.path_queries, "persisted": self.persisted,
                "asked_relations": self.asked_relations,
                "hits": [h.to_dict() for h in self.hits]}


# ---------------------------------------------------------------------- internal state
@dataclass
class _Candidate:
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


@dataclass
class _Entity:
    name: str
    idx: int  # snapshot entity index, -1 for a new name
    relevance: float
    hop: int
    via: str
    expanded: bool = False


@dataclass
class _State:
    question: str
    entities: dict[Any, _Entity] = field(default_factory=dict)  # entity index, or name when new
    facts: dict[Key, SubgraphFact] = field(default_factory=dict)
    seen: set[Key] = field(default_factory=set)
    trace: list[dict[str, Any]] = field(default_factory=list)
    path_queries: list[str] = field(default_factory=list)
    shown: set[int] = field(default_factory=set)  # passages the model has read
    relations: list[str] = field(default_factory=list)  # asked about, from the LLM


def _triple(c: _Candidate | SubgraphFact) -> list[str]:
    return [c.subject, c.relation, c.object]


def _norm_text(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).translate(_QUOTES).lower()
    return _SPACES.sub(" ", text)


def _mentions(name: str, text: str) -> bool:
    """Whether normalised ``name`` occurs in normalised ``text`` as whole words."""
    return bool(name) and re.search(rf"(?<!\w){re.escape(name)}(?!\w)", text) is not None


def parse_facts(reply: str, limit: int) -> list[tuple[str, str, str]]:
    """The proposed triples of a reply ``{"facts": [[s, r, o], ...]}``; ``ValueError`` if malformed."""
    data = parse_json_reply(reply)
    if not isinstance(data, dict) or not isinstance(data.get("facts"), list):
        raise ValueError('expected {"facts": [[subject, relation, object], ...]}')
    out = []
    for item in data["facts"]:
        if not (isinstance(item, list | tuple) and len(item) == 3
                and all(isinstance(x, str) and x.strip() for x in item)):
            raise ValueError(f"a proposed fact is not three non-empty strings: {item!r}")
        out.append((item[0], item[1], item[2]))
    return out[:limit]


def parse_verdict(reply: str, n_passages: int) -> tuple[bool, list[int]]:
    """``(supported, 0-based passage indexes)`` of ``{"supported": bool, "passages": [n, ...]}``."""
    data = parse_json_reply(reply)
    if not isinstance(data, dict) or not isinstance(data.get("supported"), bool):
        raise ValueError('expected {"supported": true|false, "passages": [numbers]}')
    numbers = data.get("passages", [])
    if not isinstance(numbers, list) or not all(isinstance(n, int) and not isinstance(n, bool)
                                                and 1 <= n <= n_passages for n in numbers):
        raise ValueError(f"passages must be numbers between 1 and {n_passages}: {numbers!r}")
    return data["supported"], sorted({n - 1 for n in numbers})


class Expander:
    """Runs query-time KG expansion over a :class:`~hipgraph.query.engine.Retriever`;
    ``client`` (optional) is the chat client that proposes and verifies facts."""

    def __init__(self, retriever, client: ChatClient | None):
        self.retriever = retriever
        self.client = client

    # ------------------------------------------------------------------ entry point
    def run(self, questions: Sequence[str], depth: int, cfg: RetrievalConfig,
            persist: bool = False) -> list[Expansion]:
        questions = list(questions)
        if not questions:
            return []
        r = self.retriever
        if persist and r.store.read_only:
            raise StoreError(f"index {r.store.root} is open read-only; persist=True needs a writable index")
        if persist and r.fact_writer is None:
            raise StoreError("this retriever has no fact writer; persist=True needs one")
        ecfg = cfg.expand
        gcfg = replace(cfg, graph=replace(cfg.graph, explain=False))
        run = r.graph_run(questions, gcfg)
        snap = run.snapshot
        self._snap, self._names, self._ecfg, self._cfg = snap, r.entity_names(), ecfg, cfg
        self._qvec = run.qvec
        states = [_State(q) for q in questions]
        self._aug = self._relations(states) if self._can_propose(ecfg) else None
        self._states_relations = [bool(st.relations) for st in states]
        for q, st in enumerate(states):
            for idx in list(run.seeds[q].linked)[: ecfg.max_entities]:
                st.entities[idx] = _Entity(self._name(idx), idx, 1.0, 0, "question")
        # passages retrieved for each question (graph mode's PPR, else dense): support candidates
        self._retrieved = self._first_passages(run, ecfg.support_passages)
        for it in range(ecfg.max_iterations):
            frontier = [self._frontier(st, ecfg) for st in states]
            if it > 0 and not any(frontier) and not self._can_propose(ecfg):
                break
            self._iterate(states, frontier, it)
        rankings = self._rank(run, states, depth, cfg, gcfg)
        out = []
        for st, ranking in zip(states, rankings, strict=True):
            entities = [SubgraphEntity(e.name, int(snap.entity_ids[e.idx]) if e.idx >= 0 else None,
                                       e.relevance, e.hop, e.via) for e in st.entities.values()]
            out.append(Expansion(st.question, list(st.facts.values()), entities, ranking, trace=st.trace,
                                 path_queries=st.path_queries, asked_relations=st.relations))
        if persist:
            self._persist(out)
        return out

    def _relations(self, states: list[_State]) -> np.ndarray | None:
        """With an LLM: the relations each question asks about (``expand_relations`` prompt),
        embedded with the question; a candidate fact's relevance is then the better of its
        cosine to the question and to that expansion. None when the model gave nothing usable."""
        prompt = load_prompt("expand_relations")
        replies = self.client.complete_many([prompt.render(question=st.question) for st in states],
                                            json_mode=True, return_exceptions=True)
        for st, reply in zip(states, replies, strict=True):
            try:
                if isinstance(reply, LLMError):
                    raise ValueError(f"request failed: {reply}")
                data = parse_json_reply(reply.text)
                rels = data.get("relations") if isinstance(data, dict) else None
                if not isinstance(rels, list) or not all(isinstance(r, str) and r.strip() for r in rels):
                    raise ValueError('expected {"relations": ["...", ...]}')
                st.relations = [r.strip() for r in rels[:4]]
            except ValueError as exc:
                logger.warning("expand: asked relations unusable for %r: %s", st.question, exc)
        if not any(st.relations for st in states):
            return None
        texts = [f"{st.question} {'; '.join(st.relations)}" for st in states]
        return self.retriever._embedder().embed(texts)

    def _relevance(self, vec: np.ndarray, q: int) -> float:
        score = float(vec @ self._qvec[q])
        if self._aug is not None and self._states_relations[q]:
            score = max(score, float(vec @ self._aug[q]))
        return score

    def _can_propose(self, ecfg: ExpandConfig) -> bool:
        return self.client is not None and ecfg.llm_propose

    def _name(self, idx: int) -> str:
        return self._names.by_id.get(int(self._snap.entity_ids[idx]), "")

    def _first_passages(self, run, n: int) -> list[list[int]]:
        """Each question's best ``n`` passage ids before expansion."""
        snap = run.snapshot
        out: list[list[int]] = []
        dense = None
        for q in range(len(run.seeds)):
            if q in run.rows:
                row = run.scores[run.rows[q], : snap.n_passages]
                out.append([int(snap.passage_ids[node]) for node, _ in top_passages(row, n)])
            else:
                if dense is None:
                    dense = dense_rankings(self.retriever.vectors, run.qvec, n)
                out.append([pid for pid, _, _ in dense[q]])
        return out

    @staticmethod
    def _frontier(st: _State, ecfg: ExpandConfig) -> list[int]:
        todo = [e for e in st.entities.values() if not e.expanded and e.idx >= 0]
        todo.sort(key=lambda e: (e.hop, -e.relevance, e.idx))
        chosen = todo[: ecfg.frontier_size]
        for e in chosen:
            e.expanded = True
        return [e.idx for e in chosen]

    # ------------------------------------------------------------------ one iteration
    def _iterate(self, states: list[_State], frontier: list[list[int]], it: int) -> None:
        snap, ecfg = self._snap, self._ecfg
        traces = [{"iteration": it, "frontier": [self._name(i) for i in f], "candidates": 0,
                   "below_relevance": 0, "added": [], "entities_added": [], "dropped": []}
                  for f in frontier]
        per_q: list[list[_Candidate]] = [[] for _ in states]
        # stored facts: those of the frontier entities, and (first iteration) a fact search
        if it == 0 and ecfg.retrieval_facts and snap.fact_ids.size:
            scores, ids = self.retriever.vectors.search("fact", self._qvec,
                                                        min(ecfg.retrieval_facts, snap.fact_ids.size))
            for q in range(len(states)):
                rows = snap.fact_index(ids[q])
                for row, s in zip(rows.tolist(), scores[q].tolist(), strict=True):
                    if row >= 0:
                        per_q[q].append(self._stored(row, RETRIEVAL, relevance=float(s)))
        indptr, frows = snap.entity_facts
        for q, f in enumerate(frontier):
            for idx in f:
                if indptr[idx + 1] - indptr[idx] > HUB_FACTS:
                    traces[q].setdefault("hubs_skipped", []).append(self._name(idx))
                    continue
                for row in frows[indptr[idx]: indptr[idx + 1]].tolist():
                    per_q[q].append(self._stored(int(row), GRAPH, via=idx))
        if self._can_propose(ecfg):
            self._propose(states, per_q, traces)
        self._score(per_q)
        chosen = self._select(states, per_q, traces)
        verdicts = self._verify(chosen)
        for q, st in enumerate(states):
            self._admit(st, verdicts[q], it, traces[q])
            st.trace.append(traces[q])

    def _stored(self, row: int, source: str, relevance: float | None = None,
                via: int | None = None) -> _Candidate:
        snap = self._snap
        s, o = int(snap.fact_subject[row]), int(snap.fact_object[row])
        c = _Candidate(self._name(s), "", self._name(o), s, o, int(snap.fact_ids[row]), source, row=row)
        c.relevance = relevance if relevance is not None else np.nan
        c.via = via
        return c

    def _score(self, per_q: list[list[_Candidate]]) -> None:
        """Relations and vectors of stored candidates (one DuckDB read), cosine to the question."""
        ids = sorted({c.fact_id for cands in per_q for c in cands if c.fact_id is not None and c.vec is None})
        if not ids:
            return
        store = self.retriever.store
        rel = dict(store.con.execute(
            "SELECT id, relation FROM facts WHERE id IN (SELECT unnest(?::BIGINT[]))", [ids]).fetchall())
        vid, vecs = store.read_vectors("fact", np.asarray(ids, np.int64))
        vec_of = {int(i): vecs[j] for j, i in enumerate(vid.tolist())}
        for q, cands in enumerate(per_q):
            for c in cands:
                if c.fact_id is None or c.vec is not None:
                    continue
                c.relation = rel.get(c.fact_id, c.relation)
                c.vec = vec_of.get(c.fact_id)
                if c.vec is not None and np.isnan(c.relevance):
                    c.relevance = self._relevance(c.vec, q)
                elif np.isnan(c.relevance):
                    c.relevance = 0.0

    def _select(self, states: list[_State], per_q: list[list[_Candidate]],
                traces: list[dict[str, Any]]) -> list[list[_Candidate]]:
        """Per question the candidates to check: new to the subgraph, relevant enough, at most
        ``facts_per_entity`` per frontier entity and ``retrieval_facts`` from the fact search."""
        ecfg = self._ecfg
        out: list[list[_Candidate]] = []
        for st, cands, trace in zip(states, per_q, traces, strict=True):
            picked: dict[Key, _Candidate] = {}
            taken: dict[Any, int] = {}
            ranked = sorted(cands, key=lambda c: (c.source != LLM, -c.relevance, c.fact_id or -1))
            trace["candidates"] = len({c.key for c in cands} - st.seen)
            for c in ranked:
                if c.key in st.seen or c.key in picked:
                    continue
                if c.source != LLM and c.relevance < ecfg.min_relevance:
                    trace["below_relevance"] += 1
                    continue
                group = c.via if c.source == GRAPH else c.source
                limit = ecfg.facts_per_entity if c.source == GRAPH else (
                    ecfg.retrieval_facts if c.source == RETRIEVAL else ecfg.max_proposals)
                if taken.get(group, 0) >= limit:
                    continue
                taken[group] = taken.get(group, 0) + 1
                picked[c.key] = c
            out.append(list(picked.values()))
        return out

    # ------------------------------------------------------------------ LLM proposals
    def _propose(self, states: list[_State], per_q: list[list[_Candidate]],
                 traces: list[dict[str, Any]]) -> None:
        """Ask the model for facts per question (one batch), resolve their entities."""
        ecfg = self._ecfg
        prompt = load_prompt("expand_propose")
        reading = []
        for q, st in enumerate(states):  # new facts' passages first, then the best retrieved
            recent = sorted((f for f in st.facts.values() if f.iteration == len(st.trace) - 1),
                            key=lambda f: -f.relevance)
            pool = [p for f in recent for p in f.passage_ids] + self._retrieved[q]
            reading.append([p for p in dict.fromkeys(pool) if p not in st.shown][: ecfg.read_passages])
            st.shown.update(reading[-1])
        texts = dict(zip(*self._passage_texts({p for ps in reading for p in ps}), strict=True))
        batch = []
        for q, st in enumerate(states):
            known = [list(f.triple) for f in sorted(st.facts.values(), key=lambda f: -f.relevance)][:20]
            passages = "\n".join(f"[{i}] {texts[p]}" for i, p in enumerate(
                [p for p in reading[q] if p in texts], start=1))
            batch.append(prompt.render(question=st.question, max_facts=ecfg.max_proposals,
                                       facts=json.dumps({"facts": known}), passages=passages or "(none)"))
        replies = self.client.complete_many(batch, json_mode=True, return_exceptions=True)
        proposals: list[tuple[int, tuple[str, str, str]]] = []
        for q, reply in enumerate(replies):
            if isinstance(reply, LLMError):
                logger.warning("expand: proposal request failed for question %d: %s", q, reply)
                traces[q]["llm"] = f"proposal request failed: {reply}"
                continue
            try:
                triples = parse_facts(reply.text, ecfg.max_proposals)
            except ValueError as exc:
                logger.warning("expand: proposal reply for question %d unusable: %s", q, exc)
                traces[q]["llm"] = f"unusable proposal reply: {exc}"
                continue
            traces[q]["proposed"] = [list(t) for t in triples]
            proposals.extend((q, t) for t in triples)
        if not proposals:
            return
        cands = self._resolve([t for _, t in proposals])
        for (q, _), c in zip(proposals, cands, strict=True):
            if c is not None:
                c.relevance = self._relevance(c.vec, q)
                per_q[q].append(c)

    def _resolve(self, triples: list[tuple[str, str, str]]) -> list[_Candidate | None]:
        """Proposed triples as candidates: names linked to entities (exactly or by embedding),
        fact vectors, stored fact ids where the triple exists. One embedding call."""
        snap, names = self._snap, self._names
        rows = []
        for s, r, o in triples:
            ns, nr, no = normalize_entity(s), normalize_relation(r), normalize_entity(o)
            rows.append(None if not (ns and nr and no) or ns == no else (ns, nr, no, clean_surface(s), clean_surface(o)))
        ok = [x for x in rows if x is not None]
        if not ok:
            return [None] * len(rows)
        unlinked = sorted({n for ns, _, no, _, _ in ok for n in (ns, no) if names.by_name.get(n) is None})
        vecs = self.retriever._embedder().embed([fact_text(ns, nr, no) for ns, nr, no, _, _ in ok] + unlinked)
        fvec, nvec = vecs[: len(ok)], vecs[len(ok):]
        linked: dict[str, int] = {}
        if unlinked and snap.n_entities:
            scores, ids = self.retriever.vectors.search("entity", nvec, 1)
            idx = snap.entity_index(ids[:, 0])
            for n, s, e in zip(unlinked, scores[:, 0].tolist(), idx.tolist(), strict=True):
                if e >= 0 and s >= self._cfg.graph.link_threshold:
                    linked[n] = int(e)

        def index_of(name: str) -> tuple[str, int]:
            eid = names.by_name.get(name)
            if eid is not None:
                i = int(snap.entity_index(np.array([eid]))[0])
                if i >= 0:
                    return name, i
            if name in linked:
                return self._name(linked[name]), linked[name]
            return name, -1

        out: list[_Candidate | None] = []
        j = 0
        for x in rows:
            if x is None:
                out.append(None)
                continue
            ns, nr, no, ss, so = x
            (ns, si), (no, oi) = index_of(ns), index_of(no)
            c = _Candidate(ns, nr, no, si, oi, None, LLM, surfaces=(ss, so))
            c.vec = fvec[j]
            j += 1
            out.append(c if ns != no else None)
        known = [c for c in out if c is not None and c.s_idx >= 0 and c.o_idx >= 0]
        if known:
            table = pa.table({"s": pa.array([int(snap.entity_ids[c.s_idx]) for c in known], pa.int64()),
                              "r": pa.array([c.relation for c in known], pa.string()),
                              "o": pa.array([int(snap.entity_ids[c.o_idx]) for c in known], pa.int64())})
            store = self.retriever.store
            store.con.register("_expand_keys", table)
            try:
                found = {(int(s), r, int(o)): int(i) for s, r, o, i in store.con.execute(
                    "SELECT f.subject_id, f.relation, f.object_id, f.id FROM facts f JOIN _expand_keys k "
                    "ON f.subject_id = k.s AND f.relation = k.r AND f.object_id = k.o").fetchall()}
            finally:
                store.unregister("_expand_keys")
            for c in known:
                c.fact_id = found.get((int(snap.entity_ids[c.s_idx]), c.relation, int(snap.entity_ids[c.o_idx])))
        return out

    # ------------------------------------------------------------------ refinement
    def _verify(self, chosen: list[list[_Candidate]]
                ) -> list[list[tuple[_Candidate, float, tuple[int, ...], str | None]]]:
        """Per question ``(candidate, support, supporting passage ids, drop reason or None)``."""
        snap, ecfg, store = self._snap, self._ecfg, self.retriever.store
        stored_ids = sorted({c.fact_id for cands in chosen for c in cands if c.fact_id is not None})
        sources: dict[int, list[int]] = {}
        if stored_ids:
            for fid, pid in store.con.execute(
                    "SELECT DISTINCT fact_id, passage_id FROM fact_sources "
                    "WHERE fact_id IN (SELECT unnest(?::BIGINT[])) ORDER BY ALL", [stored_ids]).fetchall():
                sources.setdefault(int(fid), []).append(int(pid))
        # passages that may support each proposed new fact: those of its entities, the retrieved ones
        maybe: dict[int, list[int]] = {}
        for q, cands in enumerate(chosen):
            for c in cands:
                if c.fact_id is None:  # passages mentioning both ends, then one end, then retrieved
                    ends = [snap.entity_passages(i) for i in (c.s_idx, c.o_idx) if i >= 0]
                    both = np.intersect1d(*ends) if len(ends) == 2 else np.zeros(0, np.int64)
                    one = min(ends, key=len)[:POOL_PASSAGES] if ends else np.zeros(0, np.int64)
                    pool = [int(snap.passage_ids[n]) for n in np.concatenate([both, one]).tolist()]
                    maybe[id(c)] = list(dict.fromkeys(pool + self._retrieved[q]))
        need_text = {p for ps in maybe.values() for p in ps}
        pids, texts = self._passage_texts(need_text)
        norm = {p: _norm_text(t) for p, t in zip(pids, texts, strict=True)}
        want = {p for ps in sources.values() for p in ps} | set(norm)
        vid, pvecs = store.read_vectors("passage", np.asarray(sorted(want), np.int64))
        pvec = {int(i): pvecs[j] for j, i in enumerate(vid.tolist())}
        out: list[list[tuple[_Candidate, float, tuple[int, ...], str | None]]] = []
        to_judge: list[tuple[int, int, _Candidate, list[int]]] = []
        for q, cands in enumerate(chosen):
            res = []
            for c in cands:
                if c.fact_id is not None:
                    support_ids = [p for p in sources.get(c.fact_id, []) if p in pvec]
                    if not support_ids:
                        res.append((c, 0.0, (), "no source passage is stored"))
                        continue
                else:
                    support_ids = self._grounded(c, [p for p in maybe[id(c)] if p in norm], norm)
                    if not support_ids:
                        res.append((c, 0.0, (), f"no passage mentions both {c.subject!r} and {c.object!r}"))
                        continue
                cos = np.array([float(c.vec @ pvec[p]) for p in support_ids]) if c.vec is not None \
                    else np.zeros(len(support_ids))
                order = np.argsort(-cos, kind="stable")
                support_ids = [support_ids[i] for i in order]
                best = float(cos[order[0]])
                if best < ecfg.min_support:
                    res.append((c, best, tuple(support_ids),
                                f"support {best:.3f} < min_support {ecfg.min_support}"))
                    continue
                if c.fact_id is None and self.client is not None and ecfg.llm_verify:
                    to_judge.append((q, len(res), c, support_ids[: ecfg.read_passages]))
                res.append((c, best, tuple(support_ids), None))
            out.append(res)
        if to_judge:
            self._judge(to_judge, out)
        return out

    def _grounded(self, c: _Candidate, pids: list[int], norm: dict[int, str]) -> list[int]:
        """The passages among ``pids`` where both ends of ``c`` occur (a stored mention, or the
        name in the passage's normalised text)."""
        snap = self._snap
        nodes = snap.passage_nodes(np.asarray(pids, np.int64)).tolist()
        ends = []
        for idx, name, surface in ((c.s_idx, c.subject, c.surfaces[0]), (c.o_idx, c.object, c.surfaces[1])):
            mentioned = set(snap.entity_passages(idx).tolist()) if idx >= 0 else set()
            ends.append((mentioned, {name, normalize_entity(surface)} - {""}))
        return [p for p, node in zip(pids, nodes, strict=True)
                if all(node in mentioned or any(_mentions(n, norm[p]) for n in names)
                       for mentioned, names in ends)]

    def _judge(self, items: list[tuple[int, int, _Candidate, list[int]]],
               out: list[list[tuple[_Candidate, float, tuple[int, ...], str | None]]]) -> None:
        """The model's entailment verdict on each new fact, given its best supporting passages."""
        prompt = load_prompt("expand_verify")
        pids, texts = self._passage_texts({p for *_, ps in items for p in ps})
        text = dict(zip(pids, texts, strict=True))
        batch = [prompt.render(fact=json.dumps(_triple(c)),
                               passages="\n".join(f"[{i}] {text[p]}" for i, p in enumerate(ps, start=1)))
                 for _, _, c, ps in items]
        replies = self.client.complete_many(batch, json_mode=True, return_exceptions=True)
        for (q, j, c, ps), reply in zip(items, replies, strict=True):
            _, support, ids, _ = out[q][j]
            if isinstance(reply, LLMError):
                logger.warning("expand: verification request failed: %s", reply)
                out[q][j] = (c, support, ids, f"verification request failed: {reply}")
                continue
            try:
                ok, chosen = parse_verdict(reply.text, len(ps))
            except ValueError as exc:
                logger.warning("expand: verification reply unusable: %s", exc)
                out[q][j] = (c, support, ids, f"unusable verification reply: {exc}")
                continue
            if not ok:
                out[q][j] = (c, support, ids, "the model judged it not entailed by the passages")
            elif chosen:
                first = [ps[i] for i in chosen]
                out[q][j] = (c, support, tuple(first + [p for p in ids if p not in first]), None)

    def _admit(self, st: _State, verdicts: list[tuple[_Candidate, float, tuple[int, ...], str | None]],
               it: int, trace: dict[str, Any]) -> None:
        """Add verified candidates (best first) within the entity budget; record the dropped."""
        snap, ecfg = self._snap, self._ecfg
        verdicts = sorted(verdicts, key=lambda v: (v[3] is not None, -v[0].relevance))
        for c, support, pids, reason in verdicts:
            st.seen.add(c.key)
            if reason is None:
                new = [k for k in self._ends(c) if k not in st.entities]
                if len(st.entities) + len(new) > ecfg.max_entities:
                    reason = f"entity budget reached (max_entities={ecfg.max_entities})"
            if reason is not None:
                trace["dropped"].append({"fact": _triple(c), "source": c.source, "reason": reason,
                                         "support": round(support, 6)})
                continue
            fact = SubgraphFact(
                c.subject, c.relation, c.object,
                int(snap.entity_ids[c.s_idx]) if c.s_idx >= 0 else None,
                int(snap.entity_ids[c.o_idx]) if c.o_idx >= 0 else None,
                c.fact_id, c.source, support, pids, True, it, c.relevance)
            st.facts[c.key] = fact
            trace["added"].append({"fact": _triple(c), "source": c.source, "support": round(support, 6),
                                   "relevance": round(c.relevance, 6)})
            for k, idx, name in ((self._ends(c)[0], c.s_idx, c.subject), (self._ends(c)[1], c.o_idx, c.object)):
                if k in st.entities:
                    e = st.entities[k]
                    e.relevance = max(e.relevance, c.relevance)
                    continue
                st.entities[k] = _Entity(name, idx, max(c.relevance, 0.0), it, "fact" if idx >= 0 else LLM)
                trace["entities_added"].append(name)

    @staticmethod
    def _ends(c: _Candidate) -> tuple[Any, Any]:
        return (c.s_idx if c.s_idx >= 0 else c.subject), (c.o_idx if c.o_idx >= 0 else c.object)

    def _passage_texts(self, pids: set[int]) -> tuple[list[int], list[str]]:
        ids = sorted(pids)
        if not ids:
            return [], []
        rows = passage_rows(self.retriever.store, set(ids))
        ids = [i for i in ids if i in rows]
        return ids, [f"{rows[i][1]}: {rows[i][2]}" if rows[i][1] else rows[i][2] for i in ids]

    # ------------------------------------------------------------------ ranking
    @staticmethod
    def _paths(st: _State, n: int) -> list[SubgraphFact]:
        """Up to ``n`` verified facts leading from a question entity to a new one (distinct new
        ends), most relevant first."""
        asked = {e.name for e in st.entities.values() if e.via == "question"}
        out: list[SubgraphFact] = []
        ends: set[str] = set()
        for f in sorted(st.facts.values(), key=lambda f: (-f.relevance, f.triple)):
            if len(out) >= n:
                break
            if (f.subject in asked) == (f.object in asked):
                continue
            end = f.object if f.subject in asked else f.subject
            if end not in ends:
                ends.add(end)
                out.append(f)
        return out

    def _rank(self, run, states: list[_State], depth: int, cfg: RetrievalConfig,
              gcfg: RetrievalConfig) -> list[Ranked]:
        """The question's graph ranking fused by reciprocal rank with its path queries' graph
        rankings (one more batched graph run); each passage's ``why`` names the subgraph facts
        it supports."""
        ecfg, r = cfg.expand, self.retriever
        deep = max(depth, cfg.fusion_depth)
        base = r.rank_run(run, deep, gcfg.graph)
        paths = [self._paths(st, ecfg.path_queries) if ecfg.path_weight > 0 else [] for st in states]
        queries = [(q, f"{st.question} {fact_text(*f.triple)}")
                   for q, (st, fs) in enumerate(zip(states, paths, strict=True)) for f in fs]
        extra: list[list[Ranked]] = [[] for _ in states]
        if queries:  # the path fact is in the query: no LLM fact filter for these
            pcfg = replace(gcfg, graph=replace(gcfg.graph, fact_filter=False))
            prun = r.graph_run([text for _, text in queries], pcfg)
            for (q, _), ranked in zip(queries, r.rank_run(prun, deep, pcfg.graph), strict=True):
                extra[q].append(ranked)
        out: list[Ranked] = []
        for q, st in enumerate(states):
            st.path_queries = [text for i, text in queries if i == q]
            supports: dict[int, list[list[str]]] = {}
            for f in st.facts.values():
                for pid in f.passage_ids:
                    supports.setdefault(pid, []).append(list(f.triple))
            fused: dict[int, float] = {}
            ranks: dict[int, dict[str, int]] = {}
            lists = [("question", 1.0, base[q])] + [
                (f"path {i}", ecfg.path_weight / len(extra[q]), ranked)
                for i, ranked in enumerate(extra[q], start=1)]
            for name, weight, ranked in lists:
                for rank, (pid, _, _) in enumerate(ranked, start=1):
                    fused[pid] = fused.get(pid, 0.0) + weight / (cfg.rrf_k + rank)
                    ranks.setdefault(pid, {})[name] = rank
            best = sorted(fused.items(), key=lambda kv: (-kv[1], kv[0]))[:depth]
            note = {"fallback": base[q][0][2]["fallback"]} if base[q] and "fallback" in base[q][0][2] else {}
            out.append([(pid, s, {"mode": "expand", "rrf": round(s, 8), "ranks": ranks[pid], **note,
                                  "supports": supports.get(pid, [])}) for pid, s in best])
        return out

    # ------------------------------------------------------------------ persisting
    def _persist(self, expansions: list[Expansion]) -> None:
        """Write verified new facts (proposed, not stored yet) with their supporting passages as
        provenance; each expansion records how many of its facts were written."""
        new: dict[Key, tuple[int, SubgraphFact]] = {}
        for q, e in enumerate(expansions):
            for f in e.facts:
                if f.verified and f.fact_id is None and f.passage_ids and f.triple not in new:
                    new[f.triple] = (q, f)
        if not new:
            return
        model = self.client.model if self.client is not None else "none"
        r = self.retriever
        done = r.fact_writer([(f.subject, f.relation, f.object, tuple(f.passage_ids))
                              for _, f in new.values()], f"expand:{model}")
        for q, e in enumerate(expansions):
            e.persisted = sum(1 for key, (first, _) in new.items() if first == q and key in done.written)
            e.facts = [replace(f, fact_id=done.fact_ids[f.triple], subject_id=done.entity_ids[f.subject],
                               object_id=done.entity_ids[f.object])
                       if f.triple in done.fact_ids else f for f in e.facts]
