"""The DuckDB schema of an index, and its version.

Ids are dense integers handed out by per-kind counters kept in ``meta`` and never reused, so an id
names one passage / entity / fact (and one vector) for the life of the index. Uniqueness is kept by
the writer (DuckDB indexes make delete-then-reinsert inside one transaction fragile).
"""

from __future__ import annotations

SCHEMA_VERSION = 1

ID_KINDS = ("document", "passage", "entity", "fact")
VECTOR_KINDS = ("passage", "entity", "fact")


def ddl(dimension: int) -> list[str]:
    """CREATE statements for a new index whose vectors have ``dimension`` floats."""
    d = int(dimension)
    return [
        "CREATE TABLE meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL)",
        """CREATE TABLE documents (
            id BIGINT NOT NULL, key VARCHAR NOT NULL, title VARCHAR NOT NULL,
            content_hash VARCHAR NOT NULL, metadata JSON, added_at TIMESTAMP NOT NULL)""",
        """CREATE TABLE passages (
            id BIGINT NOT NULL, doc_id BIGINT NOT NULL, ordinal INTEGER NOT NULL,
            title VARCHAR NOT NULL, text VARCHAR NOT NULL,
            start_char INTEGER NOT NULL, end_char INTEGER NOT NULL, text_hash VARCHAR NOT NULL)""",
        """CREATE TABLE entities (
            id BIGINT NOT NULL, name VARCHAR NOT NULL, label VARCHAR,
            surface_forms VARCHAR[] NOT NULL,
            synonym_degree INTEGER NOT NULL DEFAULT 0)""",  # entities with cosine >= threshold
        # one row per (passage, entity, surface form): provenance of mention edges and surface forms
        """CREATE TABLE mentions (
            passage_id BIGINT NOT NULL, entity_id BIGINT NOT NULL, surface VARCHAR NOT NULL,
            label VARCHAR)""",
        # kind: 'triple' (embedded, retrievable) or 'cooccurrence' (graph link only)
        """CREATE TABLE facts (
            id BIGINT NOT NULL, subject_id BIGINT NOT NULL, relation VARCHAR NOT NULL,
            object_id BIGINT NOT NULL, kind VARCHAR NOT NULL)""",
        """CREATE TABLE fact_sources (
            fact_id BIGINT NOT NULL, passage_id BIGINT NOT NULL, extractor VARCHAR NOT NULL)""",
        # undirected edges are stored once with src < dst (fact, synonym); mention: passage -> entity.
        # A write call appends fact-edge counts as partial rows of one pair and folds them into
        # one row when it ends, so readers that may run during a write sum weights per pair
        """CREATE TABLE edges (
            type VARCHAR NOT NULL, src BIGINT NOT NULL, dst BIGINT NOT NULL, weight DOUBLE NOT NULL)""",
        f"CREATE TABLE passage_vectors (id BIGINT NOT NULL, vec FLOAT[{d}] NOT NULL)",
        f"CREATE TABLE entity_vectors (id BIGINT NOT NULL, vec FLOAT[{d}] NOT NULL)",
        f"CREATE TABLE fact_vectors (id BIGINT NOT NULL, vec FLOAT[{d}] NOT NULL)",
        turn_vectors_ddl(d),
        SURFACE_COUNTS_DDL,
        """CREATE TABLE llm_cache (
            model VARCHAR NOT NULL, prompt_version VARCHAR NOT NULL, passage_hash VARCHAR NOT NULL,
            step VARCHAR NOT NULL, response VARCHAR NOT NULL, created_at TIMESTAMP NOT NULL)""",
    ]


def turn_vectors_ddl(dimension: int) -> str:
    """The table of conversation turn embeddings: one row per turn of a memory unit (``passage_id``,
    the unit; ``turn``, the turn's position in its session document's ``metadata.turns``), embedded
    as ``Speaker: text``. Added to version-1 indexes written before it on their first writable
    open (``IF NOT EXISTS``); their turns are embedded at query time until re-indexed."""
    return (f"CREATE TABLE IF NOT EXISTS turn_vectors (passage_id BIGINT NOT NULL, turn INTEGER NOT NULL, "
            f"vec FLOAT[{int(dimension)}] NOT NULL)")


# derived from ``mentions`` (their count per entity, surface form and label), kept by the writer
# in step with it so that a batch recomputes the forms and labels of the entities it mentions
# from its own deltas, not by re-reading every mention of them; added to indexes written before
# it on their first writable open (see ``surface_counts_backfill``)
SURFACE_COUNTS_DDL = """CREATE TABLE IF NOT EXISTS surface_counts (
    entity_id BIGINT NOT NULL, surface VARCHAR NOT NULL, label VARCHAR, cnt BIGINT NOT NULL)"""


def surface_counts_backfill() -> str:
    """Fill an empty ``surface_counts`` from ``mentions`` (an index written before the table)."""
    return ("INSERT INTO surface_counts SELECT entity_id, surface, label, count(*) FROM mentions "
            "GROUP BY ALL")


# point lookups by id on the query path (a hit's passage and document, a seed fact): ART indexes,
# so their cost does not grow with the index (no uniqueness constraint: the writer keeps ids unique)
LOOKUP_INDEXES = ("documents", "passages", "entities", "facts")


def index_ddl() -> list[str]:
    """CREATE INDEX statements (idempotent; also run on opening an index written without them)."""
    return [f"CREATE INDEX IF NOT EXISTS {table}_id_idx ON {table} (id)" for table in LOOKUP_INDEXES]
