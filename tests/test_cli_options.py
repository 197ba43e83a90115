"""The CLI options the README documents, each run through the real command line (a subprocess)
and checked for its effect: ``index --extractor llm | precomputed:FILE``, ``--vector-index``,
``--granularity``, ``--llm-segments``; ``query --fact-filter``, ``--llm-steps``; and the
``HIPGRAPH_LLM_BASE_URL`` / ``HIPGRAPH_LLM_MODEL`` defaults of ``--llm-base-url`` / ``--llm-model``.
The LLM is the local OpenAI-protocol server of tests/openai_server.py."""

from __future__ import annotations

import json

import faiss
import numpy as np
import pytest
from conftest import MULTIHOP_QUESTION, REPO, copy_index, run_cli
from test_conversations import _conversation
from test_llm_indexing import DOCS, NER, TRIPLES  # the scripted extraction replies

import hipgraph
from hipgraph.config import EmbedderConfig
from hipgraph.errors import SessionConfigError

try:
    from tests.openai_server import ScriptedOpenAIServer
except ImportError:  # tests/ is not a package: pytest puts it on sys.path
    from openai_server import ScriptedOpenAIServer



@pytest.fixture(autouse=True)
def no_llm_environment(monkeypatch):
    """Only a test that sets HIPGRAPH_LLM_* sees them (the developer's shell may have them)."""
    for name in ("HIPGRAPH_LLM_BASE_URL", "HIPGRAPH_LLM_MODEL"):
        monkeypatch.delenv(name, raising=False)


