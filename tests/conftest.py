"""Shared fixtures: a tiny real corpus, one fp32 MiniLM embedder, index factories, a dump of an
index's content (vectors included) in an id-independent form (for "equals an index built from
scratch") and the invariants of a healthy index, synonym edges recomputed by brute force."""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import hipgraph  # noqa: E402
from hipgraph.config import EmbedderConfig, IndexConfig, SynonymConfig  # noqa: E402
from hipgraph.models.packed_linear import packing_supported  # noqa: E402
from hipgraph.store.schema import VECTOR_KINDS  # noqa: E402

# tests of real bf16 weight prepacking: oneDNN's reorder needs AVX512-BW/VL/DQ or AVX-NE-CONVERT
needs_packing = pytest.mark.skipif(
    not packing_supported(), reason="this CPU cannot prepack bf16 weights (no AVX512-BW/VL/DQ or AVX-NE-CONVERT)")

REPO = Path(__file__).resolve().parents[1]
SAMPLE_BUNDLE = REPO / "data" / "musique_sample.json"

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


def _load_bundle_docs() -> list[dict[str, Any]]:
    if not SAMPLE_BUNDLE.is_file():
        raise FileNotFoundError(f"the repository's sample corpus {SAMPLE_BUNDLE} is missing "
                                "(it is part of the repository: restore it with git checkout)")
    data = json.loads(SAMPLE_BUNDLE.read_text(encoding="utf-8"))
    return [{"id": f"m{c['idx']}", "title": c["title"], "text": c["text"]} for c in data["corpus"]]


@pytest.fixture(scope="session")
def sample_docs() -> list[dict[str, Any]]:
    """The first 40 documents of the repo's MuSiQue sample (data/musique_sample.json)."""
    return _load_bundle_docs()[:40]


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


def default_config(**changes: Any) -> IndexConfig:
    """The library's default config: precision ``auto`` (bf16 on CUDA and on CPUs with native
    bf16, fp32 elsewhere), for the equivalence tests that must hold at the default too."""
    return IndexConfig().replace(**changes) if changes else IndexConfig()


@pytest.fixture(scope="session")
def default_embedder():
    """MiniLM at the default precision, as an index with :func:`default_config` loads it."""
    from hipgraph.models.embedders import MiniLMEmbedder

    return MiniLMEmbedder(EmbedderConfig())


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


# ------------------------------------------------------------------ tolerances
# How far the stored vector of one text may lie from its vector in another build of the same
# content: the L2 distance of two unit vectors (||a - b||^2 = 2 (1 - cos)), by the precision the
# embedder ran at. Two builds differ in which texts share a forward pass (batch size, a fresh build
# against an incremental one), hence in padding and matrix shapes. Measured on a CPU without native
# bf16 (the largest over passages, entity names and facts):
#   fp32: 7.3e-7 between batch sizes 3 and 12 of INLINE_DOCS; 8.7e-7 in "adds and deletes equal a
#         fresh build"; 0 (bit-identical) between this process and worker processes and after a
#         kill -9 resume                                                              -> 1e-5;
#   bf16: 0.0111 between batch sizes 3 and 12 of INLINE_DOCS, 0.0126 between 4 and 40 of the
#         MuSiQue sample, 0.0124 from the fp32 vectors -> 0.03, the distance the README's
#         "cosine to fp32 > 0.9999" allows between two bf16 builds (each within sqrt(2e-4) = 0.0141).
VECTOR_TOL = {"fp32": 1e-5, "bf16": 0.03}
# Edge weights in two builds (synonym weights are cosines; the dump rounds to 4 decimals):
#   fp32: rounding only -> 2e-4;  bf16: synonym cosines measured 1.0e-3 apart between batch sizes 3
#   and 12 of INLINE_DOCS, 1.7e-3 between 4 and 40 of the MuSiQue sample, 1.85e-3 from fp32 -> 5e-3.
#   A pair whose cosine lies that close to the threshold can be an edge in one bf16 build and not in
#   the other (measured: "climate and climate change" - "climate dynamics", cosine 0.80056 with
#   batch size 4, 0.79936 with 40): edge sets are compared exactly, so such a flip fails.
WEIGHT_TOL = {"fp32": 2e-4, "bf16": 5e-3}
UNIT_NORM_TOL = 1e-5  # | ||v|| - 1 | of a stored vector (float32 after normalization: ~1e-7)
# A stored synonym weight (the exact cosine of the stored float32 vectors, rounded once to float64)
# against the cosine recomputed by a float64 matrix product (summation order: ~1e-16).
SYNONYM_COSINE_TOL = 1e-12


