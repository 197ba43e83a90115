"""Shared fixtures: a tiny real corpus, one fp32 MiniLM embedder, index factories and a dump
of an index's content in an id-independent form (for "equals an index built from scratch")."""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import hipgraph  # noqa: E402
from hipgraph.config import EmbedderConfig, IndexConfig  # noqa: E402
from hipgraph.store.schema import VECTOR_KINDS  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SAMPLE_BUNDLE = REPO / "data" / "musique_sample.json"
SHARED_BUNDLE = REPO.parent / "shared" / "data" / "multihop" / "musique_train100.json"

# Documents written here so that a few tests do not depend on any data file: short, real-looking,
# with entities shared between documents (American Psychological Association, Carl Rogers, ...).
INLINE_DOCS: list[dict[str, Any]] = [
    {"id": "jpi", "title": "Journal of Psychotherapy Integration",
     "text": "The Journal of Psychotherapy Integration is a peer-reviewed academic journal published by "
             "the American Psychological Association on behalf of the Society for the Exploration of "
             "Psychotherapy Integration. It was established in 1991 and covers research in psychotherapy."},
    {"id": "fsh", "title": "Families, Systems and Health",
     "text": "Families, Systems and Health is a quarterly peer-reviewed academic journal published by the "
             "American Psychological Association. It covers research on families and health care."},
    {"id": "apa", "title": "American Psychological Association",
     "text": "The American Psychological Association is the largest scientific and professional "
             "organization of psychologists in the United States. G. Stanley Hall was its first president. "
             "Its headquarters are in Washington, D.C."},
    {"id": "pct", "title": "Person-centered therapy",
     "text": "Person-centered therapy is a form of psychotherapy developed by psychologist Carl Rogers "
             "beginning in the 1940s. Carl Rogers taught at the University of Chicago."},
    {"id": "rogers", "title": "Carl Rogers",
     "text": "Carl Rogers was an American psychologist and among the founders of the humanistic approach "
             "to psychology. He was born in Oak Park, Illinois."},
    {"id": "jmp", "title": "Journal of Mathematical Physics",
     "text": "The Journal of Mathematical Physics is a peer-reviewed journal published monthly by the "
             "American Institute of Physics. The current editor is Jan Philip Solovej from University of "
             "Copenhagen."},
    {"id": "np", "title": "Nature Physics",
     "text": "Nature Physics is a monthly scientific journal published by the Nature Publishing Group. "
             "It was first published in October 2005. The Chief Editor is Andrea Taroni."},
    {"id": "copenhagen", "title": "University of Copenhagen",
     "text": "The University of Copenhagen is a public research university in Copenhagen, Denmark. "
             "Niels Bohr studied at the University of Copenhagen."},
    {"id": "bohr", "title": "Niels Bohr",
     "text": "Niels Bohr was a Danish physicist who received the Nobel Prize in Physics in 1922. "
             "He founded the Niels Bohr Institute in Copenhagen."},
    {"id": "publix", "title": "Publix",
     "text": "Publix Super Markets is an employee-owned supermarket chain headquartered in Lakeland, "
             "Florida. Publix operates stores in Florida, Georgia and Tennessee."},
    {"id": "tennessee", "title": "Tennessee",
     "text": "Tennessee is a state in the southeastern United States. Nashville is the capital of "
             "Tennessee, and Memphis is its largest city on the Mississippi River."},
    {"id": "snow", "title": "Hank Snow",
     "text": "Hank Snow was a Canadian country music artist. He lived in Nashville, Tennessee, where he "
             "died in 1999. Hank Snow recorded Hello Love in 1974."},
]


def _load_bundle_docs() -> list[dict[str, Any]] | None:
    for path in (SAMPLE_BUNDLE, SHARED_BUNDLE):
        if path.is_file():
            data = json.loads(path.read_text(encoding="utf-8"))
            return [{"id": f"m{c['idx']}", "title": c["title"], "text": c["text"]} for c in data["corpus"]]
    return None


@pytest.fixture(scope="session")
def sample_docs() -> list[dict[str, Any]]:
    """The first 40 documents of the repo's MuSiQue sample (data/musique_sample.json)."""
    docs = _load_bundle_docs()
    if docs is None:
        pytest.skip(f"sample corpus missing: neither {SAMPLE_BUNDLE} nor {SHARED_BUNDLE} exists")
    return docs[:40]