def _jsonl(path, records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def _ok(proc) -> dict:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _facts(hg) -> set[tuple[str, str, str]]:
    return set(hg.store.con.execute("""
        SELECT s.name, f.relation, o.name FROM facts f
        JOIN entities s ON s.id = f.subject_id JOIN entities o ON o.id = f.object_id
        WHERE f.kind = 'triple'""").fetchall())


def _extractors(hg) -> set[str]:
    return {r[0] for r in hg.store.con.execute("SELECT DISTINCT extractor FROM fact_sources").fetchall()}


def _faiss_layouts(db) -> dict[str, type]:
    """The class of the index inside each saved FAISS file (IndexIDMap2 around it)."""
    out = {}
    for kind in ("passage", "entity", "fact"):
        saved = faiss.read_index(str(db / f"{kind}.faiss"))
        assert isinstance(saved, faiss.IndexIDMap2), type(saved)
        out[kind] = type(faiss.downcast_index(saved.index))
    return out


def _units(hg) -> dict[str, list[int]]:
    """Per session document: the turn positions (0-based) at which its memory units start."""
    out = {}
    for key, raw in hg.store.con.execute("SELECT key, metadata FROM documents").fetchall():
        meta = json.loads(raw)
        starts = [t[2] for t in meta["turns"]]
        out[key] = [starts.index(a) for a, _ in meta["units"]]
    return out


# ------------------------------------------------------------------ index
def test_index_extractor_llm_from_the_environment_and_hnsw(tmp_path, monkeypatch):
    def reply(body):
        user = body["messages"][-1]["content"]
        marker = next(m for m in NER if m in user)
        if '"named_entities"' in user:  # the triple step lists the entities found
            return json.dumps({"triples": TRIPLES[marker]})
        return json.dumps({"named_entities": NER[marker]})

    source = tmp_path / "docs.jsonl"
    _jsonl(source, DOCS)
    db = tmp_path / "ix"
    with ScriptedOpenAIServer(chat_handler=reply) as srv:
        monkeypatch.setenv("HIPGRAPH_LLM_BASE_URL", srv.base_url)  # no --llm-* flags given
        monkeypatch.setenv("HIPGRAPH_LLM_MODEL", "env-model")
        out = _ok(run_cli("index", "--db", str(db), str(source), "--extractor", "llm",
                          "--vector-index", "hnsw", "--json", "-q"))
        models = [body["model"] for _, body, _ in srv.chat_requests]
    assert out["report"]["added"] == 2
    assert models == ["env-model"] * 4  # entities, then triples, per passage
    with hipgraph.open(db, read_only=True) as hg:
        assert _facts(hg) == {("isaac newton", "wrote", "principia"), ("principia", "published in", "1687"),
                              ("radio city", "located in", "india")}
        assert _extractors(hg) == {"llm:env-model"}
        assert hg.config.vectors.kind == "hnsw"
    assert set(_faiss_layouts(db).values()) == {faiss.IndexHNSWFlat}


def test_index_extractor_precomputed_and_flat(tmp_path):
    corpus = [{"idx": 0, "title": DOCS[0]["title"], "text": DOCS[0]["text"]},
              {"idx": 1, "title": DOCS[1]["title"], "text": DOCS[1]["text"]},
              {"idx": 2, "title": "Hank Snow", "text": "Hank Snow recorded Hello Love in 1974."}]
    bundle = tmp_path / "bundle.json"
    bundle.write_text(json.dumps({"corpus": corpus, "questions": []}), encoding="utf-8")
    openie = tmp_path / "openie.json"  # HippoRAG's OpenIE layout, keyed by idx; idx 2 is absent
    openie.write_text(json.dumps({"extractions": [
        {"idx": 0, "passage": DOCS[0]["text"], "entities": ["Isaac Newton", "Principia"],
         "triples": [["Isaac Newton", "authored", "Principia"]]},
        {"idx": 1, "passage": DOCS[1]["text"], "entities": ["Radio City", "India"],
         "triples": [["Radio City", "broadcasts in", "India"], ["Radio City", "only two"]]},
    ]}), encoding="utf-8")
    db = tmp_path / "ix"
    out = _ok(run_cli("index", "--db", str(db), str(bundle), "--extractor", f"precomputed:{openie}",
                      "--vector-index", "flat", "--json", "-q"))
    assert out["report"]["added"] == 3
    with hipgraph.open(db, read_only=True) as hg:
        # exactly the file's triples (the malformed one dropped), none of spaCy's
        assert _facts(hg) == {("isaac newton", "authored", "principia"), ("radio city", "broadcasts in", "india")}
        assert _extractors(hg) == {"precomputed:openie.json"}
        entities = {r[0] for r in hg.store.con.execute("SELECT name FROM entities").fetchall()}
        assert "hank snow" not in entities and "hello love" not in entities  # no extraction for idx 2
        assert hg.config.vectors.kind == "flat"
    assert set(_faiss_layouts(db).values()) == {faiss.IndexFlatIP}
    # a later run does not read the file again unless it is named: an index never supplies paths
    more = tmp_path / "more.jsonl"
    _jsonl(more, [{"id": "3", "text": "Hank Snow toured Canada."}])
    again = run_cli("index", "--db", str(db), str(more), "-q")
    assert again.returncode == 2 and "Traceback" not in again.stderr, again.stderr
    assert "precomputed extractor" in again.stderr and "--extractor precomputed:FILE" in again.stderr
    with hipgraph.open(db, read_only=True) as hg:
        assert hg.stats()["documents"] == 3  # nothing written


def test_index_conversation_by_turn_with_ivf(tmp_path):
    path = tmp_path / "conv.json"
    path.write_text(json.dumps(_conversation()), encoding="utf-8")
    db = tmp_path / "ix"
    out = _ok(run_cli("index", "--db", str(db), "--format", "conversation", str(path),
                      "--granularity", "turn", "--vector-index", "ivf", "--json", "-q"))
    assert out["report"]["passages"] == 18 == out["stats"]["passages"]  # 3 + 12 + 3 turns
    with hipgraph.open(db, read_only=True) as hg:
        assert _units(hg) == {"ana-ben#1": [0, 1, 2], "ana-ben#2": list(range(12)), "ana-ben#3": [0, 1, 2]}
        assert hg.config.vectors.kind == "ivf"
    # ivf is kept as the layout to use; below vectors.min_train_size (20,000) the files stay exact
    assert set(_faiss_layouts(db).values()) == {faiss.IndexFlatIP}


def test_index_conversation_with_llm_segments(tmp_path):
    def reply(body):
        turns = body["messages"][-1]["content"]
        if "football" in turns:  # session 2: cooking, then football from turn 7
            return json.dumps({"boundaries": [7]})
        return "no idea"  # sessions 1 and 3: unusable replies, segmented from embeddings instead

    path = tmp_path / "conv.json"
    path.write_text(json.dumps(_conversation()), encoding="utf-8")
    db = tmp_path / "ix"
    with ScriptedOpenAIServer(chat_handler=reply) as srv:
        out = _ok(run_cli("index", "--db", str(db), "--format", "conversation", str(path), "--llm-segments",
                          "--llm-base-url", srv.base_url, "--llm-model", "segmenter", "--json", "-q"))
        models = [body["model"] for _, body, _ in srv.chat_requests]
    assert models == ["segmenter"] * 3  # one call per session
    assert sum("LLM segmentation failed" in w for w in out["report"]["warnings"]) == 2
    with hipgraph.open(db, read_only=True) as hg:
        units = _units(hg)
    assert units["ana-ben#2"] == [0, 6]  # exactly the model's cut before turn 7
    assert units["ana-ben#1"] == [0] and units["ana-ben#3"] == [0]


# ------------------------------------------------------------------ eval
def test_eval_locomo_embeds_with_the_embed_flags(tmp_path, monkeypatch):
    """``eval --format locomo`` builds and reads each conversation's index with the embedder the
    --embed-* flags name, as index and query do: the endpoint receives the turns and questions
    (with the key of --embed-api-key-env), the index records that model, and the turn-dense
    baseline's recall equals cosine ranking of the endpoint's vectors (computed here, in numpy)."""
    monkeypatch.setenv("EVAL_EMBED_KEY", "sk-eval")
    raw = json.loads((REPO / "data" / "locomo_conv30.json").read_text(encoding="utf-8"))
    (conv,) = raw["conversations"]
    questions = [q for q in conv["questions"] if q.get("evidence_dia_ids")][:3]
    db = tmp_path / "mem"
    with ScriptedOpenAIServer() as srv:  # 16-d vectors
        out = _ok(run_cli("eval", "--db", str(db), "--format", "locomo", str(REPO / "data" / "locomo_conv30.json"), "--modes", "dense",
                          "--k", "1,5", "--limit", "3", "--json", "-q", "--embedder", "openai",
                          "--embed-base-url", srv.base_url, "--embed-model", "emb",
                          "--embed-api-key-env", "EVAL_EMBED_KEY"))
        sent = [text for _, body, _ in srv.embedding_requests for text in body["input"]]
        keys = {headers.get("authorization") for *_, headers in srv.embedding_requests}
        vector_for = srv.vector_for
    turn_lines = [f"{t['speaker']}: {t['text']}" + (f" [shares an image: {t['blip_caption']}]"
                                                  if t.get("blip_caption") else "") for t in conv["turns"]]
    assert set(turn_lines) <= set(sent)  # the turn-dense baseline (and segmentation) embedded here
    assert {q["question"] for q in questions} <= set(sent)
    assert keys == {"Bearer sk-eval"}
    with pytest.raises(SessionConfigError):  # built with the endpoint's model
        hipgraph.open(db / "conv-30", read_only=True)
    with hipgraph.open(db / "conv-30", read_only=True, embedder=EmbedderConfig(
            name="openai", base_url="http://127.0.0.1:9/v1", model="emb")) as hg:
        assert (hg.store.meta_get("embedder"), hg.store.meta_get("dimension")) == ("openai:emb", 16)

    def unit(texts):
        v = np.array([vector_for(t) for t in texts])
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    order = np.argsort(-(unit([q["question"] for q in questions]) @ unit(turn_lines).T), axis=1)
    ids = [t["dia_id"] for t in conv["turns"]]
    baseline = next(r for r in out["results"] if r["mode"] == "turn-dense")
    for k in (1, 5):
        recall = [len(set(q["evidence_dia_ids"]) & {ids[i] for i in row[:k]}) / len(set(q["evidence_dia_ids"]))
                  for q, row in zip(questions, order, strict=True)]
        assert baseline[f"recall@{k}"] == round(100 * sum(recall) / len(recall), 2)


# ------------------------------------------------------------------ query
def test_query_fact_filter_keeps_the_models_facts(inline_template, tmp_path, monkeypatch):
    chosen = []

    def keep_publisher_facts(body):
        user = body["messages"][-1]["content"]
        candidates = json.loads(user.split("Candidate facts: ", 1)[1].rsplit("\nOutput:", 1)[0])["fact"]
        kept = [c for c in candidates if "published" in c[1]]
        chosen.append(kept)
        return json.dumps({"fact": kept})

    db = copy_index(inline_template, tmp_path)
    monkeypatch.setenv("HIPGRAPH_LLM_MODEL", "env-model")  # the flags win over the environment
    with ScriptedOpenAIServer(chat_handler=keep_publisher_facts) as srv:
        out = _ok(run_cli("query", "--db", str(db), MULTIHOP_QUESTION, "-k", "3", "--json", "--fact-filter",
                          "--llm-base-url", srv.base_url, "--llm-model", "judge"))
        models = [body["model"] for _, body, _ in srv.chat_requests]
    assert models == ["judge"]
    why = out["hits"][0]["why"]
    kept = {(f["subject"], f["relation"], f["object"]) for f in why["seed_facts"]}
    assert kept and kept == {tuple(c) for c in chosen[0]}
    assert why["fact_filter"].startswith(f"kept {len(kept)} of ")


def test_query_llm_steps_decompose_from_the_environment(inline_template, tmp_path, monkeypatch):
    steps = ["Which organization published the Journal of Psychotherapy Integration?",
             "Who was the first president of #1?"]

    def reply(body):
        system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
        if "split a multi-hop question" in system:
            return json.dumps({"steps": steps})
        step = user.split("Sub-question: ", 1)[1].split("\n", 1)[0]
        if "Journal of Psychotherapy" in step:
            return json.dumps({"answer": "American Psychological Association", "sufficient": True})
        return json.dumps({"answer": "G. Stanley Hall", "sufficient": True})

    db = copy_index(inline_template, tmp_path)
    with ScriptedOpenAIServer(chat_handler=reply) as srv:
        monkeypatch.setenv("HIPGRAPH_LLM_BASE_URL", srv.base_url)
        monkeypatch.setenv("HIPGRAPH_LLM_MODEL", "env-model")
        out = _ok(run_cli("query", "--db", str(db), MULTIHOP_QUESTION, "--mode", "decompose", "--llm-steps",
                          "-k", "3", "--json"))
        models = {body["model"] for _, body, _ in srv.chat_requests}
    trace = out["trace"]
    assert models == {"env-model"}
    assert trace["source"] == "llm" and [s["text"] for s in trace["steps"]] == steps
    first, second = trace["steps"]
    assert first["bridge"] == "American Psychological Association" and first["bridge_source"] == "llm"
    assert second["attempts"][0]["queries"][0][0] == \
        "Who was the first president of American Psychological Association?"
    assert {"jpi", "apa"} <= {h["doc_id"] for h in out["hits"]}
