"""Typed exceptions raised across hipgraph's public boundaries."""

from __future__ import annotations


class HipgraphError(Exception):
    """Base class of every error hipgraph raises on purpose."""


class ConfigError(HipgraphError, ValueError):
    """A configuration value is out of range or of the wrong kind."""


class SessionConfigError(ConfigError):
    """An index needs an endpoint, API key variable or file that only the session may supply
    (an index folder never does); the message says which argument or CLI flag gives it."""


class BackendUnavailableError(HipgraphError, ImportError):
    """A named backend is unknown or its optional dependency is not installed."""


class StoreError(HipgraphError):
    """The index folder or its database cannot be used."""


class SchemaVersionError(StoreError):
    """The index was written by another schema version."""


class IndexLockedError(StoreError):
    """Another process holds the index open for writing."""


class IndexNotFoundError(StoreError, FileNotFoundError):
    """The index folder does not exist and ``create`` was not requested."""


class InputError(HipgraphError, ValueError):
    """Input records are malformed; the message names the file, line or field."""

    def __init__(self, message: str, *, source: str | None = None, line: int | None = None):
        where = ""
        if source is not None:
            where = f"{source}:{line}: " if line is not None else f"{source}: "
        super().__init__(where + message)
        self.source = source
        self.line = line


class ExtractionError(HipgraphError):
    """An extractor could not produce entities/facts for a passage."""


class LLMError(HipgraphError):
    """An OpenAI-compatible endpoint failed or returned something unusable."""


class EmbeddingError(HipgraphError):
    """An embedding backend failed."""


class GenerationError(HipgraphError):
    """A generator failed or replied with something that is not a well-formed answer."""