@pytest.fixture(scope="session")
def inline_docs() -> list[dict[str, Any]]:
    return [dict(d) for d in INLINE_DOCS]


# ------------------------------------------------------------------ backends and indexes
def index_config(**changes: Any) -> IndexConfig:
    """The test config: fp32 MiniLM (bf16 rounding differs between batchings)."""
    base = IndexConfig(embedder=EmbedderConfig(precision="fp32"))
    return base.replace(**changes) if changes else base


@pytest.fixture(scope="session")
def embedder():
    from hipgraph.models.embedders import MiniLMEmbedder

    return MiniLMEmbedder(EmbedderConfig(precision="fp32"))


def build_template(tmp_path_factory, embedder, name: str, docs: list[dict[str, Any]]) -> Path:
    """Build an index of ``docs`` once (fp32 config saved in it) for tests to copy."""
    path = tmp_path_factory.mktemp(f"{name}-template") / name
    with hipgraph.open(path, create=True, config=index_config(), embedder=embedder) as hg:
        hg.add_documents(docs)
    return path


MULTIHOP_QUESTION = ("Who was the first president of the association that published the "
                     "Journal of Psychotherapy Integration?")  # INLINE_DOCS: jpi -> apa


@pytest.fixture(scope="session")
def inline_template(tmp_path_factory, embedder, inline_docs) -> Path:
    """An index of INLINE_DOCS built once per session (copy it before writing)."""
    return build_template(tmp_path_factory, embedder, "inline", inline_docs)


@pytest.fixture
def inline_index(inline_template, tmp_path, make_index) -> hipgraph.HipGraph:
    """A fresh writable copy of the inline index."""
    return make_index(copy_index(inline_template, tmp_path))


def copy_index(template: Path, tmp_path: Path) -> Path:
    """A fresh, closed copy of a template index folder inside ``tmp_path``."""
    path = tmp_path / template.name
    shutil.copytree(template, path)
    return path


@pytest.fixture
def make_index(tmp_path, embedder) -> Iterator[Callable[..., hipgraph.HipGraph]]:
    """``make_index(name="ix", config=None, **open_kwargs)`` opens (creating) an index in tmp_path;
    every handle is closed at teardown."""
    opened: list[hipgraph.HipGraph] = []

    def _make(name: str | Path = "ix", *, config: IndexConfig | None = None, **kwargs: Any) -> hipgraph.HipGraph:
        path = Path(name) if Path(name).is_absolute() else tmp_path / name
        kwargs.setdefault("embedder", embedder)
        if not (path / "graph.duckdb").exists():
            kwargs.setdefault("create", True)
            config = config or index_config()
        hg = hipgraph.open(path, config=config, **kwargs)
        opened.append(hg)
        return hg

    yield _make
    for hg in opened:
        hg.close()


# ------------------------------------------------------------------ dumps
def _rows(con, sql: str) -> list[tuple]:
    return con.execute(sql).fetchall()


def faiss_on_disk(root: Path) -> dict[str, dict[str, Any]]:
    """ntotal and sorted ids of each saved FAISS file (None when the file is absent)."""
    import faiss

    out: dict[str, dict[str, Any]] = {}
    for kind in VECTOR_KINDS:
        path = Path(root) / f"{kind}.faiss"
        if not path.exists():
            out[kind] = {"ntotal": None, "ids": None}
            continue
        index = faiss.read_index(str(path))
        ids = np.sort(faiss.vector_to_array(index.id_map).astype(np.int64)).tolist()
        out[kind] = {"ntotal": int(index.ntotal), "ids": ids}
    return out


def dump_index(target: hipgraph.HipGraph | str | Path) -> dict[str, Any]:
    """The content of an index without its ids.

    documents by key (+hash), passages by (doc key, ordinal) with text and offsets, entities by name
    (+label, surface forms), mentions, facts by (subject, relation, object, kind), fact sources by
    (fact key, doc key, ordinal, extractor), edges by type with named endpoints and weights rounded to
    4 decimals, DuckDB vector counts per kind and the FAISS ntotal per kind as saved on disk.
    """
    if isinstance(target, hipgraph.HipGraph):
        return _dump(target)
    with hipgraph.open(target, read_only=True) as hg:
        return _dump(hg)


