"""Question decomposition into chained constraints (sub-questions with ``#k`` slots).

A :class:`Step` is one constraint: its text may hold ``#k`` slots that the bridge entity found by
step ``k`` (1-based) fills, as in MuSiQue's decompositions ("Who founded #1?").

:class:`RuleDecomposer` works offline over a spaCy dependency parse. Descriptions - nouns
modified by a relative or participial clause ("the country where X was born"), by an ``of``/``in``
phrase ("the composer of X") or by a possessor ("X's performer") - that contain an anchor (a
proper noun, a number, or a nested description) become steps, innermost first; each nested
description is replaced by its slot in the one around it. The question itself, with its
top-level descriptions replaced, is the last step unless nothing but question words would remain.
Coordinated descriptions ("the birthplace of X and of Y") become independent steps.

:class:`LLMDecomposer` asks a chat model through the ``decompose`` prompt (strict JSON).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from hipgraph.errors import ExtractionError
from hipgraph.text.spacy_pipeline import load_pipeline

logger = logging.getLogger(__name__)

SLOT = re.compile(r"#(\d+)")

# relational prepositions that make "the N <prep> X" describe something in terms of X
_DESCRIBING_PREPS = frozenset({"of", "in", "for", "by", "from", "with", "on", "at", "during"})
_CLAUSE_DEPS = frozenset({"relcl", "acl"})
# words that carry no constraint of their own (what is left of "Who was #1?")
_EMPTY_POS = frozenset({"PRON", "AUX", "DET", "PUNCT", "ADP", "PART", "SCONJ", "CCONJ", "SPACE"})
_WH = frozenset({"who", "whom", "whose", "what", "which", "when", "where", "why", "how"})


@dataclass(frozen=True)
class Step:
    """One constraint. ``text`` may contain ``#k`` slots; ``depends_on`` lists those ``k``."""

    text: str
    depends_on: tuple[int, ...] = ()
    head: str = ""  # the described noun ("country"), which types the bridge entity

    def fill(self, bridges: dict[int, str]) -> str:
        """``text`` with each ``#k`` replaced by ``bridges[k]`` (kept when unknown)."""
        return SLOT.sub(lambda m: bridges.get(int(m.group(1)), m.group(0)), self.text)


@dataclass(frozen=True)
class Decomposition:
    """The steps of one question, in execution order (a step depends only on earlier ones)."""

    question: str
    steps: tuple[Step, ...]
    source: str = "rules"  # rules | llm | single (no decomposition found)
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        return {"question": self.question, "source": self.source,
                "steps": [{"text": s.text, "depends_on": list(s.depends_on), "head": s.head}
                          for s in self.steps], "notes": list(self.notes)}


def validate_steps(steps: Sequence[Step], where: str) -> None:
    """Slots must point at earlier steps; ExtractionError naming ``where`` otherwise."""
    if not steps:
        raise ExtractionError(f"{where}: no steps")
    for i, step in enumerate(steps, start=1):
        if not step.text.strip():
            raise ExtractionError(f"{where}: step {i} is empty")
        for k in step.depends_on:
            if not 1 <= k < i:
                raise ExtractionError(f"{where}: step {i} refers to #{k}, not an earlier step")