def cpu_has_native_bf16_flags() -> bool:
    """AVX512-BF16 or AMX-BF16 in /proc/cpuinfo (read here, independently of the library)."""
    try:
        flags = Path("/proc/cpuinfo").read_text(errors="ignore").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def vectors_precision(config: dict[str, Any]) -> str:
    """The precision an index's vectors were computed at, from its saved config: the MiniLM
    embedder's ``precision`` with ``auto`` resolved by the documented rule (bf16 on CUDA and on
    CPUs with native bf16, fp32 elsewhere); other embedders (hashing, OpenAI protocol) give fp32
    vectors computed outside torch."""
    emb = config["embedder"]
    if emb["name"] != "minilm":
        return "fp32"
    precision = emb["precision"]
    if precision != "auto":
        return precision
    if emb["device"] == "cuda":
        return "bf16"
    if emb["device"] == "auto":
        import torch

        if torch.cuda.is_available():
            return "bf16"
    return "bf16" if cpu_has_native_bf16_flags() else "fp32"


def _tolerance(table: dict[str, float], *dumps: dict[str, Any]) -> float:
    """The loosest tolerance of the dumps' precisions (fp32 < bf16)."""
    precisions = {d["precision"] for d in dumps}
    unknown = precisions - set(table)
    if unknown:
        raise ValueError(f"no tolerance measured for precision {sorted(unknown)}: pass one")
    return max(table[p] for p in precisions)


# ------------------------------------------------------------------ dumps
def _rows(con, sql: str) -> list[tuple]:
    return con.execute(sql).fetchall()


def stored_vectors(con, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, float32 matrix)`` of DuckDB's ``{kind}_vectors``, ordered by id (plain SQL)."""
    table = con.sql(f"SELECT id, vec FROM {kind}_vectors ORDER BY id").to_arrow_table()
    ids = np.asarray(table.column("id").to_pylist(), dtype=np.int64)
    vecs = table.column("vec").combine_chunks()
    flat = np.asarray(vecs.flatten().to_numpy(zero_copy_only=False), dtype=np.float32)
    return ids, flat.reshape(len(ids), -1) if len(ids) else flat.reshape(0, 0)


@dataclass(frozen=True, eq=False)
class KeyedVectors:
    """The stored vectors of one kind without ids: ``matrix`` rows in the order of the sorted
    ``keys``. ``==`` is exact equality (dumps compared with ``==``); :func:`assert_same_index`
    compares within a tolerance."""

    keys: tuple
    matrix: np.ndarray

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, KeyedVectors) and self.keys == other.keys
                and self.matrix.shape == other.matrix.shape and np.array_equal(self.matrix, other.matrix))

    def __repr__(self) -> str:
        return f"KeyedVectors({len(self.keys)} x {self.matrix.shape[1] if self.matrix.ndim == 2 else 0})"


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
    4 decimals, DuckDB vector counts per kind, the FAISS ntotal per kind as saved on disk, the
    stored vectors of every kind under the same keys (``embeddings``: passage by (doc key,
    ordinal), entity by name, fact by fact key, turn by (doc key, ordinal, turn position)) and the precision they were computed at.
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
    vectors["turn"] = int(_rows(con, "SELECT count(*) FROM turn_vectors")[0][0])
    embeddings = {}
    for kind, key_of in (("passage", passage_key), ("entity", entity_name), ("fact", fact_key)):
        ids, matrix = stored_vectors(con, kind)
        keys = [key_of[int(i)] for i in ids]  # a vector without its row is a KeyError here
        order = sorted(range(len(keys)), key=lambda i, keys=keys: keys[i])
        assert len(set(keys)) == len(keys), f"two {kind} vectors under one key"
        embeddings[kind] = KeyedVectors(tuple(keys[i] for i in order), matrix[order])
    table = con.sql("SELECT passage_id, turn, vec FROM turn_vectors").to_arrow_table()
    keys = [(*passage_key[int(p)], int(t)) for p, t in zip(table.column("passage_id").to_pylist(),
                                                          table.column("turn").to_pylist(), strict=True)]
    dim = int(hg.store.meta_get("dimension"))
    matrix = np.asarray(table.column("vec").combine_chunks().flatten(), dtype=np.float32).reshape(len(keys), dim)
    order = sorted(range(len(keys)), key=lambda i: keys[i])
    embeddings["turn"] = KeyedVectors(tuple(keys[i] for i in order), matrix[order])
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
        "embeddings": embeddings,
        "precision": vectors_precision(hg.store.meta_get("config")),
    }


