"""The search: seeds, frontier, candidates (stored facts, fact search, the model's proposals),
their check against passages, admission within the budget, and the fused passage ranking."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from hipgraph.config import RetrievalConfig
from hipgraph.query.dense import dense_rankings
from hipgraph.query.expand import llm
from hipgraph.query.expand.results import (
    GRAPH,
    LLM,
    RETRIEVAL,
    Expansion,
    Key,
    SubgraphEntity,
    SubgraphFact,
    verified_new_facts,
)
from hipgraph.query.expand.state import (
    Candidate,
    QuestionState,
    Run,
    SubEntity,
    Verdict,
    triple,
)
from hipgraph.query.graph import top_passages
from hipgraph.query.hits import Ranked
from hipgraph.store.reads import fact_ids_by_key, fact_relations, fact_source_passages
from hipgraph.text.facts import fact_text
from hipgraph.text.normalize import clean_surface, normalize_entity, normalize_relation

if TYPE_CHECKING:
    from hipgraph.models.base import Embedder
    from hipgraph.models.chat import ChatClient
    from hipgraph.query.graph_search import GraphRun, GraphSearch
    from hipgraph.store.database import GraphStore
    from hipgraph.store.vector_set import VectorSet

HUB_FACTS = 1000  # a frontier entity in more stored facts than this is too generic to expand
POOL_PASSAGES = 200  # passages of one entity checked for mentions of a proposed fact's other end
_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2013": "-", "\u2014": "-"})
_SPACES = re.compile(r"\s+")


class Expander:
    """Query-time KG expansion over graph mode's search (``graph``), reading the index through
    ``store`` (reads only), ``vectors`` and ``embedder``; ``client`` (optional) is the chat client
    that proposes and verifies facts. Holds no per-call state: one instance may serve many
    threads at once."""

    def __init__(self, graph: GraphSearch, embedder: Embedder, vectors: VectorSet, store: GraphStore,
                 client: ChatClient | None):
        self.graph = graph
        self.embedder = embedder
        self.vectors = vectors
        self.store = store
        self.client = client

    def run(self, questions: Sequence[str], depth: int, cfg: RetrievalConfig) -> list[Expansion]:
        """Each question's expansion with its best ``depth`` passages. Writes nothing: the
        verified new facts are in :attr:`Expansion.new_facts` for the indexer to persist."""
        questions = list(questions)
        if not questions:
            return []
        ecfg = cfg.expand
        gcfg = replace(cfg, graph=replace(cfg.graph, explain=False))
        graph_run = self.graph.graph_run(questions, gcfg)
        run = Run(self.graph, self.embedder, self.vectors, self.store, self.client, cfg,
                  graph_run.snapshot, self.graph.entity_names(), graph_run.qvec,
                  [QuestionState(q) for q in questions])
        if run.can_propose:
            run.aug = llm.asked_relations(run)
        for q, st in enumerate(run.states):
            for idx in list(graph_run.seeds[q].linked)[: ecfg.max_entities]:
                st.entities[idx] = SubEntity(run.name(idx), idx, 1.0, 0, "question")
        # passages retrieved for each question (graph mode's PPR, else dense): support candidates
        run.retrieved = _first_passages(run, graph_run, ecfg.support_passages)
        for it in range(ecfg.max_iterations):
            frontier = [_frontier(st, ecfg.frontier_size) for st in run.states]
            if it > 0 and not any(frontier) and not run.can_propose:
                break
            _iterate(run, frontier, it)
        rankings = _rank(run, graph_run, depth, gcfg)
        out = []
        for st, ranking in zip(run.states, rankings, strict=True):
            entities = [SubgraphEntity(e.name, run.entity_id(e.idx), e.relevance, e.hop, e.via)
                        for e in st.entities.values()]
            facts = list(st.facts.values())
            out.append(Expansion(st.question, facts, entities, ranking, trace=st.trace,
                                 path_queries=st.path_queries, asked_relations=st.relations,
                                 new_facts=verified_new_facts(facts)))
        return out


def _norm_text(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).translate(_QUOTES).lower()
    return _SPACES.sub(" ", text)


def _mentions(name: str, text: str) -> bool:
    """Whether normalised ``name`` occurs in normalised ``text`` as whole words."""
    return bool(name) and re.search(rf"(?<!\w){re.escape(name)}(?!\w)", text) is not None


def _first_passages(run: Run, graph_run: GraphRun, n: int) -> list[list[int]]:
    """Each question's best ``n`` passage ids before expansion."""
    snap = run.snap
    out: list[list[int]] = []
    dense = None
    for q in range(len(graph_run.seeds)):
        if q in graph_run.rows:
            row = graph_run.scores[graph_run.rows[q], : snap.n_passages]
            out.append([int(snap.passage_ids[node]) for node, _ in top_passages(row, n)])
        else:
            if dense is None:
                dense = dense_rankings(run.vectors, graph_run.qvec, n)
            out.append([pid for pid, _, _ in dense[q]])
    return out