class RuleDecomposer:
    """Offline decomposition over the spaCy parse (see module docstring)."""

    name = "rules"

    def __init__(self, spacy_model: str, max_steps: int = 4):
        self.spacy_model = spacy_model
        self.max_steps = max_steps
        self._nlp = None
        self._lock = threading.Lock()  # one parse at a time: a spaCy pipeline is not shared safely

    def _load(self):
        self._nlp = load_pipeline(self.spacy_model, exclude=("lemmatizer",),
                                  purpose="question decomposition")
        return self._nlp

    def decompose_many(self, questions: Sequence[str]) -> list[Decomposition]:
        with self._lock:
            nlp = self._nlp or self._load()
            docs = [nlp(questions[0])] if len(questions) == 1 else list(nlp.pipe(questions, batch_size=64))
        return [self.from_doc(q, doc) for q, doc in zip(questions, docs, strict=True)]

    def from_doc(self, question: str, doc) -> Decomposition:
        """The decomposition of one parsed question."""
        descs = _descriptions(doc)
        # containment tree: each description's parent is the smallest description around it
        parent: dict[int, int | None] = {}
        for d, (lo, hi, _) in descs.items():
            around = [(h2 - l2, e) for e, (l2, h2, _) in descs.items()
                      if e != d and l2 <= lo and hi <= h2 and (h2 - l2) > (hi - lo)]
            parent[d] = min(around)[1] if around else None
        children: dict[int | None, list[int]] = {}
        for d in sorted(descs, key=lambda d: descs[d][0]):
            children.setdefault(parent[d], []).append(d)

        steps: list[Step] = []
        number: dict[int, int] = {}  # description root token -> its step number

        def text_of(lo: int, hi: int, kids: list[int]) -> tuple[str, tuple[int, ...]]:
            parts, deps, i = [], [], lo
            for c in sorted(kids, key=lambda c: descs[c][0]):
                clo, chi, _ = descs[c]
                parts.append(doc[i:clo].text_with_ws)
                parts.append(f"#{number[c]}" + (doc[chi - 1].whitespace_ if chi > clo else " "))
                deps.append(number[c])
                i = chi
            parts.append(doc[i:hi].text)
            return "".join(parts).strip(), tuple(deps)

        def emit(d: int) -> None:
            for c in children.get(d, []):
                emit(c)
            lo, hi, head = descs[d]
            kids = children.get(d, [])
            if not kids and not _has_anchor(doc[lo:hi]):
                return  # "the reign of terror": no entity to start from
            kids = [c for c in kids if c in number]
            text, deps = text_of(lo, hi, kids)
            steps.append(Step(text=text, depends_on=deps, head=head))
            number[d] = len(steps)

        for d in children.get(None, []):
            emit(d)
        top = [d for d in children.get(None, []) if d in number]
        final, deps = text_of(0, len(doc), top)
        if len(top) == 1 and _is_empty(final, doc):
            # "Who was #2?": the one top-level description is the question itself
            steps.pop()
            del number[top[0]]
            final, deps = text_of(0, len(doc), [c for c in children.get(top[0], []) if c in number])
        if not steps:
            return Decomposition(question, (Step(question, (), _wh_head(doc)),), source="single")
        steps.append(Step(text=final, depends_on=deps, head=_wh_head(doc)))
        if len(steps) > self.max_steps:  # keep the innermost chain; the rest stays in the text
            return Decomposition(question, (Step(question, (), _wh_head(doc)),), source="single",
                                 notes=(f"{len(steps)} steps exceed max_steps={self.max_steps}",))
        validate_steps(steps, f"rule decomposition of {question!r}")
        return Decomposition(question, tuple(steps), source="rules")


def _descriptions(doc) -> dict[int, tuple[int, int, str]]:
    """Description root token index -> (start, end, head noun) of its span."""
    out: dict[int, tuple[int, int, str]] = {}
    for tok in doc:
        if tok.pos_ not in {"NOUN", "PROPN"} and not (tok.pos_ == "PRON" and tok.dep_ == "nsubj"):
            continue
        if tok.pos_ == "PROPN" and tok.ent_iob_ != "O":
            continue  # a name, not a description
        kinds = set()
        for child in tok.children:
            if child.dep_ in _CLAUSE_DEPS:
                kinds.add("clause")
            elif child.dep_ == "prep" and child.lower_ in _DESCRIBING_PREPS \
                    and any(g.dep_ == "pobj" for g in child.children):
                kinds.add("prep")
            elif child.dep_ == "poss" and child.pos_ not in {"PRON", "DET"}:
                kinds.add("poss")
        if not kinds or tok.pos_ == "PRON":
            continue
        lo = tok.left_edge.i
        # a coordinated description ("the father of X and the mother of Y") is its own step
        hi = max([tok.i + 1] + [c.right_edge.i + 1 for c in tok.children
                                if c.dep_ not in {"conj", "cc"} and not (c.i > tok.i and c.dep_ == "punct")])
        while hi > lo and doc[hi - 1].pos_ == "PUNCT":
            hi -= 1
        while lo < hi and doc[lo].pos_ in {"ADP", "PUNCT", "CCONJ"}:
            lo += 1
        if lo == 0 and hi >= len(doc) - 1:
            continue  # the whole question
        if any(t.lower_ in _WH and t.head.i == tok.i for t in doc[lo:hi]):
            continue  # "what amount of TEUs": the question's own focus, not a description
        out[tok.i] = (lo, hi, tok.lower_)
    return out


def _has_anchor(span) -> bool:
    return any(t.pos_ in {"PROPN", "NUM"} or t.ent_type_ or (t.text[:1].isupper() and t.i > 0)
               for t in span)


def _is_empty(text: str, doc) -> bool:
    """True when ``text`` holds nothing but question words, function words and slots."""
    words = [w for w in re.findall(r"#\d+|\w+", text.lower()) if not w.startswith("#")]
    pos = {t.lower_: t.pos_ for t in doc}
    return all(w in _WH or pos.get(w, "X") in _EMPTY_POS or w in {"is", "was", "are", "were"}
               for w in words)


def _wh_head(doc) -> str:
    """What the question asks for: the noun after a wh-determiner, else the wh-word."""
    for tok in doc:
        if tok.lower_ in _WH:
            if tok.dep_ == "det" and tok.head.pos_ in {"NOUN", "PROPN"}:
                return tok.head.lower_
            return tok.lower_
    return ""