def _dump(hg: hipgraph.HipGraph) -> dict[str, Any]:
    con = hg.store.con
    passage_key = {
        int(pid): (key, int(ordinal))
        for pid, key, ordinal in _rows(con, "SELECT p.id, d.key, p.ordinal FROM passages p JOIN documents d ON d.id = p.doc_id")
    }
    entity_name = {int(eid): name for eid, name in _rows(con, "SELECT id, name FROM entities")}
    fact_key = {
        int(fid): (entity_name[int(s)], rel, entity_name[int(o)], kind)
        for fid, s, rel, o, kind in _rows(con, "SELECT id, subject_id, relation, object_id, kind FROM facts")
    }
    documents = {key: {"title": title, "hash": h, "metadata": json.loads(meta) if meta else None}
                 for key, title, h, meta in _rows(con, "SELECT key, title, content_hash, metadata FROM documents")}
    passages = {
        passage_key[int(pid)]: (title, text, int(start), int(end), th)
        for pid, title, text, start, end, th in _rows(
            con, "SELECT id, title, text, start_char, end_char, text_hash FROM passages")
    }
    entities = {name: (label, tuple(forms))
                for name, label, forms in _rows(con, "SELECT name, label, surface_forms FROM entities")}
    mentions = sorted(
        (passage_key[int(pid)], entity_name[int(eid)], surface, label)
        for pid, eid, surface, label in _rows(con, "SELECT passage_id, entity_id, surface, label FROM mentions")
    )
    facts = sorted(fact_key.values())
    fact_sources = sorted(
        (fact_key[int(fid)], *passage_key[int(pid)], extractor)
        for fid, pid, extractor in _rows(con, "SELECT fact_id, passage_id, extractor FROM fact_sources")
    )
    edges: dict[str, dict[tuple, float]] = {"fact": {}, "mention": {}, "synonym": {}}
    for etype, src, dst, weight in _rows(con, "SELECT type, src, dst, weight FROM edges"):
        if etype == "mention":
            key = (passage_key[int(src)], entity_name[int(dst)])
        else:
            key = tuple(sorted((entity_name[int(src)], entity_name[int(dst)])))
        assert key not in edges[etype], f"duplicate {etype} edge {key}"
        edges[etype][key] = round(float(weight), 4)
    vectors = {kind: int(_rows(con, f"SELECT count(*) FROM {kind}_vectors")[0][0]) for kind in VECTOR_KINDS}
    disk = faiss_on_disk(hg.path)
    return {
        "documents": documents,
        "passages": passages,
        "entities": entities,
        "mentions": mentions,
        "facts": facts,
        "fact_sources": fact_sources,
        "edges": edges,
        "vectors": vectors,
        "faiss": {kind: disk[kind]["ntotal"] for kind in VECTOR_KINDS},
        "stats": hg.stats(),
    }


def assert_same_index(a: dict[str, Any], b: dict[str, Any], *, weight_tol: float = 2e-4) -> None:
    """Dumps are equal; edge weights (cosines for synonyms) may differ by float noise only."""
    for section in ("documents", "passages", "entities", "mentions", "facts", "fact_sources",
                    "vectors", "faiss"):
        if a[section] != b[section]:
            detail = ""
            if isinstance(a[section], dict):
                only_a = {k: a[section][k] for k in set(a[section]) - set(b[section])}
                only_b = {k: b[section][k] for k in set(b[section]) - set(a[section])}
                differ = {k: (a[section][k], b[section][k]) for k in set(a[section]) & set(b[section])
                          if a[section][k] != b[section][k]}
                detail = f"\nonly in first: {only_a}\nonly in second: {only_b}\ndiffer: {differ}"
            elif isinstance(a[section], list):
                detail = (f"\nonly in first: {sorted(set(a[section]) - set(b[section]), key=repr)[:20]}"
                          f"\nonly in second: {sorted(set(b[section]) - set(a[section]), key=repr)[:20]}")
            raise AssertionError(f"indexes differ in {section}{detail}")
    for etype in ("fact", "mention", "synonym"):
        ea, eb = a["edges"][etype], b["edges"][etype]
        assert set(ea) == set(eb), (
            f"{etype} edges differ: only in first {sorted(set(ea) - set(eb))}, "
            f"only in second {sorted(set(eb) - set(ea))}")
        bad = {k: (ea[k], eb[k]) for k in ea if not math.isclose(ea[k], eb[k], abs_tol=weight_tol)}
        assert not bad, f"{etype} edge weights differ: {bad}"
    assert a["stats"] == b["stats"]