def _frontier(st: QuestionState, size: int) -> list[int]:
    """The next ``size`` stored entities to expand (nearest hop, most relevant first)."""
    todo = [e for e in st.entities.values() if not e.expanded and e.idx >= 0]
    todo.sort(key=lambda e: (e.hop, -e.relevance, e.idx))
    chosen = todo[:size]
    for e in chosen:
        e.expanded = True
    return [e.idx for e in chosen]


# ---------------------------------------------------------------------- one iteration
def _iterate(run: Run, frontier: list[list[int]], it: int) -> None:
    snap, ecfg = run.snap, run.ecfg
    traces = [{"iteration": it, "frontier": [run.name(i) for i in f], "candidates": 0,
               "below_relevance": 0, "added": [], "entities_added": [], "dropped": []}
              for f in frontier]
    per_q: list[list[Candidate]] = [[] for _ in run.states]
    # stored facts: those of the frontier entities, and (first iteration) a fact search
    if it == 0 and ecfg.retrieval_facts and snap.fact_ids.size:
        scores, ids = run.vectors.search("fact", run.qvec, min(ecfg.retrieval_facts, snap.fact_ids.size))
        for q in range(len(run.states)):
            rows = snap.fact_index(ids[q])
            for row, s in zip(rows.tolist(), scores[q].tolist(), strict=True):
                if row >= 0:
                    per_q[q].append(_stored(run, row, RETRIEVAL, relevance=float(s)))
    indptr, frows = snap.entity_facts
    for q, f in enumerate(frontier):
        for idx in f:
            if indptr[idx + 1] - indptr[idx] > HUB_FACTS:
                traces[q].setdefault("hubs_skipped", []).append(run.name(idx))
                continue
            for row in frows[indptr[idx]: indptr[idx + 1]].tolist():
                per_q[q].append(_stored(run, int(row), GRAPH, via=idx))
    if run.can_propose:
        proposals = llm.propose(run, traces)
        if proposals:
            resolved = _resolve(run, [t for _, t in proposals])
            for (q, _), c in zip(proposals, resolved, strict=True):
                if c is not None:
                    c.relevance = run.relevance(c.vec, q)
                    per_q[q].append(c)
    _score(run, per_q)
    chosen = _select(run, per_q, traces)
    verdicts = _verify(run, chosen)
    for q, st in enumerate(run.states):
        _admit(run, st, verdicts[q], it, traces[q])
        st.trace.append(traces[q])


def _stored(run: Run, row: int, source: str, relevance: float | None = None,
            via: int | None = None) -> Candidate:
    snap = run.snap
    s, o = int(snap.fact_subject[row]), int(snap.fact_object[row])
    c = Candidate(run.name(s), "", run.name(o), s, o, int(snap.fact_ids[row]), source, row=row)
    c.relevance = relevance if relevance is not None else np.nan
    c.via = via
    return c


def _score(run: Run, per_q: list[list[Candidate]]) -> None:
    """Relations and vectors of stored candidates (one DuckDB read), cosine to the question."""
    ids = sorted({c.fact_id for cands in per_q for c in cands if c.fact_id is not None and c.vec is None})
    if not ids:
        return
    rel = fact_relations(run.store, ids)
    vid, vecs = run.store.read_vectors("fact", np.asarray(ids, np.int64))
    vec_of = {int(i): vecs[j] for j, i in enumerate(vid.tolist())}
    for q, cands in enumerate(per_q):
        for c in cands:
            if c.fact_id is None or c.vec is not None:
                continue
            c.relation = rel.get(c.fact_id, c.relation)
            c.vec = vec_of.get(c.fact_id)
            if c.vec is not None and np.isnan(c.relevance):
                c.relevance = run.relevance(c.vec, q)
            elif np.isnan(c.relevance):
                c.relevance = 0.0


def _select(run: Run, per_q: list[list[Candidate]], traces: list[dict[str, Any]]) -> list[list[Candidate]]:
    """Per question the candidates to check: new to the subgraph, relevant enough, at most
    ``facts_per_entity`` per frontier entity and ``retrieval_facts`` from the fact search."""
    ecfg = run.ecfg
    out: list[list[Candidate]] = []
    for st, cands, trace in zip(run.states, per_q, traces, strict=True):
        picked: dict[Key, Candidate] = {}
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


