"""``hipgraph mcp``: the real server process over stdio, driven by the MCP SDK's own client."""

from __future__ import annotations

import asyncio
import json
import os
import sys

from conftest import REPO
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


def _payload(result) -> dict:
    assert not result.is_error, result.content
    return json.loads(result.content[0].text)


async def _session(db, steps):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "hipgraph", "mcp", "--db", str(db), "--create"],
                                   env=env, cwd=str(REPO))
    with open(os.devnull, "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            return await steps(session)


def test_mcp_tools_remember_recall_documents_answer_stats(tmp_path):
    async def steps(s: ClientSession):
        tools = {t.name: t for t in (await s.list_tools()).tools}
        assert set(tools) == {"remember", "add_documents", "recall", "answer", "stats"}
        schema = tools["remember"].input_schema
        assert set(schema["required"]) == {"conversation", "turns"} and "time" in schema["properties"]
        assert "conversation" in tools["remember"].description.lower()
        first = _payload(await s.call_tool("remember", {
            "conversation": "ana", "session": "1", "time": "2023-01-15 10:00",
            "turns": [{"speaker": "Ana", "text": "I live in Lisbon now."},
                      {"speaker": "Ben", "text": "Lovely, enjoy the sun!"}]}))
        assert first["session"] == "1" and first["added"] == 1
        second = _payload(await s.call_tool("remember", {
            "conversation": "ana", "time": "2023-06-10 18:00",
            "turns": [{"speaker": "Ana", "text": "Big news: I live in Berlin now."}]}))
        assert second["added"] == 1 and second["session"] != "1"
        hits = _payload(await s.call_tool("recall", {"question": "Where does Ana live?", "k": 2}))["hits"]
        assert hits[0]["text"] == "Ana: Big news: I live in Berlin now." and hits[0]["conversation"] == "ana"
        past = _payload(await s.call_tool("recall", {"question": "Where does Ana live?", "as_of": "2023-02-01"}))
        assert past["hits"][0]["text"] == "Ana: I live in Lisbon now."
        docs = _payload(await s.call_tool("add_documents", {"documents": [
            {"id": "note-1", "text": "Ana's favourite cafe in Berlin is Cafe Einstein."}]}))
        assert docs["added"] == 1
        cafe = _payload(await s.call_tool("recall", {"question": "Which cafe does Ana like?", "k": 3}))["hits"]
        assert any(h["doc_id"] == "note-1" for h in cafe)
        answer = _payload(await s.call_tool("answer", {"question": "Where does Ana live?"}))
        assert "Berlin" in answer["context"]
        stats = _payload(await s.call_tool("stats", {}))
        assert stats["documents"] == 3
        bad = await s.call_tool("remember", {"conversation": "ana", "turns": [{"speaker": "Ana"}]})
        assert bad.is_error and "field 'text' must be a non-empty string" in bad.content[0].text
        wrong = await s.call_tool("recall", {"question": "x", "k": "many"})
        assert wrong.is_error and "k" in wrong.content[0].text
        return True

    assert asyncio.run(_session(tmp_path / "memory", steps))
