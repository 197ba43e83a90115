"""Indexing through the API: graph content, idempotent adds, replacements, deletes (equal to a
from-scratch build), bad records, chunking, and batches that fail without leaving half a write."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from pathlib import Path

import duckdb
import numpy as np
import pytest
from conftest import (
    VECTOR_TOL,
    assert_same_index,
    check_consistency,
    default_config,
    dump_index,
    fill_disk,
    index_config,
    stored_vectors,
    vectors_precision,
)

import hipgraph
from hipgraph.config import ChunkConfig, EmbedderConfig, IndexConfig, SynonymConfig
from hipgraph.errors import ConfigError, ExtractionError, InputError, StoreError
from hipgraph.indexers.extract_spacy import SpacyExtractor
from hipgraph.types import Chunk, Document, Extraction

_TOKEN = re.compile(r"\w+|[^\w\s]")


def _entity_names(hg, keys: Sequence[str]) -> set[str]:
    rows = hg.store.con.execute("""
        SELECT DISTINCT e.name FROM entities e JOIN mentions m ON m.entity_id = e.id
        JOIN passages p ON p.id = m.passage_id JOIN documents d ON d.id = p.doc_id
        WHERE list_contains(?, d.key)""", [list(keys)]).fetchall()
    return {r[0] for r in rows}


def _passage_texts(hg) -> set[str]:
    return {r[0] for r in hg.store.con.execute("SELECT text FROM passages").fetchall()}


# ------------------------------------------------------------------ adding
def test_add_builds_passages_entities_facts_and_all_edge_types(make_index, sample_docs):
    hg = make_index()
    docs = sample_docs[:12]
    report = hg.add_documents(docs, batch_size=5)
    assert (report.added, report.replaced, report.unchanged, report.skipped) == (12, 0, 0, 0)
    assert report.warnings == []
    stats = hg.stats()
    assert stats["documents"] == 12
    assert stats["passages"] == report.passages >= 12
    assert stats["entities"] == report.entities_new > 12
    assert stats["facts"] == report.facts_new > 0
    assert stats["edges"]["synonym"] == report.synonym_edges_new > 0
    assert stats["edges"]["fact"] > 0 and stats["edges"]["mention"] > 0
    kinds = dict(hg.store.con.execute("SELECT kind, count(*) FROM facts GROUP BY kind").fetchall())
    assert kinds.get("triple", 0) > 0 and kinds.get("cooccurrence", 0) > 0
    assert set(report.seconds) >= {"extract", "embed", "graph", "write"}
    assert hg.store.meta_get("generation") == 3  # one per committed batch of 5, 5, 2
    check_consistency(hg)
    # a sample of what the spaCy extractor must find in "Journal of Mathematical Physics"
    assert {"journal of mathematical physics", "american institute of physics",
            "jan philip solovej", "university of copenhagen"} <= _entity_names(hg, ["m0"])
    facts = hg.store.con.execute("""
        SELECT s.name, f.relation, o.name FROM facts f JOIN entities s ON s.id = f.subject_id
        JOIN entities o ON o.id = f.object_id WHERE f.kind = 'triple'""").fetchall()
    assert ("journal of mathematical physics", "published by", "american institute of physics") in facts
    # passages carry the document's text and title; vectors are unit-norm
    row = hg.store.con.execute("""SELECT p.title, p.text, p.ordinal FROM passages p
        JOIN documents d ON d.id = p.doc_id WHERE d.key = 'm0'""").fetchall()
    assert row == [(docs[0]["title"], docs[0]["text"], 0)]
    for kind in ("passage", "entity", "fact"):
        _, vecs = hg.store.read_vectors(kind)
        assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-4)
    hits = hg.retrieve("Who is the editor of the Journal of Mathematical Physics?", k=3, mode="dense")
    assert [h.rank for h in hits] == [1, 2, 3] and hits[0].doc_id == "m0"


def _letters(n: int) -> list[dict[str, str]]:
    people = ["Ada Lovelace", "Charles Babbage", "Alan Turing", "Grace Hopper", "John von Neumann"]
    places = ["London", "Paris", "Princeton", "Cambridge", "New York"]
    return [{"id": f"l{i}", "title": f"Letter {i}",
             "text": f"{people[i % 5]} visited {places[i % 3]} in {1900 + i}. "
                     f"{people[(i + 2) % 5]} wrote to {people[i % 5]} from {places[(i + 1) % 5]}."}
            for i in range(n)]


def test_batches_grow_with_the_index_and_build_the_same_index(make_index):
    """Without an explicit batch size, batches start at ``batch_size`` and grow to
    ``batch_growth`` of the documents the index holds (this call's included), at most
    ``max_batch_size``; the index equals one built in fixed batches."""
    config = index_config(batch_size=2, batch_growth=0.25, max_batch_size=6)
    growing = make_index("growing", config=config)
    batches: list[int] = []
    growing.add_documents(_letters(40), progress=batches.append)
    # 12 batched: int(12 * 0.25) = 3 > 2; 33 batched: 8, capped at 6; the last one takes the rest
    assert batches == [2, 2, 2, 2, 2, 2, 3, 3, 4, 5, 6, 6, 1]
    batches.clear()  # a later call counts the documents already held: 40 * 0.25 = 10, capped
    growing.add_documents(_letters(50)[40:], progress=batches.append)
    assert batches == [6, 4]
    batches.clear()  # an explicit batch size is fixed
    growing.add_documents([{**d, "text": d["text"] + " Revised."} for d in _letters(7)],
                          batch_size=3, progress=batches.append)
    assert batches == [3, 3, 1]
    check_consistency(growing)
    fixed = make_index("fixed", config=index_config(batch_size=5, batch_growth=0.0))
    batches.clear()
    fixed.add_documents(_letters(50), progress=batches.append)
    assert batches == [5] * 10
    fixed.add_documents([{**d, "text": d["text"] + " Revised."} for d in _letters(7)])
    assert_same_index(dump_index(growing), dump_index(fixed))
    for bad, message in (({"batch_growth": 1.5}, "batch_growth must be in"),
                         ({"max_batch_size": 0}, "max_batch_size must be >= 1")):
        with pytest.raises(ConfigError, match=message):
            IndexConfig(**bad)


def test_readding_the_same_documents_is_a_no_op(make_index, sample_docs, tmp_path):
    hg = make_index()
    docs = sample_docs[:8]
    hg.add_documents(docs, batch_size=4)
    before = dump_index(hg)
    generation = hg.store.meta_get("generation")
    meta = hg.store.meta_all()
    mtimes = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "ix").glob("*.faiss")}
    for batch_size in (4, 100):
        report = hg.add_documents([dict(d) for d in reversed(docs)], batch_size=batch_size)
        assert (report.added, report.replaced, report.unchanged) == (0, 0, 8)
        assert report.passages == report.entities_new == report.facts_new == 0
    # Document objects and integer-free string ids hash the same way as mappings
    report = hg.add_documents([Document(d["id"], d["text"], d["title"]) for d in docs[:2]])
    assert report.unchanged == 2 and report.added == report.replaced == 0
    assert hg.store.meta_get("generation") == generation
    assert hg.store.meta_all() == meta
    assert dump_index(hg) == before
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "ix").glob("*.faiss")} == mtimes


def test_changed_text_replaces_the_document(make_index, inline_docs):
    docs = inline_docs[:8]
    hg = make_index()
    hg.add_documents(docs)
    stats = hg.stats()
    old = next(d for d in docs if d["id"] == "jmp")
    new_text = ("The Journal of Mathematical Physics is a peer-reviewed journal published monthly by the "
                "American Institute of Physics. Its editor is Bruno Nachtergaele from the University of "
                "California, Davis.")
    report = hg.add_documents([dict(old, text=new_text)])
    assert (report.added, report.replaced, report.unchanged) == (0, 1, 0)
    texts = _passage_texts(hg)
    assert old["text"] not in texts and new_text in texts
    assert hg.stats()["documents"] == stats["documents"]
    names = {r[0] for r in hg.store.con.execute("SELECT name FROM entities").fetchall()}
    assert "jan philip solovej" not in names  # only the old text mentioned him
    assert "bruno nachtergaele" in names
    assert "university of copenhagen" in names  # still mentioned by other documents
    check_consistency(hg)
    hits = hg.retrieve("Who edits the Journal of Mathematical Physics?", k=1, mode="dense")
    assert hits[0].doc_id == "jmp" and hits[0].text == new_text
    # a new title alone (same text) is a change too
    report = hg.add_documents([dict(old, text=new_text, title="J. Math. Phys.")])
    assert report.replaced == 1
    titles = hg.store.con.execute("""SELECT d.title, p.title FROM documents d JOIN passages p
        ON p.doc_id = d.id WHERE d.key = 'jmp'""").fetchall()
    assert titles == [("J. Math. Phys.", "J. Math. Phys.")]
    # the final state equals a from-scratch build of the final documents
    final = [d if d["id"] != "jmp" else dict(old, text=new_text, title="J. Math. Phys.") for d in docs]
    fresh = make_index("fresh")
    fresh.add_documents(final)
    assert_same_index(dump_index(hg), dump_index(fresh))


def test_repeated_id_in_one_call_keeps_the_last(make_index):
    hg = make_index()
    report = hg.add_documents([
        {"id": "oslo", "text": "Oslo is the capital of Norway."},
        {"id": "oslo", "text": "Oslo is the capital and most populous city of Norway."},
    ])
    assert report.added == 1
    assert any("repeated" in w and "oslo" in w for w in report.warnings)
    assert _passage_texts(hg) == {"Oslo is the capital and most populous city of Norway."}
    check_consistency(hg)
    # the same id in consecutive batches of one call (planned while the previous one is written)
    v1 = {"id": "bergen", "text": "Bergen is a city on the west coast of Norway."}
    v2 = {"id": "bergen", "text": "Bergen is the second largest city in Norway."}
    other = [{"id": f"town{i}", "text": f"Town {i} lies in the county of Vestland, Norway."} for i in range(5)]
    records = [v1, other[0], v2, other[1], v2, other[2], v1, other[3], dict(v1), other[4]]
    report = hg.add_documents(records, batch_size=2)
    assert (report.added, report.replaced, report.unchanged) == (6, 2, 2)
    assert v1["text"] in _passage_texts(hg) and v2["text"] not in _passage_texts(hg)
    assert hg.stats()["documents"] == 7
    check_consistency(hg)


# ------------------------------------------------------------------ deleting
def _variant(doc: dict, rng: random.Random, donors: list[dict]) -> dict:
    """A changed version: drop the last sentence, or append the first sentence of another doc."""
    sentences = re.split(r"(?<=[.!?])\s+", doc["text"])
    if len(sentences) > 1 and rng.random() < 0.5:
        text = " ".join(sentences[:-1])
    else:
        donor = rng.choice(donors)
        text = doc["text"] + " " + re.split(r"(?<=[.!?])\s+", donor["text"])[0]
    return dict(doc, text=text)


def test_any_sequence_of_adds_and_deletes_equals_a_fresh_build(make_index, sample_docs, default_embedder):
    """At the default precision (bf16 where the CPU has it natively: the batch sizes differ, so
    vectors are compared within the bf16 tolerance there)."""
    rng = random.Random(1234)
    pool = [dict(d) for d in sample_docs[:22]]
    live: dict[str, dict] = {}
    hg = make_index("incremental", config=default_config(), embedder=default_embedder)

    def add(docs: list[dict], batch_size: int, expect: tuple[int, int, int]) -> None:
        report = hg.add_documents(docs, batch_size=batch_size)
        assert (report.added, report.replaced, report.unchanged) == expect
        for d in docs:
            live[d["id"]] = d
        check_consistency(hg)

    def delete(keys: list[str], unknown: tuple[str, ...] = ()) -> None:
        report = hg.delete_documents(keys + list(unknown))
        assert report.deleted == len(keys)
        assert len(report.warnings) == len(unknown)
        for k in keys:
            del live[k]
        check_consistency(hg)

    add(pool[:8], 4, (8, 0, 0))
    changed = [_variant(live[d["id"]], rng, pool) for d in rng.sample(pool[:5], 3)]
    add(pool[5:13] + changed, 6, (5, 3, 3))
    delete(rng.sample(sorted(live), 4), unknown=("no-such-doc",))
    gone = sorted(set(d["id"] for d in pool[:13]) - set(live))
    back = [next(d for d in pool if d["id"] == gone[0])]  # re-added with its original text
    changed = [_variant(live[k], rng, pool) for k in rng.sample(sorted(live), 2)]
    add(pool[13:18] + back + changed, 4, (6, 2, 0))
    delete(rng.sample(sorted(live), 3))
    same = sorted(live)[:3]
    changed = [_variant(live[k], rng, pool) for k in rng.sample(sorted(live)[3:], 2)]
    add(pool[18:22] + changed + [live[k] for k in same], 100, (4, 2, 3))
    delete(rng.sample(sorted(live), 2))
    assert len(live) >= 13

    fresh = make_index("fresh", config=default_config(), embedder=default_embedder)
    fresh.add_documents(list(live.values()))
    check_consistency(fresh)
    a, b = dump_index(hg), dump_index(fresh)
    assert a["stats"]["edges"]["synonym"] > 0 and a["stats"]["edges"]["fact"] > 0
    assert_same_index(a, b)
    for kind in ("passage", "entity", "fact"):
        assert a["faiss"][kind] == a["vectors"][kind] == b["faiss"][kind]


def test_synonym_cap_holds_after_every_add_and_delete(make_index, inline_docs):
    """One document per batch, then deletes: entities reach the cap exactly, pass it and fall back
    under it; after every step the synonym edges and degrees equal the brute-force rule."""
    hg = make_index("steps", config=index_config(synonyms=SynonymConfig(threshold=0.5, max_neighbors=2)))
    degrees: set[int] = set()
    for doc in inline_docs[:8]:
        hg.add_documents([doc])
        check_consistency(hg)
        degrees |= {int(d) for (d,) in hg.store.con.execute("SELECT synonym_degree FROM entities").fetchall()}
    for key in ("jpi", "apa", "pct"):
        hg.delete_documents([key])
        check_consistency(hg)
    hg.add_documents([inline_docs[0]])
    check_consistency(hg)
    assert {2, 3} <= degrees  # at the cap and past it at some step


def test_batching_does_not_change_the_graph_when_neighbor_lists_are_full(make_index, inline_docs):
    """Synonym lists bounded by max_neighbors: the edges must not depend on which entities
    happened to be indexed earlier (two batches vs one batch of the same documents), and both
    equal the rule recomputed by brute force from the stored vectors."""
    config = index_config(synonyms=SynonymConfig(threshold=0.5, max_neighbors=2))
    two_batches = make_index("two", config=config)
    two_batches.add_documents(inline_docs[:4])
    two_batches.add_documents(inline_docs[4:8])
    one_batch = make_index("one", config=config)
    one_batch.add_documents(inline_docs[:8])
    check_consistency(two_batches)
    check_consistency(one_batch)
    a, b = dump_index(two_batches), dump_index(one_batch)
    assert_same_index(a, b)
    assert b["stats"]["edges"]["synonym"] > 0
    # the cap matters here: some entities have more than 2 names at cosine >= 0.5, and pairs
    # above the threshold are left out for it
    vectors = b["embeddings"]["entity"].matrix.astype(np.float64)
    similar = vectors @ vectors.T >= 0.5
    np.fill_diagonal(similar, False)
    assert similar.sum(axis=1).max() > 2
    assert np.triu(similar).sum() > b["stats"]["edges"]["synonym"]


def _synonym_edge_and_unrelated_pair(hg) -> tuple[tuple[int, int], tuple[int, int]]:
    """One stored synonym edge, and two entities whose names are far apart (cosine < 0.3)."""
    con = hg.store.con
    edge = con.execute("SELECT src, dst FROM edges WHERE type = 'synonym' ORDER BY ALL LIMIT 1").fetchall()[0]
    ids, vectors = stored_vectors(con, "entity")
    cos = vectors @ vectors.T
    a, b = np.argwhere(np.triu(cos < 0.3, 1))[0]
    return (int(edge[0]), int(edge[1])), (int(ids[a]), int(ids[b]))


@pytest.mark.parametrize(("change", "message"), [
    pytest.param("UPDATE edges SET weight = weight - 0.02 WHERE type = 'synonym' AND src = $a AND dst = $b",
                 "synonym weights are not the cosines", id="weight-off-by-0.02"),
    pytest.param("UPDATE edges SET weight = weight + 5e-5 WHERE type = 'synonym' AND src = $a AND dst = $b",
                 "synonym weights are not the cosines", id="weight-off-by-5e-5"),
    pytest.param("DELETE FROM edges WHERE type = 'synonym' AND src = $a AND dst = $b", r"missing \[\(",
                 id="edge-dropped"),
    pytest.param("INSERT INTO edges VALUES ('synonym', least($c, $d), greatest($c, $d), 0.9)",
                 r"missing \[\], extra \[\(", id="edge-added"),
    pytest.param("UPDATE entities SET synonym_degree = 0 WHERE id = $a", "synonym_degree", id="degree-wrong"),
])
def test_consistency_check_recomputes_synonym_edges_from_the_vectors(inline_index, change, message):
    hg = inline_index
    check_consistency(hg)
    (a, b), (c, d) = _synonym_edge_and_unrelated_pair(hg)
    hg.store.con.execute(change, {k: v for k, v in {"a": a, "b": b, "c": c, "d": d}.items() if f"${k}" in change})
    with pytest.raises(AssertionError, match=message):
        check_consistency(hg)


def test_bf16_batchings_give_the_same_index_within_the_bf16_tolerance(tmp_path, inline_docs):
    """bf16 may round differently when other texts share a forward pass (emulated bf16 does;
    native AVX512-BF16 kernels gave identical vectors): batch sizes 3 and 12 give vectors within
    VECTOR_TOL['bf16'] and the same graph; synonym edges equal the brute-force rule in both."""
    from hipgraph.models.embedders import MiniLMEmbedder

    bf16 = EmbedderConfig(precision="bf16")
    embedder = MiniLMEmbedder(bf16)
    dumps = []
    for batch_size in (3, 12):
        with hipgraph.open(tmp_path / f"batch{batch_size}", create=True, embedder=embedder,
                           config=IndexConfig(embedder=bf16, batch_size=batch_size)) as hg:
            hg.add_documents(inline_docs)
            check_consistency(hg)
            dumps.append(dump_index(hg))
    a, b = dumps
    assert a["precision"] == b["precision"] == "bf16" and a["stats"]["edges"]["synonym"] >= 2
    distance = np.linalg.norm(a["embeddings"]["entity"].matrix - b["embeddings"]["entity"].matrix, axis=1)
    assert distance.max() <= VECTOR_TOL["bf16"]
    if distance.max() > VECTOR_TOL["fp32"]:  # emulated bf16: the batchings really differ
        with pytest.raises(AssertionError, match="vectors differ by more than"):
            assert_same_index(a, b, vector_tol=VECTOR_TOL["fp32"])
    # (native AVX512-BF16 kernels, as on the 2026-12 development machine, gave identical vectors
    # for both batchings: then the fp32 tolerance holds as well)
    assert_same_index(a, b)


def test_batches_are_padded_to_few_widths_that_hold_each_text():
    """Batch widths are rounded up by at most 1/8 (exact below 16 word pieces), so an index meets
    few shapes; every text lands in exactly one batch no narrower than it, within the budget."""
    from hipgraph.models.embedders import padded_width, token_batches

    widths = [padded_width(n, 256) for n in range(1, 257)]
    assert widths[:15] == list(range(1, 16)) and widths[-1] == 256
    assert all(n <= w <= min(256, n + n // 8) for n, w in enumerate(widths, start=1))
    assert len(set(widths)) == 48 and padded_width(250, 252) == 252 and padded_width(300, 256) == 300
    lengths = np.random.default_rng(3).integers(1, 257, 2000)
    seen = []
    for batch, width in token_batches(lengths, 2048, 256):
        assert lengths[batch].max() <= width == padded_width(int(lengths[batch].max()), 256)
        assert len(batch) * width <= 2048 or len(batch) == 1
        seen.extend(batch.tolist())
    assert sorted(seen) == list(range(2000))


def test_padding_leaves_each_texts_vector_as_if_embedded_alone(embedder):
    """Texts of mixed lengths in one call (padded to their batch's width) get the vectors they get
    one at a time (fp32: the padding is masked out)."""
    texts = ["Paris", "The Eiffel Tower stands in Paris, the capital of France.",
             "Marie Curie won two Nobel Prizes, in physics in 1903 and in chemistry in 1911, the "
             "first person to win twice and the only one in two sciences.", "Nobel Prize in Physics"]
    texts += [f"{t} ({i})" for i, t in enumerate(texts)] + ["Warsaw", "radium and polonium"]
    assert len(texts) > embedder.config.small_batch  # the torch batch path, not the question path
    together = embedder.embed(texts)
    alone = np.vstack([embedder._embed_unique([t]) for t in texts])
    assert np.abs(together - alone).max() <= VECTOR_TOL["fp32"]


def test_dumps_name_the_precision_the_embedder_resolves(default_embedder, embedder):
    """assert_same_index picks its tolerance by the precision a dump names: it must be the one the
    library's embedder really ran at (``auto`` resolved the same way)."""
    for loaded, config in ((default_embedder, default_config()), (embedder, index_config())):
        loaded.embed(["Carl Rogers"])
        assert vectors_precision(config.to_dict()) == loaded.precision


def test_delete_removes_orphans_and_their_vectors_but_keeps_shared_entities(make_index, inline_docs):
    hg = make_index()
    hg.add_documents(inline_docs)
    con = hg.store.con
    gone_docs = ["jpi", "np"]
    survivors = [d["id"] for d in inline_docs if d["id"] not in gone_docs]
    mine = _entity_names(hg, gone_docs)
    others = _entity_names(hg, survivors)
    exclusive, shared = mine - others, mine & others
    assert {"andrea taroni", "nature publishing group"} <= exclusive
    assert "american psychological association" in shared
    ids = dict(con.execute("SELECT name, id FROM entities").fetchall())
    facts_before = con.execute("""
        SELECT f.id, bool_or(d.key NOT IN ('jpi', 'np')) FROM facts f
        JOIN fact_sources s ON s.fact_id = f.id JOIN passages p ON p.id = s.passage_id
        JOIN documents d ON d.id = p.doc_id GROUP BY f.id""").fetchall()
    orphan_facts = {int(f) for f, kept in facts_before if not kept}
    kept_facts = {int(f) for f, kept in facts_before if kept}
    assert orphan_facts
    generation = hg.store.meta_get("generation")

    report = hg.delete_documents(gone_docs)
    assert report.deleted == 2 and report.warnings == []
    assert hg.store.meta_get("generation") == generation + 1
    names_after = dict(con.execute("SELECT name, id FROM entities").fetchall())
    assert not exclusive & set(names_after)
    assert all(names_after[n] == ids[n] for n in shared)  # same rows, same ids, same vectors
    entity_vector_ids = set(hg.store.vector_ids("entity").tolist())
    faiss_entity_ids = set(hg.vectors.indexes["entity"].ids().tolist())
    for name in exclusive:
        assert ids[name] not in entity_vector_ids and ids[name] not in faiss_entity_ids
    for name in shared:
        assert ids[name] in entity_vector_ids and ids[name] in faiss_entity_ids
    fact_ids = {int(r[0]) for r in con.execute("SELECT id FROM facts").fetchall()}
    assert not orphan_facts & fact_ids and kept_facts <= fact_ids
    assert not orphan_facts & set(hg.vectors.indexes["fact"].ids().tolist())
    assert not con.execute("""SELECT * FROM documents WHERE key IN ('jpi', 'np')""").fetchall()
    check_consistency(hg)
    for hit in hg.retrieve("Nature Physics journal chief editor", k=5, mode="dense"):
        assert hit.doc_id not in gone_docs
    # deleting everything empties the index
    hg.delete_documents(survivors)
    assert hg.stats() == {"documents": 0, "passages": 0, "entities": 0, "facts": 0,
                          "edges": {"fact": 0, "mention": 0, "synonym": 0}}
    assert all(hg.vectors.indexes[k].ntotal == 0 for k in ("passage", "entity", "fact"))
    check_consistency(hg)


def test_an_index_written_before_surface_counts_gets_them_on_its_first_writable_open(
        inline_index, inline_docs):
    hg = inline_index
    path = hg.path
    expected = hg.store.con.execute("SELECT * FROM surface_counts ORDER BY ALL").fetchall()
    assert expected and max(r[3] for r in expected) > 1
    hg.store.con.execute("DROP TABLE surface_counts")  # as an index written before the table
    hg.close()
    with hipgraph.open(path, read_only=True) as old:  # readers do not need it
        assert old.retrieve("Who edits Nature Physics?", k=2)
    with hipgraph.open(path) as hg:
        assert hg.store.con.execute("SELECT * FROM surface_counts ORDER BY ALL").fetchall() == expected
        hg.delete_documents(["jpi"])
        hg.add_documents([dict(inline_docs[0], id="again", text=inline_docs[0]["text"] + " More text.")])
        check_consistency(hg)


def test_unknown_delete_ids_give_warnings(make_index, inline_docs):
    hg = make_index()
    hg.add_documents(inline_docs[:3])
    before = dump_index(hg)
    generation = hg.store.meta_get("generation")
    report = hg.delete_documents(["nope", "missing-too"])
    assert report.deleted == 0
    assert sorted(report.warnings) == ["document 'missing-too' is not in the index",
                                       "document 'nope' is not in the index"]
    assert hg.store.meta_get("generation") == generation
    assert dump_index(hg) == before
    report = hg.delete_documents(["jpi", "nope", "jpi"])
    assert report.deleted == 1 and report.warnings == ["document 'nope' is not in the index"]
    assert hg.stats()["documents"] == 2


# ------------------------------------------------------------------ bad records
def test_records_without_text_are_skipped_and_counted(make_index, inline_docs):
    hg = make_index()
    hg.add_documents(inline_docs[:2])
    seen: list[int] = []
    records = [
        {"id": "empty", "text": ""},
        {"id": "none"},
        {"id": "blank", "text": " \n\t "},
        {"id": "jpi", "text": ""},  # an existing id without text leaves the stored one alone
        inline_docs[2],
    ]
    report = hg.add_documents(records, progress=seen.append, batch_size=2)
    assert report.skipped == 4 and report.added == 1
    assert len(report.warnings) == 4
    for key in ("empty", "none", "blank", "jpi"):
        assert any(f"'{key}'" in w and "no text" in w for w in report.warnings)
    assert sum(seen) == len(records)
    keys = {r[0] for r in hg.store.con.execute("SELECT key FROM documents").fetchall()}
    assert keys == {"jpi", "fsh", "apa"}
    check_consistency(hg)


@pytest.mark.parametrize("record, field", [
    ({"text": "no id"}, "id"),
    ({"id": ["a"], "text": "list id"}, "id"),
    ({"id": True, "text": "bool id"}, "id"),
    ({"id": " ", "text": "blank id"}, "id"),
    ({"id": "x", "text": 42}, "text"),
    ({"id": "x", "text": "t", "title": 7}, "title"),
    ({"id": "x", "text": "t", "metadata": [1]}, "metadata"),
    ({"id": "x", "text": "t", "metadata": {"when": object()}}, "metadata"),
])
def test_malformed_records_are_input_errors(make_index, record, field):
    hg = make_index()
    with pytest.raises(InputError, match=field):
        hg.add_documents([record])
    assert hg.stats()["documents"] == 0


# ------------------------------------------------------------------ chunking
def test_long_document_is_chunked_with_exact_offsets(make_index, sample_docs):
    config = index_config(chunk=ChunkConfig(max_tokens=40, overlap=8))
    hg = make_index(config=config)
    text = "\n\n".join(d["text"] for d in sample_docs[:4]) + "\n"
    doc = {"id": "long", "title": "Four journals", "text": text}
    report = hg.add_documents([doc, sample_docs[5]])
    rows = hg.store.con.execute("""SELECT p.ordinal, p.start_char, p.end_char, p.text, p.title
        FROM passages p JOIN documents d ON d.id = p.doc_id WHERE d.key = 'long' ORDER BY p.ordinal""").fetchall()
    assert len(rows) >= 4 and report.passages == len(rows) + 1
    assert [r[0] for r in rows] == list(range(len(rows)))
    for _, start, end, passage, title in rows:
        assert passage == text[start:end] and passage == passage.strip()
        assert len(_TOKEN.findall(passage)) <= 40
        assert title == "Four journals"
    assert rows[0][1] == 0 and rows[-1][2] == len(text.rstrip())
    for prev, nxt in zip(rows, rows[1:], strict=False):
        assert prev[1] < nxt[1] < prev[2]  # moving forward, overlapping
    # a sentence only the last passage holds is retrieved from that passage
    last = rows[-1][3]
    hits = hg.retrieve(last, k=1, mode="dense")
    assert hits[0].doc_id == "long" and hits[0].text == last
    check_consistency(hg)
    # a shorter version replaces all old passages (and their vectors)
    report = hg.add_documents([dict(doc, text=sample_docs[6]["text"])])
    assert report.replaced == 1 and 1 < report.passages < len(rows)
    assert hg.store.con.execute("""SELECT count(*) FROM passages p JOIN documents d
        ON d.id = p.doc_id WHERE d.key = 'long'""").fetchall()[0][0] == report.passages
    assert not {r[3] for r in rows} & _passage_texts(hg)
    check_consistency(hg)


# ------------------------------------------------------------------ failed batches
class FailingExtractor:
    """The real spaCy extractor, failing on any passage of a document whose id is in ``fail_on``."""

    def __init__(self, fail_on: set[str]):
        self.inner = SpacyExtractor()
        self.name = self.inner.name
        self.fail_on = fail_on

    def extract(self, chunks: Sequence[Chunk]) -> list[Extraction]:
        for chunk in chunks:
            if chunk.doc_id in self.fail_on:
                raise ExtractionError(f"cannot extract document {chunk.doc_id!r}")
        return self.inner.extract(chunks)


class WrongDimensionEmbedder:
    """The real embedder, returning one column too few for calls that include a marked text: the
    failure then comes from DuckDB in the middle of the write transaction."""

    def __init__(self, inner, marker: str):
        self.inner = inner
        self.name = inner.name
        self.dimension = inner.dimension
        self.marker = marker

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        vectors = self.inner.embed(texts)
        if any(self.marker in t for t in texts):
            return np.ascontiguousarray(vectors[:, :-1])
        return vectors


def test_failed_extraction_batch_leaves_the_index_as_after_the_first_batch(make_index, inline_docs):
    hg = make_index()
    hg.indexer._extractor = FailingExtractor({"tennessee"})
    docs = inline_docs[:4] + [dict(inline_docs[0], text=inline_docs[0]["text"] + " It is widely cited.")] \
        + inline_docs[9:12]
    with pytest.raises(ExtractionError, match="tennessee"):
        hg.add_documents(docs, batch_size=4)
    reference = make_index("reference")
    reference.add_documents(inline_docs[:4])
    assert_same_index(dump_index(hg), dump_index(reference))
    assert hg.store.meta_get("generation") == 1
    check_consistency(hg)
    # re-running without the failure resumes: the first batch is unchanged, the rest is added;
    # the result equals the same run on the index that never saw the failure
    hg.indexer._extractor = None
    for index in (hg, reference):
        report = index.add_documents(docs, batch_size=4)
        assert (report.added, report.replaced, report.unchanged) == (3, 1, 4)
    assert_same_index(dump_index(hg), dump_index(reference))


def test_failure_inside_the_write_transaction_rolls_back(make_index, embedder, inline_docs):
    hg = make_index(embedder=WrongDimensionEmbedder(embedder, marker="BOOM"))
    hg.add_documents(inline_docs[:4])
    before = dump_index(hg)
    meta = hg.store.meta_all()
    bad_batch = [
        dict(inline_docs[0], text="The Journal of Psychotherapy Integration moved to Springer."),  # replaces
        inline_docs[5],
        {"id": "boom", "title": "BOOM", "text": "BOOM is a word that appears in comics."},
    ]
    with pytest.raises(Exception) as err:  # a DuckDB conversion error, mid-transaction
        hg.add_documents(bad_batch)
    assert dump_index(hg) == before
    assert hg.store.meta_all() == meta  # id counters and generation rolled back too
    check_consistency(hg)
    # the handle is still usable afterwards
    report = hg.add_documents(bad_batch[:2])
    assert (report.added, report.replaced) == (1, 1)
    check_consistency(hg)
    fresh = make_index("fresh")
    fresh.add_documents([bad_batch[0]] + inline_docs[1:4] + [inline_docs[5]])
    assert_same_index(dump_index(hg), dump_index(fresh))
    # the error raised is the real cause (the vector that does not fit), not a follow-up error
    message = str(err.value)
    assert "aborted" not in message and re.search(r"\b38[34]\b", message), message


def test_full_disk_reports_the_failed_commit_and_keeps_the_committed_batches(
        small_disk, make_index, embedder, inline_docs, inline_template):
    """The disk fills up after the first batch: the second batch's COMMIT fails (DuckDB cannot
    write its WAL), and that is the error raised, not the FAISS save that follows and fails too."""
    db = small_disk / "ix"
    filled: list[Path] = []

    def fill_after_first_batch(_n: int) -> None:
        if not filled:
            filled.append(fill_disk(small_disk))

    hg = hipgraph.open(db, create=True, config=index_config(), embedder=embedder)
    try:
        with pytest.raises(StoreError) as err:
            hg.add_documents(inline_docs, batch_size=4, progress=fill_after_first_batch)
        message = str(err.value)
        assert "No space left on device" in message and f"{db / 'graph.duckdb'}" in message, message
        assert "faiss" not in message.lower(), message  # not the follow-up failure
        assert isinstance(err.value.__cause__, duckdb.Error)
        # a FAISS save that failed leaves no temporary file holding on to the space
        assert sorted(p.name for p in db.iterdir()) == [
            "entity.faiss", "fact.faiss", "graph.duckdb", "graph.duckdb.wal", "passage.faiss"]
        reference = make_index("reference")
        reference.add_documents(inline_docs[:4])
        after, expected = dump_index(hg), dump_index(reference)
        # the FAISS files stay as last saved (the empty index: saves come at the end of the call)
        assert after["faiss"] == {"passage": 0, "entity": 0, "fact": 0}
        after["faiss"] = expected["faiss"]
        assert_same_index(after, expected)  # DuckDB holds the first batch, whole
        for kind, index in hg.vectors.indexes.items():  # and so does FAISS in memory
            assert index.ids().tolist() == hg.store.vector_ids(kind).tolist(), kind
    finally:
        hg.close()
    filled[0].unlink()  # space freed: the index reopens as committed, and searches
    hg = hipgraph.open(db, embedder=embedder)
    try:
        assert_same_index(dump_index(hg), expected)
        check_consistency(hg)  # FAISS files on disk hold DuckDB's vectors (rebuilt where stale)
        hits = hg.retrieve("Who developed person-centered therapy?", k=2, mode="dense")
        assert [h.doc_id for h in hits][:1] == ["pct"]
        report = hg.add_documents(inline_docs, batch_size=4)  # re-running resumes
        assert (report.added, report.unchanged) == (8, 4)
        assert_same_index(dump_index(hg), dump_index(inline_template))
    finally:
        hg.close()


def _snapshot_arrays(hg) -> dict[str, np.ndarray]:
    from hipgraph.query.view import ReadView

    with hg.store.lock.shared():
        snap = ReadView(hg.store, hg.vectors, hg.store.generation, persist=False).snapshot()
    return {name: getattr(snap, name) for name in ("passage_ids", "entity_ids", "indptr", "indices", "weights")}


def test_fact_edge_counts_are_partial_rows_that_fold_to_the_same_graph(make_index, sample_docs, monkeypatch):
    """A batch appends its fact-edge counts as partial rows (no scan of the fact edges). Folding
    them after every batch, or not at all during the call, gives the graph of the default build;
    readers sum partial rows (graph snapshot, stats), and a fold leaves one row per edge."""
    from hipgraph.indexers import pipeline

    # the two Curie documents fall into different batches and count the same pairs
    docs = ([{"id": "curie-lab", "title": "Curie lab", "text": "Marie Curie worked with Pierre Curie at the Sorbonne in Paris."}]
            + [dict(d) for d in sample_docs[:12]]
            + [{"id": "curie-wedding", "title": "Curie wedding", "text": "Pierre Curie married Marie Curie in Paris in 1895."}])
    ref = make_index("ref")
    ref.add_documents(docs, batch_size=3)
    check_consistency(ref)
    want, want_snap = dump_index(ref), _snapshot_arrays(ref)
    assert want["stats"]["edges"]["fact"] > 0

    folds = []
    fold = pipeline.fold_fact_edges
    monkeypatch.setattr(pipeline, "fold_fact_edges", lambda store: folds.append(1) or fold(store))
    monkeypatch.setattr(pipeline, "FOLD_MIN_ROWS", 1)
    monkeypatch.setattr(pipeline, "FOLD_SHARE", 10**9)
    eager = make_index("eager")
    eager.add_documents(docs, batch_size=3)
    assert len(folds) >= 4  # inside the batches (the last leaves the end of the call nothing to fold)
    check_consistency(eager)
    assert_same_index(dump_index(eager), want)

    monkeypatch.setattr(pipeline, "FOLD_MIN_ROWS", 10**9)
    monkeypatch.setattr(pipeline.Indexer, "_fold_fact_edges", lambda self: None)
    lazy = make_index("lazy")
    lazy.add_documents(docs, batch_size=3)
    rows, pairs = lazy.store.con.execute(
        "SELECT count(*), count(DISTINCT (src, dst)) FROM edges WHERE type = 'fact'").fetchall()[0]
    assert rows > pairs  # the partial rows of pairs counted in more than one batch are there
    assert lazy.stats() == ref.stats()
    got = _snapshot_arrays(lazy)
    for name, array in want_snap.items():
        assert got[name].dtype == array.dtype and np.array_equal(got[name], array), name
    monkeypatch.undo()
    lazy.indexer._fold_fact_edges()
    check_consistency(lazy)
    assert_same_index(dump_index(lazy), want)