def check_consistency(hg: hipgraph.HipGraph) -> None:
    """Invariants of a healthy index: vectors match their rows, FAISS (memory and disk) matches
    DuckDB, every derived row (edges, surface forms) matches its provenance, nothing dangles."""
    con = hg.store.con

    def ids(sql: str) -> list[int]:
        return sorted(int(r[0]) for r in _rows(con, sql))

    assert ids("SELECT id FROM passage_vectors") == ids("SELECT id FROM passages")
    assert ids("SELECT id FROM entity_vectors") == ids("SELECT id FROM entities")
    assert ids("SELECT id FROM fact_vectors") == ids("SELECT id FROM facts WHERE kind = 'triple'")
    disk = faiss_on_disk(hg.path)
    for kind in VECTOR_KINDS:
        db_ids = ids(f"SELECT id FROM {kind}_vectors")
        assert hg.vectors.indexes[kind].ids().tolist() == db_ids, f"{kind}: FAISS in memory != DuckDB"
        assert disk[kind]["ids"] == db_ids, f"{kind}: FAISS file != DuckDB"
    for table in ("passages", "entities", "facts", "documents"):
        n, distinct = _rows(con, f"SELECT count(*), count(DISTINCT id) FROM {table}")[0]
        assert n == distinct, f"duplicate ids in {table}"
    assert _rows(con, "SELECT count(*) - count(DISTINCT key) FROM documents")[0][0] == 0
    assert _rows(con, "SELECT count(*) - count(DISTINCT name) FROM entities")[0][0] == 0
    # nothing dangles
    assert not _rows(con, "SELECT * FROM passages WHERE doc_id NOT IN (SELECT id FROM documents)")
    assert not _rows(con, "SELECT * FROM mentions WHERE passage_id NOT IN (SELECT id FROM passages)")
    assert not _rows(con, "SELECT * FROM mentions WHERE entity_id NOT IN (SELECT id FROM entities)")
    assert not _rows(con, "SELECT * FROM fact_sources WHERE passage_id NOT IN (SELECT id FROM passages)")
    assert not _rows(con, "SELECT * FROM fact_sources WHERE fact_id NOT IN (SELECT id FROM facts)")
    assert not _rows(con, """SELECT * FROM facts WHERE subject_id NOT IN (SELECT id FROM entities)
                             OR object_id NOT IN (SELECT id FROM entities)""")
    # no orphans
    assert not _rows(con, "SELECT * FROM documents WHERE id NOT IN (SELECT doc_id FROM passages)")
    assert not _rows(con, "SELECT * FROM entities WHERE id NOT IN (SELECT entity_id FROM mentions)")
    assert not _rows(con, "SELECT * FROM facts WHERE id NOT IN (SELECT fact_id FROM fact_sources)")
    # derived edges equal their provenance
    mention_edges = _rows(con, "SELECT src, dst, weight FROM edges WHERE type = 'mention' ORDER BY ALL")
    expected = _rows(con, "SELECT DISTINCT passage_id, entity_id, 1.0 FROM mentions ORDER BY ALL")
    assert mention_edges == expected
    fact_edges = _rows(con, "SELECT src, dst, weight FROM edges WHERE type = 'fact' ORDER BY ALL")
    expected = _rows(con, """
        SELECT least(f.subject_id, f.object_id), greatest(f.subject_id, f.object_id), count(*)::DOUBLE
        FROM facts f JOIN fact_sources s ON s.fact_id = f.id WHERE f.subject_id <> f.object_id
        GROUP BY ALL ORDER BY ALL""")
    assert fact_edges == expected
    assert not _rows(con, """SELECT * FROM edges WHERE type = 'synonym' AND (src >= dst
        OR src NOT IN (SELECT id FROM entities) OR dst NOT IN (SELECT id FROM entities))""")
    forms = _rows(con, "SELECT id, surface_forms FROM entities ORDER BY id")
    expected = _rows(con, """SELECT entity_id, list(DISTINCT surface ORDER BY surface) FROM mentions
                             GROUP BY entity_id ORDER BY entity_id""")
    assert forms == expected


def run_cli(*args: str, timeout: float = 300, check: bool = False, **kwargs: Any):
    """``python -m hipgraph ARGS`` in a subprocess (offline), with captured text output."""
    import subprocess
    import sys

    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([sys.executable, "-m", "hipgraph", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=str(REPO), **kwargs)
    if check and proc.returncode != 0:
        raise AssertionError(f"hipgraph {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
    return proc
