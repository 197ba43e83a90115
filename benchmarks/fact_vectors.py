"""What fact embeddings buy per retrieval mode, against what they cost to embed.

    python benchmarks/fact_vectors.py --db indexes/musique --bundle ../shared/data/multihop/musique_train100.json
        [--policies all,none,named-one,named-both,cap4] [--modes graph,decompose,expand] [--k 2,5]

A fact (``subject relation object``) is embedded so that a question can seed the graph from the
facts it matches (graph, decompose and expand modes; dense, bm25 and hybrid never read them). Each
policy keeps the vectors of a subset of the index's triple facts, decided from what an indexer
knows when it embeds them (the entity labels of both ends, the order of a passage's facts):

- ``all``: every triple (today's index); ``none``: no fact vectors (seeds from question entities
  linked by name and from dense passages only);
- ``named-one`` / ``named-both``: facts with at least one / both ends a named entity (not a noun
  chunk, label ``NOUN_CHUNK``);
- ``capN``: the first N triples of each passage (facts of several passages count once, by their
  first passage).

For each policy the index is copied, the other fact vectors are deleted from the copy's DuckDB
and its FAISS fact index is rebuilt from what is left; the graph (entities, fact edges, mentions)
is unchanged, so a row differs from ``all`` only in what a question can match. Recall@k per mode
is ``hipgraph.evaluation.evaluate``'s, on the same questions. The cost column times the index's
embedder on the kept fact texts, beside the same embedder on the index's passage texts and entity
names (one process, the same run), so the share of the embed stage each policy saves is measured,
not estimated.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import duckdb  # noqa: E402

import hipgraph  # noqa: E402
from hipgraph.evaluation import evaluate, load_bundle  # noqa: E402
from hipgraph.text.facts import fact_text  # noqa: E402

NOUN_CHUNK = "NOUN_CHUNK"


def triple_facts(db: Path) -> list[tuple[int, str, str, int, int]]:
    """``(fact id, fact text, first passage id, named ends, rank in that passage)`` of each triple."""
    con = duckdb.connect(str(db / "graph.duckdb"), read_only=True)
    try:
        rows = con.execute(f"""
            SELECT f.id, es.name, f.relation, eo.name,
                   (es.label IS DISTINCT FROM '{NOUN_CHUNK}')::INT + (eo.label IS DISTINCT FROM '{NOUN_CHUNK}')::INT,
                   min(s.passage_id)
            FROM facts f JOIN entities es ON es.id = f.subject_id JOIN entities eo ON eo.id = f.object_id
            JOIN fact_sources s ON s.fact_id = f.id
            WHERE f.kind = 'triple' GROUP BY ALL ORDER BY f.id""").fetchall()
    finally:
        con.close()
    out, rank = [], {}
    for fid, s, r, o, named, pid in rows:  # fact ids are handed out in extraction order
        rank[pid] = rank.get(pid, 0) + 1
        out.append((int(fid), fact_text(s, r, o), int(pid), int(named), rank[pid]))
    return out


def keep(policy: str, named: int, rank: int) -> bool:
    if policy == "all":
        return True
    if policy == "none":
        return False
    if policy == "named-one":
        return named >= 1
    if policy == "named-both":
        return named == 2
    cap = re.fullmatch(r"cap(\d+)", policy)
    if cap:
        return rank <= int(cap.group(1))
    raise SystemExit(f"unknown policy {policy!r}")


def texts(db: Path) -> tuple[list[str], list[str]]:
    con = duckdb.connect(str(db / "graph.duckdb"), read_only=True)
    try:
        passages = [f"{t}\n{x}" for t, x in con.execute("SELECT title, text FROM passages ORDER BY id").fetchall()]
        names = [r[0] for r in con.execute("SELECT name FROM entities ORDER BY id").fetchall()]
    finally:
        con.close()
    return passages, names


def embed_seconds(embedder, items: list[str], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        embedder.embed(items)
        best = min(best, time.perf_counter() - t0)
    return best


def copy_with_facts(db: Path, kept: set[int], work: Path) -> Path:
    out = work / "ix"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(db, out)
    (out / "fact.faiss").unlink(missing_ok=True)  # rebuilt from DuckDB on open
    con = duckdb.connect(str(out / "graph.duckdb"))
    try:
        con.execute("DELETE FROM fact_vectors WHERE id NOT IN (SELECT unnest(?::BIGINT[]))", [sorted(kept)])
    finally:
        con.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--bundle", type=Path, required=True)
    parser.add_argument("--policies", default="all,none,named-one,named-both,cap4")
    parser.add_argument("--modes", default="graph,decompose,expand")
    parser.add_argument("--k", default="2,5")
    parser.add_argument("--repeats", type=int, default=2, help="embedding timings: best of N")
    args = parser.parse_args()
    policies = args.policies.split(",")
    modes = args.modes.split(",")
    cutoffs = [int(k) for k in args.k.split(",")]
    questions = load_bundle(args.bundle)["questions"]
    facts = triple_facts(args.db)
    passages, names = texts(args.db)

    with hipgraph.open(args.db, read_only=True) as hg:
        embedder = hg.embedder
        embedder.embed(passages[:64])  # warm-up
        t_passages = embed_seconds(embedder, passages, args.repeats)
        t_names = embed_seconds(embedder, names, args.repeats)
        fact_texts = [t for _, t, *_ in facts]
        t_facts = {p: embed_seconds(embedder, [t for _, t, _, n, r in facts if keep(p, n, r)], args.repeats)
                   if p != "none" else 0.0 for p in policies}
        t_all = t_facts["all"] if "all" in t_facts else embed_seconds(embedder, fact_texts, args.repeats)
    full = t_passages + t_names + t_all
    print(f"{args.db}: {len(passages)} passages ({t_passages:.1f} s), {len(names)} entity names "
          f"({t_names:.1f} s), {len(facts)} triple facts; embedding best of {args.repeats}")

    rows = []
    with tempfile.TemporaryDirectory(prefix="hipgraph-facts-") as tmp:
        for policy in policies:
            kept = {fid for fid, _, _, n, r in facts if keep(policy, n, r)}
            path = copy_with_facts(args.db, kept, Path(tmp))
            with hipgraph.open(path, read_only=True) as hg:
                results = evaluate(hg, questions, modes, cutoffs)
            embed = t_passages + t_names + t_facts[policy]
            rows.append((policy, len(kept), t_facts[policy], embed / full, results))
            print(f"  {policy}: done", flush=True)

    head = " | ".join(f"{m} R@{k}" for m in modes for k in cutoffs)
    print(f"\n| policy | fact vectors | fact embed s | embed stage vs all | {head} |")
    print("|---" * (4 + len(modes) * len(cutoffs)) + "|")
    base = {r.mode: r.recall for r in rows[0][4]} if rows and rows[0][0] == "all" else None
    for policy, n, t, share, results in rows:
        cells = []
        for r in results:
            for k in cutoffs:
                delta = f" ({r.recall[k] - base[r.mode][k]:+.1f})" if base and policy != "all" else ""
                cells.append(f"{r.recall[k]:.1f}{delta}")
        print(f"| {policy} | {n} ({100 * n / max(1, len(facts)):.0f}%) | {t:.1f} | {share:.2f} | {' | '.join(cells)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
