"""Chat client, OpenAI embedder, prompts and the LLM extractor against a real local server."""

from __future__ import annotations

import socket
import time
import zlib
from typing import Any

import httpx
import numpy as np
import pytest

from hipgraph.config import ChatConfig, EmbedderConfig, ExtractorConfig
from hipgraph.errors import ConfigError, EmbeddingError, ExtractionError, LLMError
from hipgraph.indexers.extract_base import MemoryResponseCache
from hipgraph.indexers.extract_llm import LLMExtractor, parse_triples
from hipgraph.models.chat import ChatClient, ChatResult, backoff_delay
from hipgraph.models.openai_embedder import OpenAIEmbedder
from hipgraph.prompts import load_prompt
from hipgraph.text.json_reply import parse_json_reply
from hipgraph.types import Chunk, Extraction, Triple

try:
    from tests.openai_server import ScriptedOpenAIServer
except ImportError:  # tests/ is not a package: pytest puts it on sys.path
    from openai_server import ScriptedOpenAIServer

KEY_ENV = "HIPGRAPH_TEST_API_KEY"


@pytest.fixture
def server():
    with ScriptedOpenAIServer(embedding_dim=12) as srv:
        yield srv


def chat_config(server: ScriptedOpenAIServer, **overrides: Any) -> ChatConfig:
    settings: dict[str, Any] = dict(
        base_url=server.base_url, model="test-model", api_key_env=KEY_ENV,
        timeout=5.0, max_retries=3, backoff=0.0, max_concurrency=4,
    )
    settings.update(overrides)
    return ChatConfig(**settings)


MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]

# ------------------------------------------------------------------------------------------------
# ChatClient
# ------------------------------------------------------------------------------------------------


