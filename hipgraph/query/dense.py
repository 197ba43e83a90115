"""Dense passage retrieval over the FAISS passage index (the baseline every mode builds on)."""

from __future__ import annotations

import numpy as np

from hipgraph.query.hits import Ranked
from hipgraph.store.vector_set import VectorSet


def dense_rankings(vectors: VectorSet, query_vectors: np.ndarray, depth: int) -> list[Ranked]:
    """Best ``depth`` passages per query row by cosine; ties broken by passage id."""
    scores, ids = vectors.search("passage", query_vectors, depth)
    rankings: list[Ranked] = []
    for q in range(ids.shape[0]):
        pairs = sorted(((float(s), int(i)) for s, i in zip(scores[q], ids[q], strict=True) if i >= 0),
                       key=lambda p: (-p[0], p[1]))
        rankings.append([(pid, s, {"mode": "dense", "cosine": round(s, 6)}) for s, pid in pairs])
    return rankings
