"""Token-based chunking of documents into passages with character offsets."""

from __future__ import annotations

import re

from hipgraph.config import ChunkConfig
from hipgraph.text.limits import MAX_TOKEN_CHARS
from hipgraph.text.memory_units import SESSION_KIND
from hipgraph.types import Chunk, Document

# a run of word characters longer than MAX_TOKEN_CHARS counts as several tokens, so text
# without spaces (a 5 MB base64 blob, unspaced scripts) is still cut into bounded passages
_TOKEN = re.compile(rf"\w{{1,{MAX_TOKEN_CHARS}}}|[^\w\s]")
_SENTENCE_END = frozenset(".!?")


def chunk_document(doc: Document, config: ChunkConfig) -> list[Chunk]:
    """Cut ``doc.text`` into windows of at most ``max_tokens`` tokens overlapping by ``overlap``.

    A window that would end mid-sentence is pulled back to the last sentence end in its second
    half, so passages mostly hold whole sentences. Short documents give one chunk (the whole text).
    A conversation session's document is cut at its memory units (character spans in its metadata).
    """
    text = doc.text
    units = doc.metadata.get("units") if doc.metadata.get("kind") == SESSION_KIND else None
    if units:
        return [Chunk(doc.id, i, text[s:e], s, e, doc.title) for i, (s, e) in enumerate(units)]
    spans = [(m.start(), m.end()) for m in _TOKEN.finditer(text)]
    if len(spans) <= config.max_tokens:
        start, end = _strip_span(text, 0, len(text))
        return [Chunk(doc.id, 0, text[start:end], start, end, doc.title)]
    chunks: list[Chunk] = []
    first = 0
    while first < len(spans):
        last = min(first + config.max_tokens, len(spans))  # exclusive
        if last < len(spans):
            for cut in range(last - 1, first + config.max_tokens // 2, -1):
                if text[spans[cut][0]:spans[cut][1]] in _SENTENCE_END:
                    last = cut + 1
                    break
        start, end = _strip_span(text, spans[first][0], spans[last - 1][1])
        chunks.append(Chunk(doc.id, len(chunks), text[start:end], start, end, doc.title))
        if last >= len(spans):
            break
        first = max(last - config.overlap, first + 1)
    return chunks


def _strip_span(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end
