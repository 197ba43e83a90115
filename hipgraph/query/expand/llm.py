"""The model's part in expansion: the relations a question asks about, facts proposed from
passages, and the entailment verdict on each grounded proposal; strict reply parsers."""

from __future__ import annotations

import json
import logging

import numpy as np

from hipgraph.errors import LLMError
from hipgraph.prompts import load_prompt
from hipgraph.query.expand.state import Candidate, Run, Verdict, triple
from hipgraph.text.json_reply import parse_json_reply

logger = logging.getLogger(__name__)

MAX_RELATIONS = 4  # relations kept per question
KNOWN_FACTS = 20  # subgraph facts shown to the model with each proposal request


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


def asked_relations(run: Run) -> np.ndarray | None:
    """The relations each question asks about (``expand_relations`` prompt), stored on its state
    and embedded with the question; a candidate fact's relevance is then the better of its cosine
    to the question and to that expansion. None when the model gave nothing usable."""
    prompt = load_prompt("expand_relations")
    replies = run.client.complete_many([prompt.render(question=st.question) for st in run.states],
                                       json_mode=True, return_exceptions=True)
    for st, reply in zip(run.states, replies, strict=True):
        try:
            if isinstance(reply, LLMError):
                raise ValueError(f"request failed: {reply}")
            data = parse_json_reply(reply.text)
            rels = data.get("relations") if isinstance(data, dict) else None
            if not isinstance(rels, list) or not all(isinstance(r, str) and r.strip() for r in rels):
                raise ValueError('expected {"relations": ["...", ...]}')
            st.relations = [r.strip() for r in rels[:MAX_RELATIONS]]
        except ValueError as exc:
            logger.warning("expand: asked relations unusable for %r: %s", st.question, exc)
    if not any(st.relations for st in run.states):
        return None
    return run.embedder.embed([f"{st.question} {'; '.join(st.relations)}" for st in run.states])


def propose(run: Run, traces: list[dict]) -> list[tuple[int, tuple[str, str, str]]]:
    """Ask the model for facts per question (one batch) from passages it has not read yet: the
    last iteration's new facts' passages first, then the best retrieved. ``(question, triple)``
    pairs; failures and unusable replies are noted in the question's trace."""
    ecfg = run.ecfg
    prompt = load_prompt("expand_propose")
    reading = []
    for q, st in enumerate(run.states):
        recent = sorted((f for f in st.facts.values() if f.iteration == len(st.trace) - 1),
                        key=lambda f: -f.relevance)
        pool = [p for f in recent for p in f.passage_ids] + run.retrieved[q]
        reading.append([p for p in dict.fromkeys(pool) if p not in st.shown][: ecfg.read_passages])
        st.shown.update(reading[-1])
    texts = dict(zip(*run.passage_texts({p for ps in reading for p in ps}), strict=True))
    batch = []
    for q, st in enumerate(run.states):
        known = [list(f.triple) for f in sorted(st.facts.values(), key=lambda f: -f.relevance)][:KNOWN_FACTS]
        passages = "\n".join(f"[{i}] {texts[p]}" for i, p in enumerate(
            [p for p in reading[q] if p in texts], start=1))
        batch.append(prompt.render(question=st.question, max_facts=ecfg.max_proposals,
                                   facts=json.dumps({"facts": known}), passages=passages or "(none)"))
    replies = run.client.complete_many(batch, json_mode=True, return_exceptions=True)
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
    return proposals


def judge(run: Run, items: list[tuple[int, int, Candidate, list[int]]], out: list[list[Verdict]]) -> None:
    """The model's entailment verdict on each new fact ``(question, verdict index, candidate,
    best supporting passages)``, given those passages; updates ``out`` in place (a rejected or
    unjudged fact gets its drop reason, passages the model named move first)."""
    prompt = load_prompt("expand_verify")
    pids, texts = run.passage_texts({p for *_, ps in items for p in ps})
    text = dict(zip(pids, texts, strict=True))
    batch = [prompt.render(fact=json.dumps(triple(c)),
                           passages="\n".join(f"[{i}] {text[p]}" for i, p in enumerate(ps, start=1)))
             for _, _, c, ps in items]
    replies = run.client.complete_many(batch, json_mode=True, return_exceptions=True)
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
