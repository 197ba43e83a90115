"""Trust: an index folder is data, not configuration of the user's network and secrets.

Whatever an index's saved config says, the endpoint text is sent to, the environment variable sent
as the API key and the files read come from the session (``hipgraph.open`` arguments, CLI flags,
environment). The endpoint stand-in is the real local server of tests/openai_server.py, which
records every request it gets."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import duckdb
import pytest
from conftest import copy_index, run_cli

import hipgraph
from hipgraph import ConfigError, EmbedderConfig, ExtractorConfig, IndexConfig, SessionConfigError

try:
    from tests.openai_server import ScriptedOpenAIServer
except ImportError:  # tests/ is not a package: pytest puts it on sys.path
    from openai_server import ScriptedOpenAIServer

SECRET_ENV = "HIPGRAPH_TEST_SECRET"
SECRET = "sk-must-not-leave-this-machine"
QUESTION = "my private question"
DOCS = [{"id": "a", "title": "Kalo Mirten", "text": "Kalo Mirten founded Vas Labs in Oslo."},
        {"id": "b", "title": "Vas Labs", "text": "Vas Labs builds tidal turbines."}]


def _meta(db: Path) -> dict[str, Any]:
    con = duckdb.connect(str(db / "graph.duckdb"), read_only=True)
    try:
        return {k: json.loads(v) for k, v in con.execute("SELECT key, value FROM meta").fetchall()}
    finally:
        con.close()


def _edit_meta(db: Path, key: str, value: Any) -> None:
    """What anyone handing over an index folder can do: rewrite a ``meta`` row."""
    con = duckdb.connect(str(db / "graph.duckdb"))
    try:
        con.execute("UPDATE meta SET value = ? WHERE key = ?", [json.dumps(value), key])
    finally:
        con.close()


def _extractions(path: Path, triples: dict[str, list[list[str]]]) -> ExtractorConfig:
    """The precomputed extractor over ``path``, holding ``triples`` per document id."""
    path.write_text(json.dumps({"extractions": [
        {"id": doc_id, "entities": sorted({t[0] for t in ts} | {t[2] for t in ts}), "triples": ts}
        for doc_id, ts in triples.items()]}), encoding="utf-8")
    return ExtractorConfig(name="precomputed", precomputed_path=str(path))


def test_an_edited_index_sends_no_question_and_no_secret(inline_template, tmp_path, monkeypatch):
    """The attack: a copy's meta points the embedder at a server, with a secret as its key."""
    monkeypatch.setenv(SECRET_ENV, SECRET)
    with ScriptedOpenAIServer(embedding_dim=384) as srv:
        db = copy_index(inline_template, tmp_path)
        config = _meta(db)["config"]
        config["embedder"].update(name="openai", base_url=srv.base_url, model="spy",
                                  api_key_env=SECRET_ENV, dimension=384)
        _edit_meta(db, "config", config)
        _edit_meta(db, "embedder", "openai:spy")
        with (pytest.raises(SessionConfigError, match=r"remote embedder 'openai:spy'.*base_url=URL"),
              hipgraph.open(db, read_only=True) as hg):
            hg.retrieve(QUESTION, k=1, mode="dense")
        proc = run_cli("query", "--db", str(db), QUESTION, "--mode", "dense")
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith(f"hipgraph: error: index {db} was built with the remote embedder")
        assert "--embedder openai --embed-base-url URL --embed-model spy" in proc.stderr
        assert "Traceback" not in proc.stderr
        assert srv.requests == []  # neither the question nor the secret reached it


def test_an_edited_llm_extractor_receives_no_document(inline_template, tmp_path, monkeypatch):
    monkeypatch.setenv(SECRET_ENV, SECRET)
    with ScriptedOpenAIServer() as srv:
        db = copy_index(inline_template, tmp_path)
        config = _meta(db)["config"]
        config["extractor"].update(name="llm", chat={"base_url": srv.base_url, "model": "spy",
                                                     "api_key_env": SECRET_ENV})
        _edit_meta(db, "config", config)
        with hipgraph.open(db) as hg:
            before = hg.stats()
            assert [h.doc_id for h in hg.retrieve("Journal of Psychotherapy Integration", k=1,
                                                  mode="bm25")] == ["jpi"]  # reading needs no extractor
            with pytest.raises(SessionConfigError, match=r"llm extractor.*--extractor llm"):
                hg.add_documents([{"id": "new", "text": "A private document about Vas Labs."}])
            assert hg.stats() == before
        assert srv.requests == []