def _resolve(run: Run, triples: list[tuple[str, str, str]]) -> list[Candidate | None]:
    """Proposed triples as candidates: names linked to entities (exactly or by embedding),
    fact vectors, stored fact ids where the triple exists. One embedding call."""
    snap, names = run.snap, run.names
    rows = []
    for s, r, o in triples:
        ns, nr, no = normalize_entity(s), normalize_relation(r), normalize_entity(o)
        rows.append(None if not (ns and nr and no) or ns == no else (ns, nr, no, clean_surface(s), clean_surface(o)))
    ok = [x for x in rows if x is not None]
    if not ok:
        return [None] * len(rows)
    unlinked = sorted({n for ns, _, no, _, _ in ok for n in (ns, no) if names.by_name.get(n) is None})
    vecs = run.embedder.embed([fact_text(ns, nr, no) for ns, nr, no, _, _ in ok] + unlinked)
    fvec, nvec = vecs[: len(ok)], vecs[len(ok):]
    linked: dict[str, int] = {}
    if unlinked and snap.n_entities:
        scores, ids = run.vectors.search("entity", nvec, 1)
        idx = snap.entity_index(ids[:, 0])
        for n, s, e in zip(unlinked, scores[:, 0].tolist(), idx.tolist(), strict=True):
            if e >= 0 and s >= run.cfg.graph.link_threshold:
                linked[n] = int(e)

    def index_of(name: str) -> tuple[str, int]:
        eid = names.by_name.get(name)
        if eid is not None:
            i = int(snap.entity_index(np.array([eid]))[0])
            if i >= 0:
                return name, i
        if name in linked:
            return run.name(linked[name]), linked[name]
        return name, -1

    out: list[Candidate | None] = []
    j = 0
    for x in rows:
        if x is None:
            out.append(None)
            continue
        ns, nr, no, ss, so = x
        (ns, si), (no, oi) = index_of(ns), index_of(no)
        c = Candidate(ns, nr, no, si, oi, None, LLM, surfaces=(ss, so))
        c.vec = fvec[j]
        j += 1
        out.append(c if ns != no else None)
    known = [c for c in out if c is not None and c.s_idx >= 0 and c.o_idx >= 0]
    keys = [(int(snap.entity_ids[c.s_idx]), c.relation, int(snap.entity_ids[c.o_idx])) for c in known]
    found = fact_ids_by_key(run.store, keys)
    for c, key in zip(known, keys, strict=True):
        c.fact_id = found.get(key)
    return out


# ---------------------------------------------------------------------- refinement
def _verify(run: Run, chosen: list[list[Candidate]]) -> list[list[Verdict]]:
    """Per question each candidate's :data:`Verdict`: a stored fact checked against its source
    passages, a new one against passages mentioning both ends (then the model's verdict)."""
    snap, ecfg, store = run.snap, run.ecfg, run.store
    sources = fact_source_passages(store, {c.fact_id for cands in chosen for c in cands
                                           if c.fact_id is not None})
    # passages that may support each proposed new fact: those of its entities, the retrieved ones
    maybe: dict[int, list[int]] = {}
    for q, cands in enumerate(chosen):
        for c in cands:
            if c.fact_id is None:  # passages mentioning both ends, then one end, then retrieved
                ends = [snap.entity_passages(i) for i in (c.s_idx, c.o_idx) if i >= 0]
                both = np.intersect1d(*ends) if len(ends) == 2 else np.zeros(0, np.int64)
                one = min(ends, key=len)[:POOL_PASSAGES] if ends else np.zeros(0, np.int64)
                pool = [int(snap.passage_ids[n]) for n in np.concatenate([both, one]).tolist()]
                maybe[id(c)] = list(dict.fromkeys(pool + run.retrieved[q]))
    pids, texts = run.passage_texts({p for ps in maybe.values() for p in ps})
    norm = {p: _norm_text(t) for p, t in zip(pids, texts, strict=True)}
    want = {p for ps in sources.values() for p in ps} | set(norm)
    vid, pvecs = store.read_vectors("passage", np.asarray(sorted(want), np.int64))
    pvec = {int(i): pvecs[j] for j, i in enumerate(vid.tolist())}
    out: list[list[Verdict]] = []
    to_judge: list[tuple[int, int, Candidate, list[int]]] = []
    for q, cands in enumerate(chosen):
        res: list[Verdict] = []
        for c in cands:
            if c.fact_id is not None:
                support_ids = [p for p in sources.get(c.fact_id, []) if p in pvec]
                if not support_ids:
                    res.append((c, 0.0, (), "no source passage is stored"))
                    continue
            else:
                support_ids = _grounded(run, c, [p for p in maybe[id(c)] if p in norm], norm)
                if not support_ids:
                    res.append((c, 0.0, (), f"no passage mentions both {c.subject!r} and {c.object!r}"))
                    continue
            cos = np.array([float(c.vec @ pvec[p]) for p in support_ids]) if c.vec is not None \
                else np.zeros(len(support_ids))
            order = np.argsort(-cos, kind="stable")
            support_ids = [support_ids[i] for i in order]
            best = float(cos[order[0]])
            if best < ecfg.min_support:
                res.append((c, best, tuple(support_ids), f"support {best:.3f} < min_support {ecfg.min_support}"))
                continue
            if c.fact_id is None and run.client is not None and ecfg.llm_verify:
                to_judge.append((q, len(res), c, support_ids[: ecfg.read_passages]))
            res.append((c, best, tuple(support_ids), None))
        out.append(res)
    if to_judge:
        llm.judge(run, to_judge, out)
    return out


