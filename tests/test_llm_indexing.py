"""The llm extractor inside an index: replies cached in DuckDB, so re-indexing makes no calls."""

from __future__ import annotations

from typing import Any

import pytest

from hipgraph.config import ChatConfig, ExtractorConfig

try:
    from tests.openai_server import ScriptedOpenAIServer
except ImportError:  # tests/ is not a package: pytest puts it on sys.path
    from openai_server import ScriptedOpenAIServer

DOCS = [
    {"id": "newton", "title": "Isaac Newton", "text": "Isaac Newton wrote the Principia in 1687."},
    {"id": "radio", "title": "Radio City", "text": "Radio City is India's first private FM radio station."},
]
NER = {"Isaac Newton wrote": ["Isaac Newton", "Principia", "1687"], "Radio City is": ["Radio City", "India"]}
TRIPLES = {
    "Isaac Newton wrote": [["Isaac Newton", "wrote", "Principia"], ["Principia", "published in", "1687"]],
    "Radio City is": [["Radio City", "located in", "India"]],
}


def _handler(body: dict[str, Any]) -> str:
    import json

    user = body["messages"][-1]["content"]
    for marker in NER:
        if marker in user:
            if '"named_entities"' in user:  # the triple step lists the entities found
                return json.dumps({"triples": TRIPLES[marker]})
            return json.dumps({"named_entities": NER[marker]})
    raise AssertionError(f"unexpected prompt {user!r}")


@pytest.fixture
def server():
    with ScriptedOpenAIServer(chat_handler=_handler) as srv:
        yield srv


def _llm(server) -> ExtractorConfig:
    return ExtractorConfig(name="llm", chat=ChatConfig(base_url=server.base_url, model="test-model",
                                                       max_retries=0))


def _facts(hg) -> set[tuple[str, str, str]]:
    return set(hg.store.con.execute("""
        SELECT s.name, f.relation, o.name FROM facts f
        JOIN entities s ON s.id = f.subject_id JOIN entities o ON o.id = f.object_id""").fetchall())


def test_llm_extraction_builds_the_graph_and_is_cached_in_duckdb(make_index, server):
    hg = make_index("llm", extractor=_llm(server))
    report = hg.add_documents(DOCS)
    assert report.added == 2
    assert len(server.chat_requests) == 4  # NER + triples per passage
    assert ("isaac newton", "wrote", "principia") in _facts(hg)
    assert ("radio city", "located in", "india") in _facts(hg)
    assert hg.store.meta_get("extractor") == "llm:test-model"
    sources = {r[0] for r in hg.store.con.execute("SELECT DISTINCT extractor FROM fact_sources").fetchall()}
    assert sources == {"llm:test-model"}
    cached = hg.store.con.execute("SELECT count(*), count(DISTINCT step) FROM llm_cache").fetchall()[0]
    assert cached[0] == 4

    # delete and re-add: the same passages are extracted again, from the cache only
    hg.delete_documents(["newton", "radio"])
    assert hg.stats()["facts"] == 0
    report = hg.add_documents(DOCS)
    assert report.added == 2 and len(server.chat_requests) == 4
    assert ("isaac newton", "wrote", "principia") in _facts(hg)


def test_llm_cache_survives_reopening(make_index, server, tmp_path):
    hg = make_index("llm2", extractor=_llm(server))
    hg.add_documents(DOCS[:1])
    hg.delete_documents(["newton"])
    hg.close()
    hg = make_index("llm2", extractor=_llm(server))
    hg.add_documents(DOCS[:1])
    assert len(server.chat_requests) == 2