def test_complete_sends_model_messages_json_mode_and_key(server, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sk-test-123")
    server.add("hello there")
    with ChatClient(chat_config(server)) as client:
        result = client.complete(MESSAGES, json_mode=True, max_tokens=64)
    assert isinstance(result, ChatResult)
    assert result.text == "hello there"
    assert result.model == "test-model"
    assert result.finish_reason == "stop"
    assert result.usage["total_tokens"] == 15
    [(path, body, headers)] = server.requests
    assert path == "/v1/chat/completions"
    assert body["model"] == "test-model"
    assert body["messages"] == MESSAGES
    assert body["response_format"] == {"type": "json_object"}
    assert body["max_tokens"] == 64
    assert body["temperature"] == 0.0
    assert headers["authorization"] == "Bearer sk-test-123"


def test_no_authorization_header_when_key_unset(server, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    server.add("ok")
    with ChatClient(chat_config(server)) as client:
        assert client.complete(MESSAGES).text == "ok"
    [(_, body, headers)] = server.requests
    assert "authorization" not in headers
    assert "response_format" not in body
    assert "max_tokens" not in body


def test_retries_on_500_and_429_then_succeeds(server):
    server.add((500, "boom"), (429, {"error": {"message": "rate"}}, {"Retry-After": "0"}), "fine")
    with ChatClient(chat_config(server, max_retries=3)) as client:
        assert client.complete(MESSAGES).text == "fine"
    assert len(server.requests) == 3


def test_retry_after_header_is_honoured(server):
    server.add((429, "slow down", {"Retry-After": "0.3"}), "ok")
    with ChatClient(chat_config(server)) as client:
        started = time.perf_counter()
        assert client.complete(MESSAGES).text == "ok"
        assert time.perf_counter() - started >= 0.3
    assert len(server.requests) == 2


def test_backoff_delay_doubles_and_caps():
    assert backoff_delay(0.5, 0) == 0.5
    assert backoff_delay(0.5, 3) == 4.0
    assert backoff_delay(1.0, 10) == 30.0
    assert backoff_delay(0.5, 0, "2") == 2.0
    assert backoff_delay(0.5, 0, "600") == 30.0
    assert backoff_delay(0.5, 1, "garbage") == 1.0


def test_gives_up_after_max_retries(server):
    server.add(*[(503, "upstream down")] * 3)
    with ChatClient(chat_config(server, max_retries=2)) as client, \
            pytest.raises(LLMError, match="503") as info:
        client.complete(MESSAGES)
    assert "upstream down" in str(info.value)
    assert isinstance(info.value.__cause__, httpx.HTTPStatusError)
    assert len(server.requests) == 3


def test_timeout_is_retried(server):
    server.add(("sleep", 1.0), "after timeout")
    with ChatClient(chat_config(server, timeout=0.5, max_retries=1)) as client:
        assert client.complete(MESSAGES).text == "after timeout"
    assert len(server.requests) == 2


def test_timeout_without_retries_raises(server):
    server.add(("sleep", 1.0))
    with ChatClient(chat_config(server, timeout=0.5, max_retries=0)) as client, \
            pytest.raises(LLMError, match="Timeout") as info:
        client.complete(MESSAGES)
    assert isinstance(info.value.__cause__, httpx.TimeoutException)


def test_400_fails_immediately(server):
    server.add((400, {"error": {"message": "unknown model"}}), "never sent")
    with ChatClient(chat_config(server, max_retries=3)) as client, \
            pytest.raises(LLMError, match="400") as info:
        client.complete(MESSAGES)
    assert "unknown model" in str(info.value)
    assert len(server.requests) == 1


@pytest.mark.parametrize("reply", [
    (200, "this is not json"),
    (200, {"choices": []}),
    (200, {"choices": [{"message": {"role": "assistant", "content": None}}]}),
    (200, {"error": {"message": "overloaded"}}),
])
def test_malformed_reply_raises(server, reply):
    server.add(reply)
    with ChatClient(chat_config(server)) as client, pytest.raises(LLMError):
        client.complete(MESSAGES)
    assert len(server.requests) == 1


def test_connection_error_is_retried_then_raises():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = ChatConfig(base_url=f"http://127.0.0.1:{port}/v1", model="m", max_retries=1, backoff=0)
    with ChatClient(config) as client, pytest.raises(LLMError, match="2 attempt"):
        client.complete(MESSAGES)


def _echo(body: dict[str, Any]) -> Any:
    content = body["messages"][-1]["content"]
    if content == "fail":
        return (400, "refused")
    time.sleep((zlib.crc32(content.encode()) % 5) * 0.01)  # finish out of order
    return "echo:" + content


def test_complete_many_keeps_input_order(server):
    server.chat_handler = _echo
    batch = [[{"role": "user", "content": f"m{i}"}] for i in range(12)]
    with ChatClient(chat_config(server, max_concurrency=4)) as client:
        results = client.complete_many(batch, json_mode=True)
    assert [r.text for r in results] == [f"echo:m{i}" for i in range(12)]
    assert len(server.requests) == 12
    assert all(body["response_format"] == {"type": "json_object"} for _, body, _ in server.requests)


def test_complete_many_errors(server):
    server.chat_handler = _echo
    batch = [[{"role": "user", "content": c}] for c in ("a", "fail", "b")]
    with ChatClient(chat_config(server)) as client:
        with pytest.raises(LLMError, match="refused"):
            client.complete_many(batch)
        results = client.complete_many(batch, return_exceptions=True)
    assert results[0].text == "echo:a" and results[2].text == "echo:b"
    assert isinstance(results[1], LLMError)


# ------------------------------------------------------------------------------------------------
# Lenient JSON parsing
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("reply", "expected"), [
    ('{"named_entities": ["A", "B"]}', {"named_entities": ["A", "B"]}),
    ('```json\n{"named_entities": ["A"]}\n```', {"named_entities": ["A"]}),
    ('```\n{"named_entities": ["A"]}\n```\nDone.', {"named_entities": ["A"]}),
    ('Sure! Here you go:\n{"named_entities": ["A"]}\nHope this helps.', {"named_entities": ["A"]}),
    ('See note [1]. Result: {"triples": [["a", "b", "c"]]} (end)', {"triples": [["a", "b", "c"]]}),
    ('{"named_entities": ["A", "B",],}', {"named_entities": ["A", "B"]}),
    ("{'named_entities': ['A', \"B's\"]}", {"named_entities": ["A", "B's"]}),
    ("{'named_entities': ['Newton's law', 'Say \"hi\"']}",
     {"named_entities": ["Newton's law", 'Say "hi"']}),
    ("{'triples': [['Newton', 'wrote', 'Principia'],],}",
     {"triples": [["Newton", "wrote", "Principia"]]}),
    ('[["a", "b", "c"], ["d", "e", "f"]]', [["a", "b", "c"], ["d", "e", "f"]]),
    ("{'ok': True, 'x': None}", {"ok": True, "x": None}),
    ('{"text": "a {brace} and [bracket]"}', {"text": "a {brace} and [bracket]"}),
    ('```json\n{"named_entities": ["A",]}', {"named_entities": ["A"]}),  # unterminated fence
])
def test_parse_json_reply_repairs(reply, expected):
    assert parse_json_reply(reply) == expected


@pytest.mark.parametrize("reply", [
    "", "   ", "I cannot help with that.", '{"named_entities": ["A", "B"', "{oops}", "```\n```",
])
def test_parse_json_reply_rejects(reply):
    with pytest.raises(ValueError):
        parse_json_reply(reply)


def test_parse_triples_validates_items():
    triples = parse_triples({"triples": [
        {"subject": "A", "relation": "likes", "object": "B"},
        {"subject": "A", "predicate": "knows", "object": "C"},
        ["A", "born in", 1990],
        ["A", "", "B"], ["A", "B"], ["A", "b", "c", "d"], "A likes B", [None, "x", "y"],
        ["A", "likes", "B"],  # duplicate
    ]})
    assert triples == [Triple("A", "likes", "B"), Triple("A", "knows", "C"),
                       Triple("A", "born in", "1990")]
    with pytest.raises(ValueError):
        parse_triples({"answer": "none", "other": 1})


# ------------------------------------------------------------------------------------------------
# Prompts
# ------------------------------------------------------------------------------------------------


def test_prompts_load_and_render():
    ner = load_prompt("ner")
    triples = load_prompt("triples")
    assert ner.version and triples.version
    assert ner.fields == {"passage"}
    assert triples.fields == {"passage", "entities"}
    messages = ner.render(passage="Some {entities} text")
    assert [m["role"] for m in messages] == ["system", "user"]
    assert "Some {entities} text" in messages[1]["content"]  # substituted text is not re-scanned
    assert '{"named_entities": [' in messages[0]["content"]  # JSON examples survive verbatim
    with pytest.raises(ConfigError, match="entities"):
        triples.render(passage="x")
    with pytest.raises(ConfigError):
        load_prompt("no_such_prompt")
    with pytest.raises(ConfigError):
        load_prompt("../config")


# ------------------------------------------------------------------------------------------------
# LLMExtractor
# ------------------------------------------------------------------------------------------------

CHUNKS = [
    Chunk("radio", 0, "Radio City is India's first private FM radio station.", 0, 53, "Radio City"),
    Chunk("newton", 0, "Isaac Newton wrote the Principia in 1687.", 0, 41, "Newton"),
    Chunk("empty", 3, "Nothing to see here.", 0, 20),
]

NER_REPLIES = {
    "Radio City is": '```json\n{"named_entities": ["Radio City", "India",]}\n```',
    "Isaac Newton": "['Isaac Newton', 'Principia']",  # bare list, single quotes
    "Nothing to see": '{"named_entities": []}',
}
TRIPLE_REPLIES = {
    "Radio City is": (
        'Here are the triples:\n{"triples": ['
        '{"subject": "Radio City", "relation": "located in", "object": "India"}, '
        '["Radio City", "is", "private FM radio station"], ["Radio City", "", "x"], ["two", "only"]'
        "]}"
    ),
    "Isaac Newton": "[['Isaac Newton', 'wrote', 'Principia'], ['Principia', 'published in', 1687]]",
}
EXPECTED = [
    Extraction(
        entities=("Radio City", "India", "private FM radio station"),
        triples=(Triple("Radio City", "located in", "India"),
                 Triple("Radio City", "is", "private FM radio station")),
    ),
    Extraction(
        entities=("Isaac Newton", "Principia", "1687"),
        triples=(Triple("Isaac Newton", "wrote", "Principia"),
                 Triple("Principia", "published in", "1687")),
    ),
    Extraction(entities=(), triples=()),
]


class OpenIEHandler:
    """Answers NER and triple prompts; ``broken`` passages get a non-JSON NER reply."""

    def __init__(self) -> None:
        self.broken: set[str] = set()

    def __call__(self, body: dict[str, Any]) -> str:
        assert body["response_format"] == {"type": "json_object"}
        user = body["messages"][-1]["content"]
        is_triples = '"named_entities"' in user  # the triple prompt lists the entities
        for marker in NER_REPLIES:
            if marker in user:
                if is_triples:
                    return TRIPLE_REPLIES[marker]
                if marker in self.broken:
                    return "Sorry, I can't help with that."
                return NER_REPLIES[marker]
        raise AssertionError(f"unexpected prompt: {user!r}")


def make_extractor(server: ScriptedOpenAIServer, cache: MemoryResponseCache) -> LLMExtractor:
    config = ExtractorConfig(name="llm", chat=chat_config(server, max_retries=0))
    return LLMExtractor(config, cache=cache)


def test_extractor_end_to_end(server):
    server.chat_handler = OpenIEHandler()
    with make_extractor(server, MemoryResponseCache()) as extractor:
        assert extractor.name == "llm:test-model"
        assert extractor.extract(CHUNKS) == EXPECTED
        assert extractor.extract([]) == []
    bodies = [body for _, body, _ in server.chat_requests]
    assert len(bodies) == 5  # 3 NER + 2 triples (no entities, no triple request)
    triple_users = [b["messages"][-1]["content"] for b in bodies if '"named_entities"' in
                    b["messages"][-1]["content"]]
    assert any('{"named_entities": ["Radio City", "India"]}' in u for u in triple_users)
    assert all("Radio City\nRadio City is" in u for u in triple_users if "FM radio" in u)


def test_extractor_cache_prevents_new_requests(server):
    server.chat_handler = OpenIEHandler()
    cache = MemoryResponseCache()
    with make_extractor(server, cache) as extractor:
        first = extractor.extract(CHUNKS)
    n = len(server.requests)
    assert n == 5
    with make_extractor(server, cache) as extractor:
        assert extractor.extract(CHUNKS) == first == EXPECTED
        assert extractor.extract(list(reversed(CHUNKS))) == list(reversed(EXPECTED))
    assert len(server.requests) == n
    steps = sorted(key[3].split(":")[0] for key in cache._data)
    assert steps == ["ner"] * 3 + ["triples"] * 2
    assert all(key[0] == "test-model" for key in cache._data)


def test_malformed_reply_raises_and_is_not_cached(server):
    handler = OpenIEHandler()
    handler.broken.add("Isaac Newton")
    server.chat_handler = handler
    cache = MemoryResponseCache()
    with make_extractor(server, cache) as extractor:
        with pytest.raises(ExtractionError) as info:
            extractor.extract(CHUNKS)
        message = str(info.value)
        assert "'newton'#0" in message and "Sorry, I can" in message
        assert isinstance(info.value.__cause__, ValueError)
        cached = list(cache._data.values())
        assert len(cached) == 2 and not any("Sorry" in v for v in cached)  # good NER replies only

        handler.broken.clear()
        before = len(server.requests)
        assert extractor.extract(CHUNKS) == EXPECTED
    assert len(server.requests) - before == 3  # Newton's NER + both triple requests


def test_llm_failure_becomes_extraction_error(server):
    server.add((400, "context length exceeded"))
    with make_extractor(server, MemoryResponseCache()) as extractor, \
            pytest.raises(ExtractionError, match="'radio'#0") as info:
        extractor.extract(CHUNKS[:1])
    assert isinstance(info.value.__cause__, LLMError)


def test_extractor_requires_chat_config():
    with pytest.raises(ConfigError):
        LLMExtractor(ExtractorConfig(name="spacy"))


# ------------------------------------------------------------------------------------------------
# OpenAIEmbedder
# ------------------------------------------------------------------------------------------------


def embedder_config(server: ScriptedOpenAIServer, **overrides: Any) -> EmbedderConfig:
    settings: dict[str, Any] = dict(
        name="openai", base_url=server.base_url, model="emb-model", api_key_env=KEY_ENV,
        timeout=5.0, max_retries=2,
    )
    settings.update(overrides)
    return EmbedderConfig(**settings)


def test_embedder_returns_normalized_float32_in_batches(server, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sk-emb")
    texts = [f"text number {i}" for i in range(300)]
    with OpenAIEmbedder(embedder_config(server, dimension=12)) as embedder:
        assert embedder.name == "openai:emb-model"
        assert embedder.dimension == 12
        vectors = embedder.embed(texts)
    assert vectors.shape == (300, 12) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    expected = np.stack([server.vector_for(t) for t in texts])
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    np.testing.assert_allclose(vectors, expected, rtol=1e-5, atol=1e-6)  # sorted by index
    batches = server.embedding_requests
    assert [len(body["input"]) for _, body, _ in batches] == [256, 44]
    assert all(body["model"] == "emb-model" for _, body, _ in batches)
    assert batches[0][2]["authorization"] == "Bearer sk-emb"


def test_embedder_probes_dimension_lazily(server):
    with OpenAIEmbedder(embedder_config(server)) as embedder:
        assert server.requests == []
        assert embedder.dimension == 12
        assert len(server.requests) == 1
        assert embedder.embed([]).shape == (0, 12)
        assert embedder.embed(["", "x"]).shape == (2, 12)  # empty strings are still embedded
    assert len(server.requests) == 2


def test_embedder_retries_then_raises(server):
    server.embedding_script.extend([(502, "bad gateway"), (500, "err")])
    with OpenAIEmbedder(embedder_config(server, dimension=12), backoff=0.0) as embedder:
        assert embedder.embed(["a"]).shape == (1, 12)
        assert len(server.requests) == 3
        server.embedding_script.extend([(500, "err")] * 3)
        with pytest.raises(EmbeddingError, match="500"):
            embedder.embed(["a"])
        server.embedding_script.append((401, "invalid api key"))
        with pytest.raises(EmbeddingError, match="invalid api key"):
            embedder.embed(["a"])
    assert len(server.requests) == 3 + 3 + 1


def test_embedder_rejects_wrong_dimension(server):
    with OpenAIEmbedder(embedder_config(server, dimension=64)) as embedder, \
            pytest.raises(EmbeddingError, match="expected 64"):
        embedder.embed(["a"])
