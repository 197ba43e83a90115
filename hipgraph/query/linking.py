"""Entity linking for questions: named-entity spans of the question → entity nodes.

Spans are spaCy named entities (numbers excluded) and runs of proper nouns. A span links to the
entity whose normalised name equals it; otherwise to its nearest entity name embedding when the
cosine reaches the configured threshold (the embedding lookup is done by the caller in one batch).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from hipgraph.store import reads
from hipgraph.store.database import GraphStore
from hipgraph.text.normalize import clean_surface, normalize_entity
from hipgraph.text.spacy_pipeline import load_pipeline

logger = logging.getLogger(__name__)

_SKIP_LABELS = frozenset({"CARDINAL", "ORDINAL", "PERCENT", "QUANTITY", "MONEY", "TIME"})


class QuestionSpans:
    """Finds entity-like spans in questions with a spaCy pipeline (loaded on first use)."""

    def __init__(self, spacy_model: str):
        self.spacy_model = spacy_model
        self._nlp = None
        self._lock = threading.Lock()  # one parse at a time: a spaCy pipeline is not shared safely

    def _load(self):
        # spans need entities and part-of-speech tags only: no parser, no lemmatizer
        self._nlp = load_pipeline(self.spacy_model, exclude=("lemmatizer", "parser"),
                                  purpose="question entity linking")
        return self._nlp

    def link(self, questions: Sequence[str], names: EntityNames | None,
             max_tokens: int = 16, parsed: Mapping[str, Any] | None = None,
             ) -> list[list[tuple[str, int | None]]]:
        """Per question: ``(span, entity id)`` pairs, ``None`` where no name matched exactly.

        Exact name matches of word n-grams that start with a capitalised word or a digit are
        taken longest first (so a title such as "Songs I Wrote with Amy" wins over "Amy");
        named entities and proper-noun runs not covered by them are returned too, unmatched
        ones with ``None`` for the caller's embedding lookup. ``parsed``: docs of questions
        parsed before (:meth:`parse`), used instead of parsing them again.
        """
        out: list[list[tuple[str, int | None]]] = []
        parsed = parsed or {}
        todo = [q for q in questions if q not in parsed]
        fresh = dict(zip(todo, self.parse(todo), strict=True)) if todo else {}
        for doc in (parsed[q] if q in parsed else fresh[q] for q in questions):
            candidates = self._candidate_spans(doc)
            taken: list[tuple[int, int, str, int | None]] = []
            used: set[int] = set()
            if names is not None:
                matches = []
                for i, tok in enumerate(doc):
                    if not (tok.text[:1].isupper() or tok.text[:1].isdigit()):
                        continue
                    if i == 0 and tok.pos_ not in {"PROPN", "NUM"}:
                        continue  # a capital at the start of the question says nothing
                    for j in range(min(len(doc), i + max_tokens), i, -1):
                        if j - i == 1 and tok.pos_ != "PROPN":
                            continue
                        if any(s <= i and j <= e and (s, e) != (i, j) for s, e, _ in candidates):
                            continue  # part of a longer name ("Kenji" in "Akinoshu Kenji")
                        eid = names.exact(doc[i:j].text)
                        if eid is not None:
                            matches.append((j - i, i, j, doc[i:j].text, eid))
                            break
                for _, i, j, text, eid in sorted(matches, key=lambda m: (-m[0], m[1])):
                    if used.isdisjoint(range(i, j)):
                        used.update(range(i, j))
                        taken.append((i, j, text, eid))
            for i, j, text in candidates:
                if used.isdisjoint(range(i, j)):
                    used.update(range(i, j))
                    taken.append((i, j, text, names.exact(text) if names is not None else None))
            seen: set[str] = set()
            pairs = []
            for _, _, text, eid in sorted(taken):
                key = normalize_entity(text)
                if key and key not in seen:
                    seen.add(key)
                    pairs.append((clean_surface(text), eid))
            out.append(pairs)
        return out

    def parse(self, questions: Sequence[str]) -> list[Any]:
        """The spaCy docs of ``questions``."""
        if not questions:
            return []
        with self._lock:
            nlp = self._nlp or self._load()
            # nlp() skips pipe()'s batching overhead (~0.6 ms) for the common single question
            return [nlp(questions[0])] if len(questions) == 1 else list(nlp.pipe(questions, batch_size=64))

    @staticmethod
    def _candidate_spans(doc) -> list[tuple[int, int, str]]:
        """Named entities (numbers excluded) and maximal runs of proper nouns."""
        found = [(e.start, e.end, e.text) for e in doc.ents if e.label_ not in _SKIP_LABELS]
        in_ent = {t for s, e, _ in found for t in range(s, e)}
        start = None
        for tok in [*doc, None]:
            if tok is not None and tok.pos_ == "PROPN" and tok.i not in in_ent:
                start = tok.i if start is None else start
                continue
            if start is not None:
                end = tok.i if tok is not None else len(doc)
                found.append((start, end, doc[start:end].text))
                start = None
        return found


class EntityNames:
    """Normalised entity name → entity id, read once per index generation."""

    def __init__(self, store: GraphStore | None, generation: int | None = None):
        if store is None:  # filled by :meth:`updated`
            self.generation = -1 if generation is None else generation
            self.by_name, self.by_id, self.label_by_id = {}, {}, {}
            return
        self.generation = store.generation if generation is None else generation
        ids, names, labels = reads.entity_columns(store)
        self.by_name = dict(zip(names, ids, strict=True))  # a repeated name: the later id wins
        self.by_id = dict(zip(ids, names, strict=True))
        self.label_by_id = dict(zip(ids, labels, strict=True))

    def updated(self, store: GraphStore, entity_ids: set[int], generation: int) -> EntityNames:
        """These names with the rows of ``entity_ids`` read again (added, removed or relabelled
        entities): equal to reading every entity, at the cost of the ids given."""
        out = EntityNames(None, generation)
        out.by_name, out.by_id, out.label_by_id = dict(self.by_name), dict(self.by_id), dict(self.label_by_id)
        ids, names, labels = reads.entity_columns_of(store, entity_ids)
        gone_names = set()
        for eid in set(entity_ids) - set(ids):
            name = out.by_id.pop(eid, None)
            out.label_by_id.pop(eid, None)
            if name is not None and out.by_name.get(name) == eid:
                del out.by_name[name]
                gone_names.add(name)
        for eid, name, label in zip(ids, names, labels, strict=True):
            out.by_id[eid] = name
            out.label_by_id[eid] = label
            if out.by_name.get(name, -1) < eid:
                out.by_name[name] = eid
        # a removed entity whose name another (older) entity also has: that one now wins
        out.by_name.update(reads.entity_ids_named(store, gone_names))
        return out

    def exact(self, span: str) -> int | None:
        return self.by_name.get(normalize_entity(span))