def assert_same_index(a: dict[str, Any], b: dict[str, Any], *, weight_tol: float | None = None,
                      vector_tol: float | None = None) -> None:
    """Dumps are equal; stored vectors may lie ``vector_tol`` apart (L2, per vector) and edge
    weights (cosines for synonyms) ``weight_tol``: by default the tolerances measured for the
    precision the vectors were computed at (``VECTOR_TOL``, ``WEIGHT_TOL``; the looser of the two)."""
    weight_tol = _tolerance(WEIGHT_TOL, a, b) if weight_tol is None else weight_tol
    vector_tol = _tolerance(VECTOR_TOL, a, b) if vector_tol is None else vector_tol
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
    for kind in (*VECTOR_KINDS, "turn"):
        va, vb = a["embeddings"][kind], b["embeddings"][kind]
        assert va.keys == vb.keys, (
            f"{kind} vectors are stored under other keys: only in first "
            f"{sorted(set(va.keys) - set(vb.keys))[:10]}, only in second {sorted(set(vb.keys) - set(va.keys))[:10]}")
        if not va.keys:
            continue
        distance = np.linalg.norm(va.matrix.astype(np.float64) - vb.matrix, axis=1)
        worst = np.argsort(-distance)[:5]
        assert distance.max() <= vector_tol, (
            f"{kind} vectors differ by more than {vector_tol:g} (L2): "
            + ", ".join(f"{va.keys[i]!r}: {distance[i]:.3g}" for i in worst if distance[i] > vector_tol))
    for etype in ("fact", "mention", "synonym"):
        ea, eb = a["edges"][etype], b["edges"][etype]
        assert set(ea) == set(eb), (
            f"{etype} edges differ: only in first {sorted(set(ea) - set(eb))}, "
            f"only in second {sorted(set(eb) - set(ea))}")
        bad = {k: (ea[k], eb[k]) for k in ea if not math.isclose(ea[k], eb[k], abs_tol=weight_tol)}
        assert not bad, f"{etype} edge weights differ: {bad}"
    assert a["stats"] == b["stats"]


def faiss_vectors(index, ids: np.ndarray) -> tuple[np.ndarray, Any]:
    """The vectors a FAISS ``IndexIDMap2`` holds under ``ids``, and the copy of the index they were
    read from (the index itself is left untouched; IVF copies get the direct map reconstruction
    needs)."""
    import faiss

    copy = faiss.deserialize_index(faiss.serialize_index(index))
    inner = faiss.downcast_index(copy.index)
    if isinstance(inner, faiss.IndexIVF):
        inner.make_direct_map()
    return copy.reconstruct_batch(np.ascontiguousarray(ids, dtype=np.int64)), copy


def _check_faiss_vectors(label: str, index, ids: np.ndarray, stored: np.ndarray) -> None:
    """FAISS holds DuckDB's vector under each id: bit for bit (flat, HNSW, IVF-flat); IVF-SQ8 holds
    its 8-bit code (one byte per dimension of the residual to its list's centroid, clipped to the
    trained range: 0.09 from the vector measured in a test index, for one outside the training sample), so the
    vector reconstructed from FAISS equals DuckDB's vector encoded and decoded by that index."""
    import faiss

    if len(ids) == 0:
        assert index.ntotal == 0, f"{label}: FAISS holds vectors DuckDB has not"
        return
    held, copy = faiss_vectors(index, ids)
    inner = faiss.downcast_index(copy.index)  # owned by ``copy``: keep that alive while used
    expected = stored
    if isinstance(inner, faiss.IndexIVFScalarQuantizer):
        expected = inner.sa_decode(inner.sa_encode(np.ascontiguousarray(stored, dtype=np.float32)))
    wrong = np.nonzero(~np.all(held == expected, axis=1))[0]
    assert len(wrong) == 0, (
        f"{label}: FAISS holds other vectors than DuckDB under ids {ids[wrong][:10].tolist()} "
        f"(L2 {np.linalg.norm(held[wrong] - expected[wrong], axis=1)[:10].round(4).tolist()})")


def exact_dot(a: np.ndarray, b: np.ndarray) -> Fraction:
    """The exact dot product of two float32 vectors (rational arithmetic, no rounding)."""
    return sum((Fraction(float(x)) * Fraction(float(y)) for x, y in zip(a.tolist(), b.tolist(), strict=True)),
               Fraction(0))


