"""The text a fact stands for: what fact vectors embed and what queries match facts against."""

from __future__ import annotations


def fact_text(subject: str, relation: str, obj: str) -> str:
    """``subject relation object`` as one string (the text embedded as the fact's vector)."""
    return f"{subject} {relation} {obj}"