def _grounded(run: Run, c: Candidate, pids: list[int], norm: dict[int, str]) -> list[int]:
    """The passages among ``pids`` where both ends of ``c`` occur (a stored mention, or the
    name in the passage's normalised text)."""
    snap = run.snap
    nodes = snap.passage_nodes(np.asarray(pids, np.int64)).tolist()
    ends = []
    for idx, name, surface in ((c.s_idx, c.subject, c.surfaces[0]), (c.o_idx, c.object, c.surfaces[1])):
        mentioned = set(snap.entity_passages(idx).tolist()) if idx >= 0 else set()
        ends.append((mentioned, {name, normalize_entity(surface)} - {""}))
    return [p for p, node in zip(pids, nodes, strict=True)
            if all(node in mentioned or any(_mentions(n, norm[p]) for n in names)
                   for mentioned, names in ends)]


def _admit(run: Run, st: QuestionState, verdicts: list[Verdict], it: int, trace: dict[str, Any]) -> None:
    """Add verified candidates (best first) within the entity budget; record the dropped."""
    ecfg = run.ecfg
    verdicts = sorted(verdicts, key=lambda v: (v[3] is not None, -v[0].relevance))
    for c, support, pids, reason in verdicts:
        st.seen.add(c.key)
        if reason is None:
            new = [k for k in c.ends if k not in st.entities]
            if len(st.entities) + len(new) > ecfg.max_entities:
                reason = f"entity budget reached (max_entities={ecfg.max_entities})"
        if reason is not None:
            trace["dropped"].append({"fact": triple(c), "source": c.source, "reason": reason,
                                     "support": round(support, 6)})
            continue
        st.facts[c.key] = SubgraphFact(c.subject, c.relation, c.object, run.entity_id(c.s_idx),
                                       run.entity_id(c.o_idx), c.fact_id, c.source, support, pids,
                                       True, it, c.relevance)
        trace["added"].append({"fact": triple(c), "source": c.source, "support": round(support, 6),
                               "relevance": round(c.relevance, 6)})
        for k, idx, name in ((c.ends[0], c.s_idx, c.subject), (c.ends[1], c.o_idx, c.object)):
            if k in st.entities:
                e = st.entities[k]
                e.relevance = max(e.relevance, c.relevance)
                continue
            st.entities[k] = SubEntity(name, idx, max(c.relevance, 0.0), it, "fact" if idx >= 0 else LLM)
            trace["entities_added"].append(name)


# ---------------------------------------------------------------------- ranking
def _paths(st: QuestionState, n: int) -> list[SubgraphFact]:
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


def _rank(run: Run, graph_run: GraphRun, depth: int, gcfg: RetrievalConfig) -> list[Ranked]:
    """The question's graph ranking fused by reciprocal rank with its path queries' graph
    rankings (one more batched graph run); each passage's ``why`` names the subgraph facts
    it supports."""
    cfg, ecfg, graph = run.cfg, run.ecfg, run.graph
    deep = max(depth, cfg.fusion_depth)
    base = graph.rank_run(graph_run, deep, gcfg.graph)
    paths = [_paths(st, ecfg.path_queries) if ecfg.path_weight > 0 else [] for st in run.states]
    queries = [(q, f"{st.question} {fact_text(*f.triple)}")
               for q, (st, fs) in enumerate(zip(run.states, paths, strict=True)) for f in fs]
    extra: list[list[Ranked]] = [[] for _ in run.states]
    if queries:  # the path fact is in the query: no LLM fact filter for these
        pcfg = replace(gcfg, graph=replace(gcfg.graph, fact_filter=False))
        prun = graph.graph_run([text for _, text in queries], pcfg)
        for (q, _), ranked in zip(queries, graph.rank_run(prun, deep, pcfg.graph), strict=True):
            extra[q].append(ranked)
    out: list[Ranked] = []
    for q, st in enumerate(run.states):
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