def synonym_edges_by_brute_force(vectors: np.ndarray, config: SynonymConfig,
                                 ) -> tuple[dict[tuple[int, int], float], np.ndarray]:
    """The documented synonym rule over all entities: ``a``-``b`` (``a < b``, row numbers) with
    cosine >= threshold, neither having more than ``max_neighbors`` such neighbours. Cosines in
    float64 numpy; a pair within 1e-9 of the threshold is decided by the exact dot product of
    its float32 vectors (:func:`exact_dot`). Returns the edges with their cosines, and every
    row's neighbour count."""
    v = vectors.astype(np.float64)
    cos = v @ v.T
    np.fill_diagonal(cos, -np.inf)
    similar = cos >= config.threshold
    for r, c in np.argwhere(np.abs(cos - config.threshold) <= 1e-9).tolist():
        similar[r, c] = exact_dot(vectors[r], vectors[c]) >= Fraction(config.threshold)
    degree = similar.sum(axis=1)
    linkable = degree <= config.max_neighbors
    rows, cols = np.nonzero(np.triu(similar & linkable[:, None] & linkable[None, :], k=1))
    return {(int(r), int(c)): float(cos[r, c]) for r, c in zip(rows, cols, strict=True)}, degree


def _check_synonyms(hg: hipgraph.HipGraph) -> None:
    """Synonym edges (and each entity's ``synonym_degree``) equal the brute-force rule over the
    stored entity vectors, with the synonym config saved in the index; weights are the cosines."""
    con = hg.store.con
    config = IndexConfig.from_dict(hg.store.meta_get("config")).synonyms
    ids, vecs = stored_vectors(con, "entity")
    name = dict(_rows(con, "SELECT id, name FROM entities"))
    expected, degree = synonym_edges_by_brute_force(vecs, config)
    row_of = {int(i): r for r, i in enumerate(ids)}
    stored = {}
    for src, dst, weight in _rows(con, "SELECT src, dst, weight FROM edges WHERE type = 'synonym'"):
        stored[(row_of[int(src)], row_of[int(dst)])] = float(weight)

    def labelled(pairs) -> list[tuple[str, str]]:
        return sorted((name[int(ids[a])], name[int(ids[b])]) for a, b in pairs)

    missing, extra = set(expected) - set(stored), set(stored) - set(expected)
    assert not missing and not extra, (
        f"synonym edges differ from the rule (cosine >= {config.threshold}, at most "
        f"{config.max_neighbors} neighbours): missing {labelled(missing)}, extra {labelled(extra)}")
    bad = {p: (stored[p], round(expected[p], 7)) for p in stored if abs(stored[p] - expected[p]) > SYNONYM_COSINE_TOL}
    assert not bad, f"synonym weights are not the cosines: {dict(zip(labelled(bad), bad.values(), strict=True))}"
    saved_degree = dict(_rows(con, "SELECT id, synonym_degree FROM entities"))
    wrong = {name[int(i)]: (saved_degree[int(i)], int(degree[r])) for r, i in enumerate(ids)
             if saved_degree[int(i)] != degree[r]}
    assert not wrong, f"synonym_degree (saved, recomputed) differs: {wrong}"


def check_consistency(hg: hipgraph.HipGraph, *, synonyms: bool = True) -> None:
    """Invariants of a healthy index: vectors match their rows and are unit-norm, FAISS (memory
    and disk) holds DuckDB's vectors under DuckDB's ids, every derived row (edges, surface forms)
    matches its provenance, synonym edges equal the brute-force rule over the stored entity
    vectors (``synonyms=False`` skips that: approximate entity layouts), nothing dangles."""
    import faiss

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
        vid, vecs = stored_vectors(con, kind)
        assert len(set(vid.tolist())) == len(vid), f"{kind}: two vectors under one id"
        if len(vid):
            norms = np.linalg.norm(vecs.astype(np.float64), axis=1)
            assert np.abs(norms - 1).max() <= UNIT_NORM_TOL, (
                f"{kind} vectors are not unit-norm: ids {vid[np.abs(norms - 1) > UNIT_NORM_TOL][:10].tolist()}")
        _check_faiss_vectors(f"{kind} FAISS in memory", hg.vectors.indexes[kind]._index, vid, vecs)
        _check_faiss_vectors(f"{kind} FAISS file", faiss.read_index(str(hg.path / f"{kind}.faiss")), vid, vecs)
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
    assert _rows(con, "SELECT count(*) - count(DISTINCT (src, dst)) FROM edges WHERE type = 'synonym'")[0][0] == 0
    if synonyms:
        _check_synonyms(hg)
    forms = _rows(con, "SELECT id, surface_forms FROM entities ORDER BY id")
    expected = _rows(con, """SELECT entity_id, list(DISTINCT surface ORDER BY surface) FROM mentions
                             GROUP BY entity_id ORDER BY entity_id""")
    assert forms == expected
    counts = _rows(con, "SELECT entity_id, surface, label, cnt FROM surface_counts ORDER BY ALL")
    expected = _rows(con, "SELECT entity_id, surface, label, count(*) FROM mentions GROUP BY ALL ORDER BY ALL")
    assert counts == expected, "surface_counts do not match mentions"
    labels = _rows(con, "SELECT id, label FROM entities ORDER BY id")
    expected = _rows(con, """
        SELECT e.id, (SELECT arg_max(label, cnt ORDER BY cnt, label DESC) FILTER (WHERE label IS NOT NULL)
                      FROM (SELECT surface, label, count(*) AS cnt FROM mentions m
                            WHERE m.entity_id = e.id GROUP BY ALL))
        FROM entities e ORDER BY e.id""")
    assert labels == expected, "entity labels are not their most frequent mention label"
    _check_turn_vectors(con)


