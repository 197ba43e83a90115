"""Topical segmentation of a session's turns (TextTiling over turn embeddings, after SeCom).

Pure functions over a ``(n, d)`` array of L2-normalised turn embeddings; the thresholds are the
fields of :class:`hipgraph.config.ConversationConfig`. A segment is a half-open turn range.
"""

from __future__ import annotations

import numpy as np

from hipgraph.config import ConversationConfig


def gap_similarity(emb: np.ndarray, window: int) -> np.ndarray:
    """``(n-1,)`` cosine between the mean embeddings of the ``window`` turns before and after
    each gap (gap ``i`` lies between turns ``i`` and ``i+1``)."""
    n = emb.shape[0]
    if n < 2:
        return np.zeros(0)
    csum = np.vstack([np.zeros((1, emb.shape[1])), np.cumsum(emb, axis=0)])
    sims = np.empty(n - 1)
    for i in range(n - 1):
        lo, hi = max(0, i + 1 - window), min(n, i + 1 + window)
        left = csum[i + 1] - csum[lo]
        right = csum[hi] - csum[i + 1]
        denom = np.linalg.norm(left) * np.linalg.norm(right)
        sims[i] = float(left @ right / denom) if denom > 0 else 0.0
    return sims


def depth_scores(sims: np.ndarray) -> np.ndarray:
    """TextTiling depth of each gap: (highest similarity reached climbing left - own) + (same,
    climbing right)."""
    depth = np.zeros_like(sims)
    for i, s in enumerate(sims):
        left = s
        for j in range(i - 1, -1, -1):
            if sims[j] < left:
                break
            left = sims[j]
        right = s
        for j in range(i + 1, len(sims)):
            if sims[j] < right:
                break
            right = sims[j]
        depth[i] = (left - s) + (right - s)
    return depth


def segment(emb: np.ndarray, cfg: ConversationConfig) -> list[tuple[int, int]]:
    """Turn ranges ``[start, end)`` covering ``0..n`` (see the config's docstring)."""
    n = emb.shape[0]
    if n == 0:
        return []
    if cfg.granularity == "turn":
        return [(i, i + 1) for i in range(n)]
    if cfg.granularity == "session" or n <= cfg.min_turns:
        return [(0, n)]
    depth = depth_scores(gap_similarity(emb, cfg.window))
    threshold = max(cfg.min_depth, float(depth.mean() + cfg.depth_std * depth.std()))
    # strongest boundaries first, each kept only if both sides stay >= min_turns
    cuts: list[int] = []
    for gap in np.argsort(-depth, kind="stable"):
        if depth[gap] < threshold:
            break
        cut = int(gap) + 1
        if all(abs(cut - c) >= cfg.min_turns for c in cuts) and cfg.min_turns <= cut <= n - cfg.min_turns:
            cuts.append(cut)
    bounds = [0, *sorted(cuts), n]
    out: list[tuple[int, int]] = []
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        out.extend(_split_long(lo, hi, depth, cfg))
    return out


def _split_long(lo: int, hi: int, depth: np.ndarray, cfg: ConversationConfig) -> list[tuple[int, int]]:
    """``[lo, hi)`` cut at its deepest admissible gaps until no piece exceeds ``max_turns``."""
    if hi - lo <= cfg.max_turns:
        return [(lo, hi)]
    inner = range(lo + cfg.min_turns, hi - cfg.min_turns + 1)  # cut positions
    if not inner:
        return [(lo, hi)]
    cut = max(inner, key=lambda c: (depth[c - 1], -abs(c - (lo + hi) / 2)))
    return _split_long(lo, cut, depth, cfg) + _split_long(cut, hi, depth, cfg)


def parse_boundaries(reply: str, n: int) -> list[int]:
    """Turn positions (0-based) that start a segment, from a ``{"boundaries": [...]}`` reply with
    1-based turn numbers; ``ValueError`` naming the fault."""
    from hipgraph.text.json_reply import parse_json_reply  # noqa: PLC0415

    data = parse_json_reply(reply)
    if not isinstance(data, dict) or not isinstance(data.get("boundaries"), list):
        raise ValueError('expected {"boundaries": [turn numbers]}')
    out = []
    for b in data["boundaries"]:
        if isinstance(b, bool) or not isinstance(b, int) or not 2 <= b <= n:
            raise ValueError(f"boundary {b!r} is not a turn number in 2..{n}")
        out.append(b - 1)
    return sorted(set(out))


def llm_segments(client, sessions_lines: list[list[str]], cfg: ConversationConfig
                 ) -> list[list[tuple[int, int]] | str]:
    """Per session: turn ranges from the LLM's boundaries (pieces over ``max_turns`` are cut
    evenly), or the reason it failed (the caller falls back to TextTiling)."""
    from hipgraph.errors import LLMError  # noqa: PLC0415
    from hipgraph.prompts import load_prompt  # noqa: PLC0415

    prompt = load_prompt("segment")
    batch = [prompt.render(turns="\n".join(f"{i}. {line}" for i, line in enumerate(lines, start=1)))
             for lines in sessions_lines]
    replies = client.complete_many(batch, json_mode=True, return_exceptions=True)
    out: list[list[tuple[int, int]] | str] = []
    for lines, reply in zip(sessions_lines, replies, strict=True):
        n = len(lines)
        try:
            if isinstance(reply, LLMError):
                raise ValueError(f"request failed: {reply}")
            cuts = parse_boundaries(reply.text, n)
        except ValueError as exc:
            out.append(str(exc))
            continue
        bounds = [0, *cuts, n]
        units: list[tuple[int, int]] = []
        for lo, hi in zip(bounds, bounds[1:], strict=False):
            step = cfg.max_turns
            units.extend((a, min(a + step, hi)) for a in range(lo, hi, step))
        out.append(units)
    return out
