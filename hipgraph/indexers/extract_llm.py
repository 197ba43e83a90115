"""OpenIE with an LLM, after HippoRAG: named entities first, then triples conditioned on them.

Both steps go to an OpenAI-compatible chat endpoint in JSON mode, all uncached passages of a call
at once (bounded concurrency in :class:`~hipgraph.models.chat.ChatClient`). Raw replies that
parse are cached under ``(model, prompt_version, passage_hash, step)``; malformed ones never are.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from hipgraph.config import ExtractorConfig
from hipgraph.errors import ConfigError, ExtractionError, LLMError
from hipgraph.indexers.extract_base import ResponseCache
from hipgraph.models.chat import ChatClient, ChatResult, excerpt
from hipgraph.prompts import Prompt, load_prompt
from hipgraph.text.json_reply import parse_json_reply
from hipgraph.types import Chunk, Extraction, Triple

logger = logging.getLogger(__name__)

T = TypeVar("T")
CacheKey = tuple[str, str, str, str]

_ENTITY_KEYS = ("named_entities", "entities", "named entities", "namedEntities")
_TRIPLE_KEYS = ("triples", "relations", "facts")
_RELATION_KEYS = ("relation", "predicate", "relationship")

# --------------------------------------------------------------------------------------------
# Validation of the parsed replies
# --------------------------------------------------------------------------------------------


def _unwrap(value: Any, keys: Sequence[str]) -> list[Any] | None:
    """The list under one of ``keys`` (or a lone list-valued key, or a bare top-level list)."""
    if isinstance(value, list):
        return value
    if not isinstance(value, dict):
        return None
    for key in keys:
        if isinstance(value.get(key), list):
            return value[key]
    lists = [v for v in value.values() if isinstance(v, list)]
    return lists[0] if len(value) == 1 and len(lists) == 1 else None


def _clean_name(item: Any) -> str | None:
    """A stripped, whitespace-collapsed non-empty string; numbers are taken as their text."""
    if isinstance(item, (int, float)) and not isinstance(item, bool):
        item = str(item)
    if not isinstance(item, str):
        return None
    name = " ".join(item.split())
    return name or None


def _dedupe(items: Iterable[T]) -> list[T]:
    return list(dict.fromkeys(items))


def parse_entities(value: Any) -> list[str]:
    """Entity names from a parsed NER reply; raise ``ValueError`` if it has no entity list."""
    items = _unwrap(value, _ENTITY_KEYS)
    if items is None:
        raise ValueError('expected {"named_entities": [...]}')
    names = []
    for item in items:
        name = _clean_name(item)
        if name is None:
            logger.debug("dropping malformed entity %r", item)
            continue
        names.append(name)
    return _dedupe(names)


def parse_triples(value: Any) -> list[Triple]:
    """Triples from a parsed reply; malformed items are dropped, a wrong shape raises ValueError."""
    items = _unwrap(value, _TRIPLE_KEYS)
    if items is None:
        raise ValueError('expected {"triples": [[subject, relation, object], ...]}')
    triples = []
    for item in items:
        if isinstance(item, dict):
            relation = next((item[k] for k in _RELATION_KEYS if k in item), None)
            parts: list[Any] = [item.get("subject"), relation, item.get("object")]
        elif isinstance(item, (list, tuple)) and len(item) == 3:
            parts = list(item)
        else:
            logger.debug("dropping malformed triple %r", item)
            continue
        cleaned = [_clean_name(p) for p in parts]
        if any(c is None for c in cleaned):
            logger.debug("dropping malformed triple %r", item)
            continue
        triples.append(Triple(*cleaned))  # type: ignore[arg-type]
    return _dedupe(triples)


# --------------------------------------------------------------------------------------------
# The extractor
# --------------------------------------------------------------------------------------------


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _where(chunk: Chunk) -> str:
    return f"passage {chunk.doc_id!r}#{chunk.ordinal}"


class LLMExtractor:
    """HippoRAG-style OpenIE over an OpenAI-compatible chat endpoint (``extractor.name="llm"``).

    ``cache`` (e.g. the index's ``llm_cache`` table) makes re-extraction free; ``client``
    overrides the :class:`ChatClient` built from ``config.chat`` (which this object then owns).
    """

    def __init__(
        self,
        config: ExtractorConfig,
        cache: ResponseCache | None = None,
        client: ChatClient | None = None,
    ) -> None:
        if client is None:
            if config.chat is None:
                raise ConfigError("extractor.chat is required for the llm extractor")
            client = ChatClient(config.chat)
            self._owns_client = True
        else:
            self._owns_client = False
        self.config = config
        self.client = client
        self.cache = cache
        self.model = client.config.model
        self.name = f"llm:{self.model}"
        self.ner_prompt: Prompt = load_prompt("ner")
        self.triples_prompt: Prompt = load_prompt("triples")

    def extract(self, chunks: Sequence[Chunk]) -> list[Extraction]:
        """One :class:`Extraction` per chunk, in order. Raises ``ExtractionError`` on failure."""
        chunks = list(chunks)
        if not chunks:
            return []
        hashes = [_sha256(f"{c.title}\n{c.text}") for c in chunks]
        passages = [f"{c.title}\n{c.text}" if c.title else c.text for c in chunks]

        ner_keys = [(self.model, self.ner_prompt.version, h, "ner") for h in hashes]
        ner_requests = {
            key: (chunk, lambda p=passage: self.ner_prompt.render(passage=p))
            for key, chunk, passage in zip(ner_keys, chunks, passages, strict=True)
        }
        entities = self._resolve("ner", ner_requests, parse_entities)

        triple_keys: list[CacheKey | None] = []
        triple_requests: dict[CacheKey, tuple[Chunk, Callable[[], list[dict[str, str]]]]] = {}
        for key, chunk, passage, h in zip(ner_keys, chunks, passages, hashes, strict=True):
            names = entities[key]
            if not names:  # nothing to anchor triples on
                triple_keys.append(None)
                continue
            step = "triples:" + _sha256(json.dumps(sorted(names), ensure_ascii=False))
            tkey = (self.model, self.triples_prompt.version, h, step)
            triple_keys.append(tkey)
            if tkey not in triple_requests:
                named = json.dumps({"named_entities": names}, ensure_ascii=False)
                triple_requests[tkey] = (
                    chunk,
                    lambda p=passage, e=named: self.triples_prompt.render(passage=p, entities=e),
                )
        triples = self._resolve("triples", triple_requests, parse_triples) if triple_requests else {}

        out = []
        for key, tkey in zip(ner_keys, triple_keys, strict=True):
            facts = triples[tkey] if tkey is not None else []
            names = _dedupe([*entities[key], *(n for t in facts for n in (t.subject, t.object))])
            out.append(Extraction(entities=tuple(names), triples=tuple(facts)))
        return out

    def _resolve(
        self,
        step: str,
        requests: dict[CacheKey, tuple[Chunk, Callable[[], list[dict[str, str]]]]],
        parse: Callable[[Any], T],
    ) -> dict[CacheKey, T]:
        """Parsed replies for every key: from the cache, else from the LLM (then cached)."""
        results: dict[CacheKey, T] = {}
        cached = self.cache.get_many(list(requests)) if self.cache is not None else {}
        for key, raw in cached.items():
            try:
                results[key] = parse(parse_json_reply(raw))
            except ValueError:
                logger.warning("%s: ignoring an unparseable cached reply for %s",
                               step, _where(requests[key][0]))
        pending = [key for key in requests if key not in results]
        logger.debug("llm %s: %d cached, %d to request", step, len(results), len(pending))
        if not pending:
            return results

        replies = self.client.complete_many(
            [requests[key][1]() for key in pending], json_mode=True, return_exceptions=True
        )
        good: list[tuple[CacheKey, str]] = []
        failures: list[tuple[str, BaseException]] = []
        for key, reply in zip(pending, replies, strict=True):
            chunk = requests[key][0]
            if isinstance(reply, LLMError):
                failures.append((f"{step} request for {_where(chunk)} failed: {reply}", reply))
                continue
            text = reply.text if isinstance(reply, ChatResult) else str(reply)
            try:
                results[key] = parse(parse_json_reply(text))
            except ValueError as exc:
                failures.append((
                    f"unparseable {step} reply for {_where(chunk)} ({exc}): "
                    f"{excerpt(text, 200) or '<empty>'}",
                    exc,
                ))
                continue
            good.append((key, text))
        if good and self.cache is not None:
            self.cache.put_many(good)
        if failures:
            message, cause = failures[0]
            if len(failures) > 1:
                message += f" (and {len(failures) - 1} more {step} failure(s) in this batch)"
            raise ExtractionError(message) from cause
        return results

    def close(self) -> None:
        if self._owns_client:
            self.client.close()

    def __enter__(self) -> LLMExtractor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
