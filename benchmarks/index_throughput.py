"""Indexing throughput benchmark: embedder speed against a plain reference, and the whole pipeline.

Two measurements, each in a fresh subprocess of this script so that neither disturbs the other:

1. reference (``--_reference-only``): over a fixed, evenly spaced sample of the passage embedding
   texts (``"{title}\\n{text}"``, exactly what hipgraph embeds), a plain
   ``SentenceTransformer(<packaged MiniLM>, device="cpu").encode(batch_size=32,
   normalize_embeddings=True)`` against ``MiniLMEmbedder().embed``; each timed after a warm-up.
   Prints both rates, their ratio and the cosine between the two embeddings of each passage.
2. pipeline (``--_pipeline-only``): ``hipgraph.open(out, create=True)`` and
   ``add_documents(records)`` with records built like ``hipgraph index`` builds them from a bundle;
   per-stage seconds from ``IndexReport.seconds``, passages/s, the process's own peak RSS
   (``ru_maxrss``), ``hg.stats()`` and what was embedded.

Stage timers may overlap (extraction of the next batch runs in a worker thread while the current
one is embedded), so stage seconds can add up to more than the wall time; the table says so.
Rates on a small shared machine drop sharply when other processes use the CPU: every timed part
reports its own CPU use and that of other processes (from ``/proc/stat``) and flags a shared run.

Targets are reported as PASS/FAIL only; a missed target never changes the exit status (a crashed
subprocess gives 1).

    python benchmarks/index_throughput.py --limit 300
    python benchmarks/index_throughput.py --json > result.json
    python benchmarks/index_throughput.py --limit 500 --no-reference --profile /tmp/add.pstats
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# offline before anything imports transformers / huggingface_hub
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BUNDLE = (REPO_ROOT / ".." / "shared" / "data" / "multihop" / "2wiki_dev101.json").resolve()

RATIO_TARGET = 1.5  # hipgraph embedder vs plain sentence-transformers, passages/s
PIPELINE_RATE_TARGET = 20.0  # whole add_documents, passages/s
RSS_TARGET_GIB = 2.0  # peak RSS of the indexing process
BUSY_OTHERS_CORES = 0.25  # other processes' CPU use (cores) above which a timing is flagged
STAGES = ("extract", "embed", "graph", "write")
EMBED_CALLS = ("passages", "entities", "facts", "turns")  # order of compute.embed_batch's calls


# ---------------------------------------------------------------------- helpers
def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def peak_rss_gib() -> float:
    """Peak resident set of this process (ru_maxrss is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    scale = 1 if sys.platform == "darwin" else 1024
    return peak * scale / 2**30


def _busy_seconds() -> float | None:
    """CPU seconds all processes spent busy since boot (Linux /proc/stat), or None."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except (OSError, IndexError):
        return None
    ticks = [int(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class CpuMeter:
    """Wall time, this process's CPU time and other processes' CPU use over one interval.

    ``others_cores`` (busy CPU seconds of everything else per wall second) shows whether another
    job shared the machine during the measurement, which makes rates on a small machine unreliable.
    """

    def __init__(self) -> None:
        self.wall0 = time.perf_counter()
        self.own0 = _own_cpu_seconds()
        self.busy0 = _busy_seconds()

    def stop(self) -> dict[str, Any]:
        wall = time.perf_counter() - self.wall0
        own = _own_cpu_seconds() - self.own0
        busy1 = _busy_seconds()
        others = None
        if self.busy0 is not None and busy1 is not None and wall > 0:
            others = max(0.0, (busy1 - self.busy0 - own) / wall)
        return {"wall_seconds": wall, "own_cpu_seconds": own,
                "own_cores": own / wall if wall > 0 else None, "others_cores": others,
                "loadavg_end": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}


def current_rss_gib() -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def rate(n: int | float, seconds: float | None) -> float | None:
    return n / seconds if seconds and seconds > 0 else None


def load_records(bundle: Path, limit: int | None) -> list[dict[str, Any]]:
    """Records as ``hipgraph index BUNDLE`` builds them (same reader), ids as ``str(idx)``."""
    from hipgraph.indexers.readers import FieldMap, read_inputs

    records = list(read_inputs([bundle], FieldMap()))
    if limit is not None:
        records = records[:limit]
    for record in records:
        record["id"] = str(record["id"])
    return records


def embedding_texts(records: list[dict[str, Any]]) -> list[str]:
    """The passage texts hipgraph embeds for these records (chunked, title prepended)."""
    from hipgraph.config import IndexConfig
    from hipgraph.indexers.chunking import chunk_document
    from hipgraph.indexers.compute import passage_embedding_text
    from hipgraph.indexers.documents import SkippedRecord, to_document

    config = IndexConfig()
    texts = []
    for record in records:
        try:
            doc = to_document(record)
        except SkippedRecord:
            continue
        texts.extend(passage_embedding_text(c, config.chunk.prepend_title)
                     for c in chunk_document(doc, config.chunk))
    return texts


def even_sample(items: list[str], n: int) -> list[str]:
    """``n`` items spread evenly over ``items`` (deterministic), all of them when ``n`` >= len."""
    if n >= len(items):
        return list(items)
    step = len(items) / n
    return [items[int(i * step)] for i in range(n)]


# ---------------------------------------------------------------------- reference (child)
def run_reference(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    from hipgraph.models.embedders import MiniLMEmbedder, packaged_minilm_path

    records = load_records(args.bundle, None)  # the sample spans the whole corpus
    all_texts = embedding_texts(records)
    texts = even_sample(all_texts, args.reference_sample)
    warm = texts[:64]
    log(f"reference: {len(texts)} of {len(all_texts)} passage texts, torch threads "
        f"{torch.get_num_threads()}")

    t0 = time.perf_counter()
    st_model = SentenceTransformer(str(packaged_minilm_path()), device="cpu")
    st_load = time.perf_counter() - t0
    st_model.encode(warm, batch_size=32, normalize_embeddings=True, show_progress_bar=False)
    st_runs = []
    for _ in range(args.reference_repeats):
        meter = CpuMeter()
        st_vecs = st_model.encode(texts, batch_size=32, normalize_embeddings=True,
                                  convert_to_numpy=True, show_progress_bar=False)
        st_runs.append(meter.stop())
    st_best = min(st_runs, key=lambda r: r["wall_seconds"])
    st_seconds = st_best["wall_seconds"]
    log(f"reference: sentence-transformers {len(texts) / st_seconds:.1f} passages/s")
    max_seq_length = int(st_model.max_seq_length)
    del st_model

    hg_model = MiniLMEmbedder()
    t0 = time.perf_counter()
    hg_model.embed(warm)
    hg_load = time.perf_counter() - t0  # load + one warm-up call
    hg_runs = []
    for _ in range(args.reference_repeats):
        meter = CpuMeter()
        hg_vecs = hg_model.embed(texts)
        hg_runs.append(meter.stop())
    hg_best = min(hg_runs, key=lambda r: r["wall_seconds"])
    hg_seconds = hg_best["wall_seconds"]
    log(f"reference: hipgraph MiniLMEmbedder {len(texts) / hg_seconds:.1f} passages/s")

    lengths = [len(ids) for ids in hg_model._tokenizer(texts, truncation=True,
                                                       max_length=hg_model.config.max_length)
               ["input_ids"]]
    st_vecs = np.asarray(st_vecs, dtype=np.float32)
    hg_vecs = np.asarray(hg_vecs, dtype=np.float32)
    cos = (st_vecs * hg_vecs).sum(axis=1) / (
        np.linalg.norm(st_vecs, axis=1) * np.linalg.norm(hg_vecs, axis=1))
    st_rate, hg_rate = len(texts) / st_seconds, len(texts) / hg_seconds
    return {
        "sample": len(texts),
        "corpus_texts": len(all_texts),
        "repeats": args.reference_repeats,
        "torch_threads": torch.get_num_threads(),
        "tokens_mean": float(np.mean(lengths)),
        "tokens_max": int(np.max(lengths)),
        "sentence_transformers": {
            "batch_size": 32, "max_seq_length": max_seq_length, "load_seconds": st_load,
            "seconds": st_seconds, "passages_per_s": st_rate, "cpu": st_best,
            "all_seconds": [r["wall_seconds"] for r in st_runs],
        },
        "hipgraph": {
            "precision": getattr(hg_model, "precision", None),
            "batch_tokens": hg_model.config.batch_tokens,
            "max_length": hg_model.config.max_length,
            "load_seconds": hg_load, "seconds": hg_seconds, "passages_per_s": hg_rate,
            "cpu": hg_best, "all_seconds": [r["wall_seconds"] for r in hg_runs],
        },
        "ratio": hg_rate / st_rate,
        "ratio_target": RATIO_TARGET,
        "ratio_pass": hg_rate / st_rate >= RATIO_TARGET,
        "cosine_mean": float(cos.mean()),
        "cosine_min": float(cos.min()),
        "cosine_below_0_999": int((cos < 0.999).sum()),
        "peak_rss_gib": peak_rss_gib(),
    }


# ---------------------------------------------------------------------- pipeline (child)
def _counting_embedder(count_tokens: bool):
    """A MiniLMEmbedder that logs texts, unique texts and seconds (and word pieces) per call.

    With ``count_tokens`` the unique texts are tokenized once more after each call to count word
    pieces; that extra tokenization falls inside the pipeline's embed stage (reported apart).
    """
    from hipgraph.models.embedders import MiniLMEmbedder

    class CountingEmbedder(MiniLMEmbedder):
        def __init__(self, *a: Any, **kw: Any):
            super().__init__(*a, **kw)
            self.calls: list[dict[str, Any]] = []

        def embed(self, texts):  # type: ignore[override]
            texts = list(texts)
            t0 = time.perf_counter()
            out = super().embed(texts)
            call = {"texts": len(texts), "unique": len(set(texts)),
                    "seconds": time.perf_counter() - t0}
            if count_tokens and texts:
                t0 = time.perf_counter()
                ids = self._tokenizer(sorted(set(texts)), truncation=True,
                                      max_length=self.config.max_length)["input_ids"]
                call["tokens"] = sum(len(x) for x in ids)
                call["token_count_seconds"] = time.perf_counter() - t0
            self.calls.append(call)
            return out

    return CountingEmbedder


def run_pipeline(args: argparse.Namespace) -> dict[str, Any]:
    t_process = time.perf_counter()
    t0 = time.perf_counter()
    import hipgraph
    from hipgraph.types import Chunk

    import_seconds = time.perf_counter() - t0
    records = load_records(args.bundle, args.limit)
    log(f"pipeline: {len(records)} documents -> {args.out} (batch {args.batch_size or 'growing'})")

    load: dict[str, float] = {"import_hipgraph": import_seconds}
    config = hipgraph.IndexConfig()
    tuned = {k: v for k, v in (("threads", args.embed_threads),
                               ("batch_tokens", args.batch_tokens)) if v is not None}
    if tuned:  # benchmark knobs: saved in this (throw-away) index's config like any setting
        import dataclasses

        config = config.replace(embedder=dataclasses.replace(config.embedder, **tuned))
    embedder = _counting_embedder(args.count_tokens)(config.embedder)
    t0 = time.perf_counter()
    hg = hipgraph.open(args.out, create=True, config=config, embedder=embedder)
    load["open"] = time.perf_counter() - t0
    if not args.cold:
        t0 = time.perf_counter()
        embedder.embed(["Warm-up\nLoads the embedding model."])
        load["embedder"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        hg.indexer.extractor.extract([Chunk("warm-up", 0, "Ada Lovelace was born in London.", 0,
                                            32, "Ada Lovelace")])
        load["extractor"] = time.perf_counter() - t0
        embedder.calls.clear()
    rss_before = {"current_gib": current_rss_gib(), "peak_gib": peak_rss_gib()}
    log("pipeline: load " + ", ".join(f"{k} {v:.1f}s" for k, v in load.items()))

    done = [0]
    t_add = time.perf_counter()

    def progress(n: int) -> None:
        done[0] += n
        elapsed = time.perf_counter() - t_add
        log(f"pipeline: {done[0]}/{len(records)} documents, {elapsed:.0f}s, "
            f"{done[0] / max(elapsed, 1e-9):.1f} docs/s, peak RSS {peak_rss_gib():.2f} GiB")

    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    t_add = time.perf_counter()
    meter = CpuMeter()
    report = hg.add_documents(records, batch_size=args.batch_size, progress=progress)
    add_cpu = meter.stop()
    add_seconds = add_cpu["wall_seconds"]
    if profiler is not None:
        profiler.disable()
        _dump_profile(profiler, args.profile)

    stats = hg.stats()
    con = hg.store.con
    memory = _memory_breakdown(hg)
    fact_kinds = dict(con.execute("SELECT kind, count(*) FROM facts GROUP BY kind").fetchall())
    fact_sources = int(con.execute("SELECT count(*) FROM fact_sources").fetchall()[0][0])
    mentions = int(con.execute("SELECT count(*) FROM mentions").fetchall()[0][0])
    t0 = time.perf_counter()
    hg.close()
    close_seconds = time.perf_counter() - t0
    process_seconds = time.perf_counter() - t_process

    calls = embedder.calls
    groups = {"unclassified": calls}
    if calls and len(calls) % len(EMBED_CALLS) == 0:  # one call of each kind per batch
        groups = {kind: calls[i::len(EMBED_CALLS)] for i, kind in enumerate(EMBED_CALLS)}
    embedded: dict[str, Any] = {}
    for kind, mine in groups.items():
        entry = {key: sum(c.get(key, 0) for c in mine)
                 for key in ("texts", "unique", "seconds", "tokens", "token_count_seconds")}
        entry["calls"] = len(mine)
        entry["texts_per_s"] = rate(entry["texts"], entry["seconds"])
        if args.count_tokens:
            entry["tokens_per_text"] = entry["tokens"] / entry["unique"] if entry["unique"] else None
            entry["tokens_per_s"] = rate(entry["tokens"], entry["seconds"])
        else:
            del entry["tokens"], entry["token_count_seconds"]
        embedded[kind] = entry

    seconds = dict(report.seconds)
    n = report.passages
    stages = {s: {"seconds": seconds.get(s, 0.0), "passages_per_s": rate(n, seconds.get(s))}
              for s in STAGES}
    other = add_seconds - sum(seconds.get(s, 0.0) for s in STAGES)
    pipeline_rate = rate(n, add_seconds) or 0.0
    peak = peak_rss_gib()
    return {
        "documents": len(records),
        "batch_size": args.batch_size,
        "cold": bool(args.cold),
        "profiled": bool(args.profile),
        "count_tokens": bool(args.count_tokens),
        "embedder_config": {"threads": config.embedder.threads,
                            "batch_tokens": config.embedder.batch_tokens,
                            "precision": config.embedder.precision},
        "embedder_precision": getattr(embedder, "precision", None),
        "load_seconds": load,
        "add_documents_seconds": add_seconds,
        "add_documents_cpu": add_cpu,
        "close_seconds": close_seconds,
        "process_seconds": process_seconds,
        "stages": stages,
        "other_seconds": other,
        "passages_per_s": pipeline_rate,
        "documents_per_s": rate(len(records), add_seconds),
        "end_to_end_passages_per_s": rate(n, process_seconds),
        "rate_target": PIPELINE_RATE_TARGET,
        "rate_pass": pipeline_rate >= PIPELINE_RATE_TARGET,
        "peak_rss_gib": peak,
        "rss_after_load": rss_before,
        "memory_at_end": memory,
        "rss_target_gib": RSS_TARGET_GIB,
        "rss_pass": peak <= RSS_TARGET_GIB,
        "report": report.to_dict(),
        "stats": stats,
        "facts_by_kind": fact_kinds,
        "facts_per_passage": (stats.get("facts", 0) / n) if n else None,
        "fact_sources_per_passage": fact_sources / n if n else None,
        "mentions_per_passage": mentions / n if n else None,
        "embedded": embedded,
    }


def _memory_breakdown(hg) -> dict[str, Any]:
    """Where the resident memory of an open index may sit: DuckDB's buffers, FAISS, the file."""
    out: dict[str, Any] = {"rss_gib": current_rss_gib()}
    try:
        rows = hg.store.con.execute(
            "SELECT sum(memory_usage_bytes), current_setting('memory_limit') FROM duckdb_memory()"
        ).fetchall()
        out["duckdb_buffers_gib"] = int(rows[0][0] or 0) / 2**30
        out["duckdb_memory_limit"] = rows[0][1]
    except Exception as exc:  # noqa: BLE001 - informational only
        out["duckdb_buffers_gib"] = f"unavailable: {exc}"
    try:
        out["faiss_vectors_gib"] = sum(
            index.ntotal * hg.vectors.dimension * 4 for index in hg.vectors.indexes.values()) / 2**30
    except Exception as exc:  # noqa: BLE001
        out["faiss_vectors_gib"] = f"unavailable: {exc}"
    files = [f for f in Path(hg.path).iterdir() if f.is_file()]
    out["index_files_gib"] = sum(f.stat().st_size for f in files) / 2**30
    return out


def _dump_profile(profiler, path: str) -> None:
    import io
    import pstats

    profiler.dump_stats(path)
    for key in ("cumulative", "tottime"):
        buf = io.StringIO()
        pstats.Stats(profiler, stream=buf).sort_stats(key).print_stats(30)
        print(f"---- profile by {key} ({path}) ----\n{buf.getvalue()}", file=sys.stderr)


# ---------------------------------------------------------------------- driver
def _child(mode: str, args: argparse.Namespace, result: Path, out: Path | None) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), f"--_{mode}-only",
           "--_result", str(result), "--bundle", str(args.bundle),
           *(["--batch-size", str(args.batch_size)] if args.batch_size else []),
           "--reference-sample", str(args.reference_sample),
           "--reference-repeats", str(args.reference_repeats)]
    if args.limit is not None:
        cmd += ["--limit", str(args.limit)]
    if out is not None:
        cmd += ["--out", str(out)]
    if args.cold:
        cmd.append("--cold")
    if args.profile:
        cmd += ["--profile", args.profile]
    if args.count_tokens:
        cmd.append("--count-tokens")
    for flag, value in (("--embed-threads", args.embed_threads),
                        ("--batch-tokens", args.batch_tokens)):
        if value is not None:
            cmd += [flag, str(value)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=sys.stderr, cwd=REPO_ROOT, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not result.exists():
        return {"error": f"{mode} subprocess exited with status {proc.returncode}",
                "wall_seconds": wall}
    data = json.loads(result.read_text())
    data["wall_seconds"] = wall
    return data


def _fmt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def _cpu_note(cpu: dict[str, Any]) -> str:
    note = (f"own {_fmt(cpu.get('own_cores'), '.2f')} cores, other processes "
            f"{_fmt(cpu.get('others_cores'), '.2f')} cores")
    others = cpu.get("others_cores")
    if others is not None and others > BUSY_OTHERS_CORES:
        note += " (machine shared: rates are low)"
    return note


def render(summary: dict[str, Any]) -> str:
    limit = "" if summary["limit"] is None else f" (first {summary['limit']})"
    lines = [f"hipgraph index throughput: {summary['bundle']}{limit}",
             f"  machine: {summary['machine']}"]
    ref = summary.get("reference")
    if ref and "error" not in ref:
        st, hgr = ref["sentence_transformers"], ref["hipgraph"]
        lines += [
            "",
            f"embedder reference ({ref['sample']} passages of {ref['corpus_texts']}, "
            f"{ref['tokens_mean']:.0f} word pieces mean, {ref['tokens_max']} max, "
            f"torch threads {ref['torch_threads']}, best of {ref['repeats']})",
            f"  sentence-transformers fp32 batch 32  {st['passages_per_s']:8.1f} passages/s "
            f"({st['seconds']:.2f} s)",
            f"  hipgraph MiniLMEmbedder ({hgr['precision']})      {hgr['passages_per_s']:8.1f} "
            f"passages/s ({hgr['seconds']:.2f} s)",
            f"  ratio                                {ref['ratio']:8.2f}x   target >= "
            f"{ref['ratio_target']}x  {verdict(ref['ratio_pass'])}",
            f"  cosine hipgraph vs reference         mean {ref['cosine_mean']:.6f}  "
            f"min {ref['cosine_min']:.6f}  (<0.999: {ref['cosine_below_0_999']})",
            f"  CPU while timed: reference {_cpu_note(st['cpu'])}; hipgraph {_cpu_note(hgr['cpu'])}",
        ]
    elif ref:
        lines += ["", f"embedder reference: {ref['error']}"]
    pipe = summary.get("pipeline")
    if pipe and "error" not in pipe:
        rep = pipe["report"]
        n = rep["passages"]
        load = pipe["load_seconds"]
        lines += [
            "",
            f"pipeline (fresh process): {pipe['documents']} documents -> {n} passages, batch "
            f"{pipe['batch_size']}, embedder {pipe['embedder_precision']}"
            f"{', cold' if pipe['cold'] else ''}{', cProfile ON' if pipe['profiled'] else ''}"
            f"{', counting word pieces' if pipe['count_tokens'] else ''}",
            f"  embedder config: {pipe['embedder_config']}",
            "  load: " + ", ".join(f"{k} {v:.2f}s" for k, v in load.items()),
            f"  {'stage':<16}{'seconds':>9}{'passages/s':>12}{'share':>8}",
        ]
        total = pipe["add_documents_seconds"]
        for stage in STAGES:
            s = pipe["stages"][stage]
            lines.append(f"  {stage:<16}{s['seconds']:9.1f}{_fmt(s['passages_per_s']):>12}"
                         f"{100 * s['seconds'] / total:7.1f}%")
        other = pipe["other_seconds"]
        if other >= 0:
            lines.append(f"  {'(other)':<16}{other:9.1f}{'':>12}{100 * other / total:7.1f}%")
        else:  # stage timers ran concurrently (extraction in a worker thread)
            lines.append(f"  {'(overlapped)':<16}{other:9.1f}{'':>12}{100 * other / total:7.1f}%"
                         "  stages ran concurrently: their sum exceeds the wall time")
        lines += [
            f"  {'add_documents':<16}{total:9.1f}{pipe['passages_per_s']:12.1f}   target >= "
            f"{pipe['rate_target']:g}  {verdict(pipe['rate_pass'])}",
            f"  end to end (imports, open, load, add, close): {pipe['process_seconds']:.1f} s, "
            f"{_fmt(pipe['end_to_end_passages_per_s'])} passages/s; close "
            f"{pipe['close_seconds']:.2f} s",
            f"  CPU during add_documents: {_cpu_note(pipe['add_documents_cpu'])}",
            f"  peak RSS {pipe['peak_rss_gib']:.2f} GiB   target <= {pipe['rss_target_gib']:g} GiB  "
            f"{verdict(pipe['rss_pass'])}   (after load: "
            f"{_fmt(pipe['rss_after_load']['current_gib'], '.2f')} GiB)",
            "  memory at end: " + ", ".join(
                f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                for k, v in pipe.get("memory_at_end", {}).items()),
        ]
        emb = pipe["embedded"]
        lines.append("  embedded (texts, unique, seconds, texts/s"
                     f"{', word pieces/text, word pieces/s' if pipe['count_tokens'] else ''}):")
        for kind, v in emb.items():
            line = (f"    {kind:<12}{v['texts']:>8}{v['unique']:>8}{v['seconds']:8.1f}"
                    f"{_fmt(v['texts_per_s']):>9}")
            if "tokens" in v:
                line += (f"{_fmt(v['tokens_per_text']):>7}{_fmt(v['tokens_per_s'], '.0f'):>8}"
                         f"  (+{v['token_count_seconds']:.1f}s counting)")
            lines.append(line)
        lines += [
            f"  report: added {rep['added']}, passages {n}, new entities {rep['entities_new']}, "
            f"new facts {rep['facts_new']}, new synonym edges {rep['synonym_edges_new']}, "
            f"skipped {rep['skipped']}",
            f"  facts by kind {pipe['facts_by_kind']}; per passage: facts "
            f"{_fmt(pipe['facts_per_passage'], '.2f')}, fact sources "
            f"{_fmt(pipe['fact_sources_per_passage'], '.2f')}, mentions "
            f"{_fmt(pipe['mentions_per_passage'], '.2f')}",
            f"  stats: {json.dumps(pipe['stats'])}",
        ]
    elif pipe:
        lines += ["", f"pipeline: {pipe['error']}"]
    if summary.get("index_kept"):
        lines.append(f"\nindex kept at {summary['out']}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle", type=Path, default=DEFAULT_BUNDLE,
                   help="QA bundle JSON with a 'corpus' list (default: %(default)s)")
    p.add_argument("--limit", type=int, default=None, help="index only the first N passages")
    p.add_argument("--out", type=Path, default=None,
                   help="index folder (must not hold an index); default: a temporary folder")
    p.add_argument("--keep", action="store_true", help="keep the temporary index folder")
    p.add_argument("--reference-sample", type=int, default=1000,
                   help="passages in the embedder reference comparison (0 skips it)")
    p.add_argument("--reference-repeats", type=int, default=1,
                   help="timed repeats per reference embedder (best is reported)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="fixed batches of this many documents (default: the index's, 256 growing with it)")
    p.add_argument("--cold", action="store_true",
                   help="do not pre-load the models: loading then counts in the first batch")
    p.add_argument("--profile", default=None, metavar="FILE",
                   help="cProfile add_documents into FILE (pstats) and print the top functions")
    p.add_argument("--embed-threads", type=int, default=None,
                   help="pipeline only: embedder.threads (default: the library default, all cores)")
    p.add_argument("--batch-tokens", type=int, default=None,
                   help="pipeline only: embedder.batch_tokens (default: the library default)")
    p.add_argument("--count-tokens", action="store_true",
                   help="count word pieces per embedded kind (adds a re-tokenization to embed)")
    p.add_argument("--no-reference", dest="reference_sample", action="store_const", const=0,
                   help="skip the embedder reference (same as --reference-sample 0)")
    p.add_argument("--json", action="store_true", help="print one JSON summary on stdout")
    p.add_argument("--_reference-only", dest="reference_only", action="store_true",
                   help=argparse.SUPPRESS)
    p.add_argument("--_pipeline-only", dest="pipeline_only", action="store_true",
                   help=argparse.SUPPRESS)
    p.add_argument("--_result", dest="result", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.bundle = args.bundle.resolve()
    if args.profile:
        args.profile = str(Path(args.profile).resolve())
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.reference_only or args.pipeline_only:
        data = run_reference(args) if args.reference_only else run_pipeline(args)
        args.result.write_text(json.dumps(data, indent=1))
        return 0

    if not args.bundle.is_file():
        print(f"bundle not found: {args.bundle}", file=sys.stderr)
        return 2
    if args.out is not None and (args.out / "graph.duckdb").exists():
        print(f"{args.out} already holds an index; give a fresh folder", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="hipgraph-bench-"))
    out = args.out.resolve() if args.out is not None else work / "index"
    summary: dict[str, Any] = {
        "bundle": str(args.bundle), "limit": args.limit, "out": str(out),
        "machine": f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
                   f"Python {platform.python_version()}",
    }
    failed = False
    try:
        if args.reference_sample > 0:
            log("starting the embedder reference subprocess")
            summary["reference"] = _child("reference", args, work / "reference.json", None)
            failed |= "error" in summary["reference"]
        log("starting the pipeline subprocess")
        summary["pipeline"] = _child("pipeline", args, work / "pipeline.json", out)
        failed |= "error" in summary["pipeline"]
    finally:
        keep = args.keep or args.out is not None
        summary["index_kept"] = keep
        if not args.keep:  # the scratch folder (and the index, unless --out put it elsewhere)
            shutil.rmtree(work, ignore_errors=True)
    text = render(summary)
    if args.json:
        print(text, file=sys.stderr)
        print(json.dumps(summary, indent=2))
    else:
        print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