def test_an_openai_index_reopens_with_the_sessions_endpoint_only(tmp_path, monkeypatch):
    monkeypatch.setenv(SECRET_ENV, SECRET)
    with ScriptedOpenAIServer() as srv:  # 16-d vectors
        session = EmbedderConfig(name="openai", base_url=srv.base_url, model="emb",
                                 api_key_env=SECRET_ENV)
        db = tmp_path / "ix"
        extractor = _extractions(tmp_path / "openie.json", {"a": [], "b": []})
        with hipgraph.open(db, create=True, config=IndexConfig(embedder=session, extractor=extractor)) as hg:
            hg.add_documents(DOCS)
        meta = _meta(db)
        assert (meta["embedder"], meta["dimension"], meta["config"]["embedder"]["model"]) == ("openai:emb", 16, "emb")
        saved = json.dumps(meta)  # the index records the model, not where it is or whose key
        assert srv.base_url not in saved and "127.0.0.1" not in saved
        assert SECRET_ENV not in saved
        assert str(tmp_path) not in saved  # no path (the extractor's name keeps the file's name)
        built = len(srv.requests)

        with pytest.raises(SessionConfigError, match=r"'openai:emb'.*model='emb', base_url=URL"):
            hipgraph.open(db, read_only=True)
        proc = run_cli("stats", "--db", str(db))
        assert proc.returncode == 2, proc.stderr
        assert "--embed-base-url URL --embed-model emb [--embed-api-key-env VAR]" in proc.stderr
        assert "Traceback" not in proc.stderr
        with pytest.raises(ConfigError, match="differs in model"):
            hipgraph.open(db, read_only=True, embedder=dataclasses.replace(session, model="other"))
        with pytest.raises(ConfigError, match="differs in dimension"):
            hipgraph.open(db, read_only=True, embedder=dataclasses.replace(session, dimension=32))
        assert len(srv.requests) == built

        with hipgraph.open(db, read_only=True, embedder=session) as hg:
            assert len(hg.retrieve(QUESTION, k=1, mode="dense")) == 1
        path, body, headers = srv.requests[-1]
        assert (path, body["input"], body["model"]) == ("/v1/embeddings", [QUESTION], "emb")
        assert headers["authorization"] == f"Bearer {SECRET}"  # the session's key variable
        out = run_cli("query", "--db", str(db), "--json", "-k", "2", "--mode", "dense", "--embedder",
                      "openai", "--embed-base-url", srv.base_url, "--embed-model", "emb",
                      "--embed-api-key-env", SECRET_ENV, QUESTION)
        assert out.returncode == 0, out.stderr
        assert sorted(h["doc_id"] for h in json.loads(out.stdout)["hits"]) == ["a", "b"]
        assert len(srv.requests) == built + 2


def test_a_saved_precomputed_path_is_not_read_again(tmp_path):
    db = tmp_path / "ix"
    extractor = _extractions(tmp_path / "openie.json", {
        "a": [["Kalo Mirten", "founded", "Vas Labs"]], "b": [["Vas Labs", "builds", "tidal turbines"]]})
    config = IndexConfig(embedder=EmbedderConfig(name="hashing", dimension=32), extractor=extractor)
    with hipgraph.open(db, create=True, config=config) as hg:
        hg.add_documents(DOCS[:1])
    assert str(tmp_path) not in json.dumps(_meta(db))
    old_style = _meta(db)["config"]  # an index saved before this rule, or edited, holds the path
    old_style["extractor"]["precomputed_path"] = extractor.precomputed_path
    _edit_meta(db, "config", old_style)
    with hipgraph.open(db) as hg:
        with pytest.raises(SessionConfigError, match=r"precomputed extractor.*precomputed_path=FILE"):
            hg.add_documents(DOCS[1:])
        assert hg.stats()["documents"] == 1
    with hipgraph.open(db, extractor=extractor) as hg:  # the session names the file: it is read
        assert hg.add_documents(DOCS[1:]).added == 1
        facts = hg.store.con.execute("SELECT relation FROM facts WHERE kind = 'triple'").fetchall()
    assert sorted(r[0] for r in facts) == ["builds", "founded"]


def test_a_model_folder_comes_from_the_session(inline_template, tmp_path):
    """An index built with a MiniLM from a folder: the folder is not read from the index."""
    from hipgraph.models.embedders import packaged_minilm_path

    db = copy_index(inline_template, tmp_path)
    folder = tmp_path / "custom"
    folder.symlink_to(packaged_minilm_path(), target_is_directory=True)  # the same weights
    config = _meta(db)["config"]
    config["embedder"]["model_path"] = str(tmp_path / "elsewhere" / "custom")  # saved by old versions
    _edit_meta(db, "config", config)
    _edit_meta(db, "embedder", "minilm:custom")
    with (pytest.raises(SessionConfigError, match=r"'minilm:custom'.*model_path=FOLDER"),
          hipgraph.open(db, read_only=True) as hg):
        hg.retrieve(QUESTION, k=1, mode="dense")
    session = EmbedderConfig(precision="fp32", model_path=str(folder))
    with hipgraph.open(db, read_only=True, embedder=session) as hg:
        hits = hg.retrieve("Which association publishes the Journal of Psychotherapy Integration?",
                           k=1, mode="dense")
    assert [h.doc_id for h in hits] == ["jpi"]
