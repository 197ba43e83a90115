"""A synchronous client for OpenAI-compatible ``/chat/completions`` endpoints.

Thread-based (no asyncio), so it works unchanged inside Jupyter. :func:`post_json` carries the
retry policy shared with the OpenAI embedder: exponential backoff on 429, 5xx, timeouts and
connection errors, honouring ``Retry-After``; other 4xx replies fail at once.
"""

from __future__ import annotations

import email.utils
import logging
import os
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import httpx

from hipgraph.config import ChatConfig
from hipgraph.errors import HipgraphError, LLMError

logger = logging.getLogger(__name__)

MAX_BACKOFF = 30.0  # seconds; caps both exponential backoff and Retry-After
_EXCERPT_CHARS = 300


@dataclass(frozen=True)
class ChatResult:
    """One completion: the assistant's text, the model that answered, token usage."""

    text: str
    model: str
    usage: dict[str, Any] = field(default_factory=dict)
    finish_reason: str | None = None


def excerpt(text: str, limit: int = _EXCERPT_CHARS) -> str:
    """``text`` with whitespace collapsed, cut to ``limit`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def auth_headers(api_key_env: str) -> dict[str, str]:
    """An ``Authorization`` header from the env var ``api_key_env``, read now; empty when unset."""
    key = os.environ.get(api_key_env, "").strip() if api_key_env else ""
    return {"Authorization": f"Bearer {key}"} if key else {}


def _retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or HTTP date); None if absent/bad."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


def backoff_delay(backoff: float, attempt: int, retry_after: str | None = None) -> float:
    """Delay before retry number ``attempt + 1``: Retry-After if given, else ``backoff * 2**attempt``."""
    hinted = _retry_after(retry_after)
    delay = hinted if hinted is not None else backoff * (2.0**attempt)
    return min(delay, MAX_BACKOFF)


def post_json(
    client: httpx.Client,
    url: str,
    body: Mapping[str, Any],
    *,
    headers: Mapping[str, str],
    max_retries: int,
    backoff: float,
    error: type[HipgraphError] = LLMError,
) -> Any:
    """POST ``body`` as JSON and return the decoded JSON reply, retrying transient failures.

    Retries (at most ``max_retries`` times) on HTTP 429, 5xx, timeouts and connection errors;
    any other non-2xx status, a non-JSON reply or exhausted retries raise ``error``.
    """
    attempt = 0
    while True:
        try:
            response = client.post(url, json=dict(body), headers=dict(headers))
        except httpx.UnsupportedProtocol as exc:
            raise error(f"POST {url}: {exc}") from exc
        except httpx.TransportError as exc:  # timeouts, refused/reset connections, protocol errors
            if attempt >= max_retries:
                raise error(
                    f"POST {url} failed after {attempt + 1} attempt(s): "
                    f"{type(exc).__name__}: {exc or 'no detail'}"
                ) from exc
            delay = backoff_delay(backoff, attempt)
            logger.warning("POST %s: %s; retry %d/%d in %.2fs",
                           url, type(exc).__name__, attempt + 1, max_retries, delay)
            time.sleep(delay)
            attempt += 1
            continue

        status = response.status_code
        if (status == 429 or status >= 500) and attempt < max_retries:
            delay = backoff_delay(backoff, attempt, response.headers.get("retry-after"))
            logger.warning("POST %s: HTTP %d; retry %d/%d in %.2fs",
                           url, status, attempt + 1, max_retries, delay)
            response.close()
            time.sleep(delay)
            attempt += 1
            continue
        try:
            response.raise_for_status()
        except httpx.HTTPStatusError as exc:
            tries = f" after {attempt + 1} attempts" if attempt else ""
            raise error(
                f"POST {url} failed with HTTP {status}{tries}: {excerpt(response.text) or '<empty>'}"
            ) from exc
        try:
            return response.json()
        except ValueError as exc:
            raise error(
                f"POST {url} returned a reply that is not JSON (HTTP {status}): "
                f"{excerpt(response.text) or '<empty>'}"
            ) from exc


class ChatClient:
    """Synchronous OpenAI-compatible chat client; ``complete_many`` runs requests in threads.

    Use as a context manager or call :meth:`close` to release connections.
    """

    def __init__(self, config: ChatConfig) -> None:
        self.config = config
        self.url = config.base_url.rstrip("/") + "/chat/completions"
        pool = max(config.max_concurrency, 1)
        self._http = httpx.Client(
            timeout=httpx.Timeout(config.timeout),
            limits=httpx.Limits(max_connections=pool, max_keepalive_connections=pool),
        )

    @property
    def model(self) -> str:
        return self.config.model

    def complete(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        json_mode: bool = False,
        max_tokens: int | None = None,
    ) -> ChatResult:
        """Send one chat request and return its first choice. Raises :class:`LLMError`."""
        if not messages:
            raise ValueError("messages must not be empty")
        body: dict[str, Any] = {
            "model": self.config.model,
            "messages": [dict(m) for m in messages],
            "temperature": self.config.temperature,
        }
        limit = max_tokens if max_tokens is not None else self.config.max_tokens
        if limit is not None:
            body["max_tokens"] = limit
        if json_mode:
            body["response_format"] = {"type": "json_object"}
        started = time.perf_counter()
        data = post_json(
            self._http, self.url, body,
            headers=auth_headers(self.config.api_key_env),
            max_retries=self.config.max_retries,
            backoff=self.config.backoff,
            error=LLMError,
        )
        result = _parse_completion(data, self.url, self.config.model)
        logger.debug("chat %s: %d chars in %.2fs (finish=%s)", result.model, len(result.text),
                     time.perf_counter() - started, result.finish_reason)
        if result.finish_reason == "length":
            logger.warning("chat %s: reply cut off at max_tokens", result.model)
        return result

    def complete_many(
        self,
        batch: Sequence[Sequence[Mapping[str, Any]]],
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[Any]:
        """:meth:`complete` for each message list, ``config.max_concurrency`` at a time.

        Results come back in input order. The first :class:`LLMError` is raised (pending
        requests are cancelled) unless ``return_exceptions`` is true, in which case failed
        positions hold their ``LLMError`` instead of a :class:`ChatResult`.
        """
        if not batch:
            return []
        workers = min(self.config.max_concurrency, len(batch))
        if workers == 1:
            out: list[Any] = []
            for messages in batch:
                try:
                    out.append(self.complete(messages, **kwargs))
                except LLMError as exc:
                    if not return_exceptions:
                        raise
                    out.append(exc)
            return out

        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hipgraph-chat")
        try:
            futures: list[Future[ChatResult]] = [
                pool.submit(self.complete, messages, **kwargs) for messages in batch
            ]
            results: list[Any] = []
            for future in futures:
                try:
                    results.append(future.result())
                except LLMError as exc:
                    if not return_exceptions:
                        raise
                    results.append(exc)
            return results
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ChatClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _parse_completion(data: Any, url: str, default_model: str) -> ChatResult:
    """Turn a ``/chat/completions`` JSON reply into a :class:`ChatResult` or raise LLMError."""
    if not isinstance(data, dict):
        raise LLMError(f"{url}: reply is not a JSON object: {excerpt(repr(data))}")
    if "error" in data and not data.get("choices"):
        raise LLMError(f"{url}: endpoint returned an error: {excerpt(repr(data['error']))}")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise LLMError(f"{url}: reply has no choices: {excerpt(repr(data))}")
    message = choices[0].get("message")
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, str):
        raise LLMError(f"{url}: reply has no message content: {excerpt(repr(choices[0]))}")
    usage = data.get("usage")
    model = data.get("model")
    finish = choices[0].get("finish_reason")
    return ChatResult(
        text=content,
        model=model if isinstance(model, str) and model else default_model,
        usage=dict(usage) if isinstance(usage, dict) else {},
        finish_reason=finish if isinstance(finish, str) else None,
    )
