"""Normalization of entity names and relation phrases (the keys entities and facts merge on)."""

from __future__ import annotations

import functools
import re
import unicodedata

_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2013": "-", "\u2014": "-"})
_LEADING_ARTICLE = re.compile(r"^(?:the|a|an)\s+")
_POSSESSIVE = re.compile(r"(?:'s|')$")
_EDGE_PUNCT = re.compile(r"^[\W_]+|[\W_]+$")
_SPACES = re.compile(r"\s+")
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([,.;:!?)\]])")
# names and relation phrases recur across passages; a bounded cache skips their six regex passes
_cached = functools.lru_cache(maxsize=1 << 16)


@_cached
def normalize_entity(text: str) -> str:
    """Lower-cased, NFKC, quotes unified, leading article and possessive dropped, edges trimmed.

    >>> normalize_entity("  The Beatles' ")
    'beatles'
    """
    text = unicodedata.normalize("NFKC", text).translate(_QUOTES).lower()
    text = _SPACES.sub(" ", text).strip()
    text = _SPACE_BEFORE_PUNCT.sub(r"\1", text)
    text = _EDGE_PUNCT.sub("", text)
    text = _LEADING_ARTICLE.sub("", text)
    text = _POSSESSIVE.sub("", text)
    return _EDGE_PUNCT.sub("", text).strip()


@_cached
def normalize_relation(text: str) -> str:
    """Lower-cased relation phrase with single spaces and no edge punctuation."""
    text = unicodedata.normalize("NFKC", text).translate(_QUOTES).lower()
    text = _SPACES.sub(" ", text).strip()
    return _EDGE_PUNCT.sub("", text).strip()


@_cached
def clean_surface(text: str) -> str:
    """A surface form as shown to users: NFKC, single spaces, edge punctuation trimmed."""
    text = unicodedata.normalize("NFKC", text).translate(_QUOTES)
    text = _SPACES.sub(" ", text).strip()
    text = _SPACE_BEFORE_PUNCT.sub(r"\1", text)
    return text.strip(" ,;:!?\"'()[]{}")