def _check_turn_vectors(con) -> None:
    """Turn vectors: exactly one unit-norm row per turn each memory unit covers (the turns of its
    session document whose character span overlaps the unit's), none for other passages."""
    expected = set()
    for pid, start, end, meta in _rows(con, """SELECT p.id, p.start_char, p.end_char, d.metadata
                                              FROM passages p JOIN documents d ON d.id = p.doc_id"""):
        meta = json.loads(meta) if isinstance(meta, str) else (meta or {})
        if meta.get("kind") == "conversation_session":
            expected |= {(int(pid), pos) for pos, t in enumerate(meta["turns"]) if t[2] < end and t[3] > start}
    rows = _rows(con, "SELECT passage_id, turn FROM turn_vectors")
    assert len(rows) == len(set(rows)), "two vectors for one turn"
    assert {(int(p), int(t)) for p, t in rows} == expected, "turn vectors do not match the memory units"
    if rows:
        table = con.sql("SELECT vec FROM turn_vectors").to_arrow_table()
        vecs = np.asarray(table.column("vec").combine_chunks().flatten(), dtype=np.float64).reshape(len(rows), -1)
        assert np.abs(np.linalg.norm(vecs, axis=1) - 1).max() <= UNIT_NORM_TOL, "turn vectors are not unit-norm"


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


# ------------------------------------------------------------------ a disk that fills up
@pytest.fixture
def small_disk(tmp_path) -> Iterator[Path]:
    """A real 16 MiB filesystem (tmpfs) mounted in ``tmp_path``, unmounted at teardown even when
    the test fails (lazily: a handle the failed test left open does not keep it mounted). Mounting
    needs root, as the tests and CI run; anywhere else the test fails saying so."""
    import subprocess

    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount_point)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError(f"cannot mount a tmpfs (the disk-full tests run as root): {proc.stderr}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "--lazy", str(mount_point)], check=True)


def fill_disk(folder: Path) -> Path:
    """Write zeros to ``folder/filler`` until the filesystem reports ENOSPC; returns the file
    (delete it to free the space again)."""
    import errno

    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 4096)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
    return filler


def cli_in_process(*args: str) -> int:
    """``hipgraph ARGS`` in this process, its exit status (the CLI's logging setup undone
    afterwards); argparse's own refusals still raise SystemExit."""
    import logging

    from hipgraph.cli import main as cli_main

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        return cli_main(list(args))
    finally:
        root.handlers[:], root.level = handlers, level


def embed_questions_beside_a_batch(emb, questions: list[str], texts: list[str], atol: float,
                                   askers: int = 8) -> list[str]:
    """``askers`` threads embed ``questions`` (small calls, 3 rounds each) while another embeds
    ``texts`` as one batch 3 times, all on ``emb``; what differed from serial calls."""
    import threading  # noqa: PLC0415

    serial = {q: emb.embed([q])[0] for q in questions}
    batch_ref = emb.embed(texts)
    errors: list[str] = []
    barrier = threading.Barrier(askers + 1)

    def asker(i: int) -> None:
        barrier.wait()
        for n in range(3 * len(questions)):
            q = questions[(i + n) % len(questions)]
            if not np.allclose(emb.embed([q])[0], serial[q], atol=atol):
                errors.append(f"thread {i}: {q!r} differs")

    def batcher() -> None:
        barrier.wait()
        for _ in range(3):
            if not np.allclose(emb.embed(texts), batch_ref, atol=atol):
                errors.append("the torch batch differs")

    threads = [threading.Thread(target=asker, args=(i,)) for i in range(askers)]
    threads.append(threading.Thread(target=batcher))
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    errors.extend(f"{t.name} still running" for t in threads if t.is_alive())
    return errors
