"""Dense passage retrieval over the FAISS passage index (the baseline every mode builds on)."""

from __future__ import annotations

import numpy as np

from hipgraph.store.database import GraphStore
from hipgraph.store.vector_set import VectorSet
from hipgraph.types import Hit


def dense_search(
    store: GraphStore, vectors: VectorSet, query_vectors: np.ndarray, k: int
) -> list[list[Hit]]:
    """Top-``k`` passages per query row by cosine; ties broken by passage id."""
    scores, ids = vectors.search("passage", query_vectors, k)
    wanted = sorted({int(i) for i in ids.reshape(-1) if i >= 0})
    rows = {}
    if wanted:
        with store.temp_ids("_hits", wanted):
            for pid, key, title, text in store.con.execute("""
                    SELECT p.id, d.key, p.title, p.text FROM passages p JOIN documents d ON d.id = p.doc_id
                    WHERE p.id IN (SELECT id FROM _hits)""").fetchall():
                rows[int(pid)] = (key, title, text)
    results: list[list[Hit]] = []
    for q in range(ids.shape[0]):
        pairs = [(float(s), int(i)) for s, i in zip(scores[q], ids[q], strict=True) if i >= 0 and int(i) in rows]
        pairs.sort(key=lambda p: (-p[0], p[1]))
        hits = []
        for rank, (score, pid) in enumerate(pairs[:k], start=1):
            key, title, text = rows[pid]
            hits.append(Hit(doc_id=key, passage_id=pid, title=title, text=text, score=score,
                            rank=rank, why={"mode": "dense", "cosine": round(score, 6)}))
        results.append(hits)
    return results
