"""The command line: ``hipgraph index | query | eval | stats`` (batch) and ``serve | mcp`` (servers)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import itertools
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hipgraph.cli_options import (
    add_dates,
    add_db,
    add_embedder,
    add_generator,
    add_llm,
    add_output,
    add_retrieval,
    add_strict_json,
    date_order,
    extractor_config,
    generator_config,
    new_index_config,
    retrieval_config,
    session_embedder,
)
from hipgraph.cli_serve import add_server_commands
from hipgraph.errors import ConfigError, HipgraphError, InputError
from hipgraph.text.limits import unicode_fault

logger = logging.getLogger("hipgraph.cli")


# ---------------------------------------------------------------------- argument groups
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hipgraph", description="Graph-based retrieval engine.")
    parser.add_argument("--version", action="version", version=f"hipgraph {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("index", help="index documents into an index folder (created if absent)")
    add_db(p)
    add_embedder(p)
    p.add_argument("inputs", nargs="+", help="JSON (list or bundle with 'corpus'), JSONL, .txt/.md files or folders")
    p.add_argument("--format", dest="fmt", choices=("documents", "conversation", "locomo", "longmemeval"),
                   default="documents",
                   help="documents (default); or conversations to remember: conversation (hipgraph's "
                        "JSON/JSONL), locomo, longmemeval")
    p.add_argument("--granularity", choices=("segment", "turn", "session"), default=None,
                   help="conversations: memory units (default segment: topical segments)")
    p.add_argument("--llm-segments", action="store_true",
                   help="conversations: the LLM (--llm-base-url/--llm-model) places segment boundaries")
    add_dates(p)
    p.add_argument("--extractor", default=None,
                   help="spacy (default) | llm | precomputed:FILE (HippoRAG OpenIE JSON)")
    p.add_argument("--id-field", default="id")
    p.add_argument("--text-field", default="text")
    p.add_argument("--title-field", default="title")
    p.add_argument("--batch-size", type=int, default=None,
                   help="documents per committed batch (default: 256, growing with the index to "
                        "1/16 of its documents, at most 4096)")
    p.add_argument("--chunk-tokens", type=int, default=None, help="max tokens per passage (new index)")
    p.add_argument("--chunk-overlap", type=int, default=None, help="token overlap (new index)")
    p.add_argument("--vector-index", choices=("auto", "flat", "ivf", "hnsw"), default=None,
                   help="FAISS layout for a new index (auto: exact below 100k vectors per kind, IVF-SQ8 above)")
    p.add_argument("--executor", choices=("local", "ray"), default="local",
                   help="where chunking, extraction and embedding run: local (this machine) or ray "
                        "(Ray Data; pip install 'hipgraph[ray]')")
    p.add_argument("--workers", type=int, default=None,
                   help="local: worker processes (default: one process, extraction overlapped with "
                        "writes); ray: CPUs of the local cluster started when --ray-address is not given")
    p.add_argument("--ray-address", default=None, help="ray: address of a running cluster (e.g. ray://host:10001)")
    p.add_argument("--limit", type=int, default=None, help="index only the first N records")
    add_llm(p)
    add_output(p)
    p.set_defaults(func=cmd_index)

    p = sub.add_parser("query", help="retrieve passages for a question")
    add_db(p)
    add_embedder(p)
    p.add_argument("question")
    p.add_argument("-k", type=int, default=None,
                   help="hits to return (default 5; with --answer over conversation memory: as "
                        "many turns as --context-tokens hold)")
    p.add_argument("--mode", default="graph", choices=_modes(),
                   help="graph (default: facts and question entities seed a personalized PageRank), "
                        "dense, bm25, hybrid (reciprocal-rank fusion), decompose (the question's "
                        "constraints retrieved step by step, bridges chained) or expand (a query-"
                        "time subgraph grown from the question's entities)")
    p.add_argument("--persist", action="store_true",
                   help="expand mode: write verified new facts into the index")
    p.add_argument("--question-date", default=None,
                   help="conversation memory: when the question is asked (resolves 'last May')")
    p.add_argument("--as-of", default=None, help="conversation memory: memory as it stood at this time")
    group = p.add_argument_group("answering")
    group.add_argument("--answer", action="store_true",
                       help="hand the passages to a generator and print its cited answer")
    add_generator(group, "openai", "with --answer: openai (any OpenAI-compatible endpoint, set by "
                                   "--llm-base-url/--llm-model), local (a transformers model: "
                                   "--llm-model PATH, a folder or .gguf; default the packaged "
                                   "SmolLM2) or none (print the cited context)")
    add_retrieval(p)
    add_output(p)
    p.set_defaults(func=cmd_query)

    p = sub.add_parser("eval", help="retrieval recall@k per mode on a QA bundle (indexes its corpus "
                                    "when the index is empty, with ids str(idx))")
    add_db(p)
    add_embedder(p)
    p.add_argument("bundle", type=Path, help="bundle JSON with 'questions' (gold_idx) and 'corpus'; "
                                             "or a conversation file with --format")
    p.add_argument("--format", dest="fmt", choices=("bundle", "locomo", "longmemeval"), default="bundle",
                   help="locomo/longmemeval: evidence recall@k of conversation memory per question "
                        "category, one index per conversation under --db, against a turn-level "
                        "dense baseline")
    add_dates(p)
    p.add_argument("--modes", default="graph,dense,bm25",
                   help=f"comma-separated modes among {', '.join(_modes())}")
    p.add_argument("--mode", dest="modes", help=argparse.SUPPRESS)  # single-mode alias
    p.add_argument("--k", default="1,2,5,10", help="comma-separated cut-offs")
    p.add_argument("--turn-budgets", default="5,10,20",
                   help="locomo/longmemeval: evidence recall within the first B retrieved turns "
                        "(comma-separated; empty: none)")
    p.add_argument("--token-budgets", default="500,1000,2000",
                   help="locomo/longmemeval: evidence recall within N tokens of retrieved turns "
                        "(comma-separated; empty: none)")
    p.add_argument("--limit", type=int, default=None, help="first N questions")
    p.add_argument("--out", type=Path, default=None, help="write per-question rankings as JSONL")
    group = p.add_argument_group("answers")
    group.add_argument("--qa", action="store_true",
                       help="also answer each question (--generator, --llm-*) and report exact "
                            "match, token F1 and the abstention rate per mode")
    group.add_argument("--generator", choices=("openai", "local"), default="openai")
    group.add_argument("--context-tokens", type=int, default=2000)
    group.add_argument("--answer-k", type=int, default=None,
                       help="hits handed to the generator (default: 5 passages; conversation "
                            "memory: as many turns as --context-tokens hold)")
    add_strict_json(group)
    add_retrieval(p)
    add_output(p)
    p.set_defaults(func=cmd_eval)

    add_server_commands(sub)

    p = sub.add_parser("stats", help="counts of documents, passages, entities, facts, edges")
    add_db(p)
    add_embedder(p)
    add_output(p)
    p.set_defaults(func=cmd_stats)
    return parser


def _modes() -> tuple[str, ...]:
    from hipgraph.query.engine import MODES  # noqa: PLC0415

    return MODES


def _version() -> str:
    from hipgraph import __version__  # noqa: PLC0415

    return __version__


# ---------------------------------------------------------------------- commands
def _progress_bar(total: int, quiet: bool, desc: str):
    from tqdm import tqdm  # noqa: PLC0415

    return tqdm(total=total, desc=desc, unit="doc", disable=quiet or not sys.stderr.isatty(),
                dynamic_ncols=True, smoothing=0.1)


def cmd_index(args: argparse.Namespace) -> int:
    import hipgraph  # noqa: PLC0415
    from hipgraph.indexers.documents import SkippedRecord, to_document  # noqa: PLC0415
    from hipgraph.indexers.readers import FieldMap, read_inputs  # noqa: PLC0415

    if args.fmt != "documents":
        return _index_conversations(args)
    run = _run_args(args)
    fields = FieldMap(id=args.id_field, text=args.text_field, title=args.title_field)

    def records():
        return itertools.islice(read_inputs(args.inputs, fields), args.limit)

    total = 0
    for record in records():  # a first streamed pass checks every file and record's fields,
        total += 1  # so bad input writes nothing (and the corpus is never held in memory)
        with contextlib.suppress(SkippedRecord):  # counted and reported by add_documents
            to_document(record, where=record["_where"])
    extractor = extractor_config(args)
    from hipgraph.store.database import GraphStore  # noqa: PLC0415

    exists = GraphStore.has_index(args.db)
    config = None if exists else new_index_config(args)
    t0 = time.perf_counter()
    with (hipgraph.open(args.db, create=True, config=config, extractor=extractor,
                        embedder=session_embedder(args)) as hg,
          _progress_bar(total, args.quiet, "indexing") as bar):
        report = hg.add_documents(records(), progress=bar.update, batch_size=args.batch_size, **run)
        stats = hg.stats()
    elapsed = time.perf_counter() - t0
    out = {"report": report.to_dict(), "stats": stats, "seconds": round(elapsed, 3)}
    for warning in report.warnings:
        logger.warning("%s", warning)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        r = report
        print(f"indexed {args.db}: {r.added} added, {r.replaced} replaced, {r.unchanged} unchanged, "
              f"{r.skipped} skipped; {r.passages} passages, {r.entities_new} new entities, "
              f"{r.facts_new} new facts in {elapsed:.1f}s")
        _print_stats(stats)
    return 0


def _run_args(args: argparse.Namespace) -> dict[str, Any]:
    """The executor options of ``hipgraph index``."""
    if args.workers is not None and args.workers < 1:
        raise InputError(f"--workers must be >= 1, got {args.workers}")
    if args.ray_address and args.executor != "ray":
        raise InputError("--ray-address needs --executor ray")
    return {"executor": args.executor, "workers": args.workers, "ray_address": args.ray_address}


def _index_conversations(args: argparse.Namespace) -> int:
    import hipgraph  # noqa: PLC0415
    from hipgraph.config import ChatConfig  # noqa: PLC0415
    from hipgraph.indexers.conversations import read_conversation_file  # noqa: PLC0415
    from hipgraph.store.database import GraphStore  # noqa: PLC0415

    convs = []
    for name in args.inputs:  # every file is read and checked before anything is written
        convs.extend(read_conversation_file(Path(name), args.fmt, date_order(args))[0])
    if args.limit is not None:
        convs = convs[: args.limit]
    config = None if GraphStore.has_index(args.db) else new_index_config(args)
    t0 = time.perf_counter()
    with hipgraph.open(args.db, create=True, config=config, extractor=extractor_config(args),
                       embedder=session_embedder(args)) as hg:
        conv_cfg = hg.config.conversation
        if args.granularity:
            conv_cfg = dataclasses.replace(conv_cfg, granularity=args.granularity)
        sessions = sum(len(c.sessions) for c in convs)
        llm = None
        if args.llm_segments:
            if not args.llm_base_url or not args.llm_model:
                raise InputError("--llm-segments needs --llm-base-url and --llm-model")
            llm = ChatConfig(base_url=args.llm_base_url, model=args.llm_model,
                             api_key_env=args.llm_api_key_env, max_concurrency=args.llm_concurrency)
        with _progress_bar(sessions, args.quiet, "sessions") as bar:
            report = hg.add_conversations(convs, config=conv_cfg, llm=llm, progress=bar.update,
                                          **_run_args(args))
        stats = hg.stats()
    for warning in report.warnings:
        logger.warning("%s", warning)
    elapsed = time.perf_counter() - t0
    if args.json:
        print(json.dumps({"conversations": len(convs), "report": report.to_dict(), "stats": stats,
                          "seconds": round(elapsed, 3)}, indent=2))
    else:
        r = report
        print(f"indexed {args.db}: {len(convs)} conversation(s), {sessions} sessions: {r.added} added, "
              f"{r.replaced} replaced, {r.unchanged} unchanged; {r.passages} memory units, "
              f"{r.entities_new} new entities, {r.facts_new} new facts in {elapsed:.1f}s")
        _print_stats(stats)
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    import hipgraph  # noqa: PLC0415

    config = retrieval_config(args)
    if args.answer:
        generator = generator_config(args)
        with hipgraph.open(args.db, read_only=True, embedder=session_embedder(args)) as hg:
            answer = hg.answer(args.question, k=args.k, mode=args.mode, generator=generator,
                               config=config)
        if args.json:
            print(json.dumps(answer.to_dict(), indent=2))
        elif generator.name == "none":
            print(answer.context)
        else:
            print(f"Q: {args.question}")
            unstructured = " (unstructured reply)" if answer.usage.get("format") == "prose" else ""
            print("A: (the passages do not hold the answer)" if answer.abstained
                  else f"A: {answer.text}{unstructured}")
            for n, h in enumerate(answer.citations, start=1):
                print(f"  [{n}] {h.title} (doc {h.doc_id})")
        return 0
    if args.persist and args.mode != "expand":
        raise InputError("--persist applies to --mode expand only")
    if args.k is None:
        args.k = 5
    extra: dict[str, Any] = {}
    with hipgraph.open(args.db, read_only=not args.persist, embedder=session_embedder(args)) as hg:
        if args.mode == "decompose":
            result = hg.decompose(args.question, k=args.k, config=config)
            hits, extra["trace"] = result.hits, result.trace()
        elif args.mode == "expand":
            result = hg.expand(args.question, k=args.k, config=config, persist=args.persist)
            hits = result.hits
            extra.update({k: v for k, v in result.to_dict().items() if k not in {"question", "hits"}})
        else:
            hits = hg.retrieve(args.question, k=args.k, mode=args.mode, config=config,
                               question_date=args.question_date, as_of=args.as_of)
    if args.json:
        print(json.dumps({"question": args.question, "mode": args.mode, **extra,
                          "hits": [h.to_dict() for h in hits]}, indent=2))
    else:
        print(f"Q: {args.question}")
        trace = extra.get("trace")
        for step in trace.get("steps", []) if isinstance(trace, dict) else []:
            bridge = f" -> {step['bridge']}" if step.get("bridge") else ""
            attempt = step["attempts"][step["chosen_attempt"]]
            print(f"  step {step['step']}: {attempt['queries'][0][0]}{bridge}")
        for fact in extra.get("facts", []):
            mark = "" if fact.get("verified", True) else " (unverified)"
            print(f"  fact: ({fact.get('subject')}; {fact.get('relation')}; {fact.get('object')}){mark}")
        for h in hits:
            text = h.text if len(h.text) <= 240 else h.text[:237] + "..."
            print(f"{h.rank:>3}. [{h.score:.4f}] {h.title} (doc {h.doc_id})\n     {text}")
            if h.turn_ids:
                print(f"     turns {', '.join(h.turn_ids)} (session {h.session}, {h.time})")
            path = [step["name"] for step in h.why.get("path", []) if "name" in step]
            if path:
                print(f"     via: {' -> '.join(path)} -> this passage")
            if h.why.get("constraints"):
                print(f"     satisfies: {', '.join(f'step {n}' if n else 'question' for n in h.why['constraints'])}")
    return 0


def _cutoffs(text: str) -> list[int]:
    try:
        cutoffs = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError as exc:
        raise InputError(f"--k must be comma-separated integers, got {text!r}") from exc
    if not cutoffs or cutoffs[0] < 1:
        raise InputError(f"--k cut-offs must be integers >= 1, got {text!r}")
    return cutoffs


def _budgets(text: str, flag: str) -> list[int]:
    """Comma-separated budgets (integers >= 1); an empty string means none."""
    try:
        budgets = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError as exc:
        raise InputError(f"{flag} must be comma-separated integers, got {text!r}") from exc
    if budgets and budgets[0] < 1:
        raise InputError(f"{flag} budgets must be integers >= 1, got {text!r}")
    return budgets


def cmd_eval(args: argparse.Namespace) -> int:
    import hipgraph  # noqa: PLC0415
    from hipgraph.evaluation import evaluate, load_bundle  # noqa: PLC0415
    from hipgraph.store.database import GraphStore  # noqa: PLC0415

    if args.fmt != "bundle":
        return _eval_memory(args)
    bundle = load_bundle(args.bundle)
    cutoffs = _cutoffs(args.k)
    config = retrieval_config(args)
    generator = generator_config(args) if args.qa else None
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in _modes()]
    if unknown or not modes:
        raise InputError(f"unknown mode(s) {unknown or modes}; available: {', '.join(_modes())}")
    questions = bundle["questions"][: args.limit]
    if not GraphStore.has_index(args.db) or _is_empty(args.db):
        corpus = bundle.get("corpus") or []
        if not corpus:
            raise InputError("the index is empty and the bundle has no corpus to index",
                             source=str(args.bundle))
        records = [{"id": str(c.get("idx", i)), "title": c.get("title", ""), "text": c.get("text", ""),
                    "_where": f"{args.bundle}: corpus[{i}]"} for i, c in enumerate(corpus)]
        with hipgraph.open(args.db, create=True, embedder=session_embedder(args)) as hg, \
                _progress_bar(len(records), args.quiet, "indexing") as bar:
            hg.add_documents(records, progress=bar.update)
    with hipgraph.open(args.db, read_only=True, embedder=session_embedder(args)) as hg:
        results = evaluate(hg, questions, modes, cutoffs, config=config, generator=generator,
                           answer_k=args.answer_k)
    scored = [q for q in questions if q.get("gold_idx")]
    if args.out:
        with args.out.open("w", encoding="utf-8") as fh:
            for i, q in enumerate(scored):
                row = {"id": q.get("id", i), "question": q["question"],
                       "gold": [str(g) for g in q["gold_idx"]],
                       "rankings": {r.mode: r.rankings[i] for r in results}}
                if args.qa:
                    row["answers"] = {r.mode: r.predictions[i] for r in results}
                fh.write(json.dumps(row) + "\n")
    out = {"bundle": str(args.bundle), "questions": len(scored),
           "results": [r.to_dict() for r in results]}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"{len(scored)} questions with gold passages in {args.bundle}")
    header = "mode     " + "".join(f"  R@{k:<4d}" for k in cutoffs) + "   ms/q"
    print(header)
    for r in results:
        print(f"{r.mode:8s} " + "".join(f"  {r.recall[k]:6.2f}" for k in cutoffs)
              + f"  {r.ms_per_query:6.1f}")
        if r.qa:
            print(f"  answers: EM {r.qa['exact_match']:.2f}  F1 {r.qa['f1']:.2f}  "
                  f"abstained {r.qa['abstention_rate']:.2f}%  invalid {r.qa['invalid_rate']:.2f}%  "
                  f"(n={r.qa['questions']})")
        if r.decomposition:
            d = r.decomposition
            print(f"  decomposition vs gold: steps right {d['step_count_accuracy']:.2f}%  "
                  f"step F1 {d['step_f1']:.2f}  (n={d['questions']})")
        for g, rec in r.by_hops.items():
            print(f"  {g:6s} " + "".join(f"  {rec[k]:6.2f}" for k in cutoffs)
                  + f"   (n={r.hop_counts[g]})")
    return 0


def _eval_memory(args: argparse.Namespace) -> int:
    import hipgraph  # noqa: PLC0415
    from hipgraph.indexers.conversations import read_conversation_file  # noqa: PLC0415
    from hipgraph.memory_eval import BASELINE, evaluate_memory  # noqa: PLC0415

    cutoffs = _cutoffs(args.k)
    turn_budgets = _budgets(args.turn_budgets, "--turn-budgets")
    token_budgets = _budgets(args.token_budgets, "--token-budgets")
    # each conversation's index is opened (and built) with the session's embedder, as by index/query
    open_index = functools.partial(hipgraph.open, embedder=session_embedder(args))
    convs, questions = read_conversation_file(args.bundle, args.fmt, date_order(args))
    questions = [q for q in questions if q.get("evidence")][: args.limit]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in _modes()]
    if unknown or not modes:
        raise InputError(f"unknown mode(s) {unknown or modes}; available: {', '.join(_modes())}")
    with _progress_bar(len(questions), args.quiet, "questions") as bar:
        generator = generator_config(args) if args.qa else None
        results, index_seconds = evaluate_memory(args.db, convs, questions, modes, cutoffs,
                                                 config=retrieval_config(args), progress=bar.update,
                                                 generator=generator, answer_k=args.answer_k,
                                                 open_index=open_index, turn_budgets=turn_budgets,
                                                 token_budgets=token_budgets)
    rows = [r.to_dict() for r in results]
    base = next(d for d in rows if d["mode"] == BASELINE)
    columns = ([f"turns@{b}" for b in turn_budgets] + [f"tokens@{n}" for n in token_budgets]
               + [f"recall@{k}" for k in cutoffs])
    out = {"file": str(args.bundle), "questions": len(questions), "index_seconds": index_seconds,
           "results": rows,
           f"vs_{BASELINE}": {d["mode"]: _differences(d, base, columns) for d in rows if d is not base}}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"{len(questions)} questions with evidence turns in {args.bundle}; evidence recall (%) "
          f"within B retrieved turns (T@B) and N tokens of turns (tok@N) over the "
          f"{base['budget_questions']} non-adversarial ones, then within the top-k units (R@k) over "
          f"all; other modes show the difference to {BASELINE} after each value")
    if index_seconds:
        print("indexed " + ", ".join(f"{c} in {s:.1f}s" for c, s in index_seconds.items()))
    names = ([f"T@{b}" for b in turn_budgets] + [f"tok@{n}" for n in token_budgets]
             + [f"R@{k}" for k in cutoffs])
    print(f"{'mode / category':18s}" + "".join(f"{n:>13s}" for n in names) + "   ms/q")
    for r, d in zip(results, rows, strict=True):
        print(f"{r.mode:18s}" + _cells(d, base, columns) + f"  {r.ms_per_query:6.1f}")
        if r.qa:
            print(f"  answers: EM {r.qa['exact_match']:.2f}  F1 {r.qa['f1']:.2f}  abstained "
                  f"{r.qa['abstention_rate']:.2f}% (n={r.qa['questions']}); adversarial abstained "
                  f"{r.qa['adversarial_abstained']:.2f}%")
        for c, cat in d["by_category"].items():
            print(f"  {c[:16]:16s}" + _cells(cat, base["by_category"][c], columns, d is base)
                  + f"   (n={r.counts[c]})")
    return 0


def _differences(row: dict[str, Any], base: dict[str, Any], columns: list[str]) -> dict[str, Any]:
    """``row`` minus ``base`` on each column both have, overall and per category."""
    def diff(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
        return {c: round(a[c] - b[c], 2) for c in columns if c in a and c in b}

    return {**diff(row, base), "by_category": {c: diff(v, base["by_category"].get(c, {}))
                                               for c, v in row["by_category"].items()}}


def _cells(row: dict[str, Any], base: dict[str, Any], columns: list[str], is_base: bool | None = None) -> str:
    """One 13-character cell per column: the value, and its difference to ``base`` unless this is
    the baseline; ``-`` where the row has no value (budgets leave adversarial questions out)."""
    is_base = row is base if is_base is None else is_base
    cells = []
    for c in columns:
        if c not in row:
            cells.append(f"{'-':>13s}")
        elif is_base or c not in base:
            cells.append(f"{row[c]:7.1f}      ")
        else:
            cells.append(f"{row[c]:7.1f}{row[c] - base[c]:+6.1f}")
    return "".join(cells)


def _is_empty(db: Path) -> bool:
    from hipgraph.store.database import GraphStore  # noqa: PLC0415

    store = GraphStore.open(db, read_only=True)
    try:
        return store.stats()["documents"] == 0
    finally:
        store.close()


def cmd_stats(args: argparse.Namespace) -> int:
    import hipgraph  # noqa: PLC0415

    with hipgraph.open(args.db, read_only=True, embedder=session_embedder(args)) as hg:
        stats = hg.stats()
    if args.json:
        print(json.dumps(stats, indent=2))
    else:
        _print_stats(stats)
    return 0


def _print_stats(stats: dict[str, Any]) -> None:
    edges = stats["edges"]
    print(f"documents {stats['documents']}  passages {stats['passages']}  entities {stats['entities']}  "
          f"facts {stats['facts']}  edges: fact {edges['fact']}, mention {edges['mention']}, "
          f"synonym {edges['synonym']}")


# ---------------------------------------------------------------------- entry point
def _setup_logging(args: argparse.Namespace) -> None:
    level = logging.DEBUG if args.verbose else logging.ERROR if args.quiet else logging.WARNING
    logging.basicConfig(level=level, format="hipgraph: %(levelname)s: %(message)s", stream=sys.stderr)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        from transformers.utils import logging as hf_logging  # noqa: PLC0415

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except ImportError:
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. Exit status: 0 done; 2 a usage error (bad arguments, input files or
    request: empty question, ``k < 1``, a question over the length limit), one line on stderr;
    1 any other hipgraph error (no index, index locked, a backend failed); 130 interrupted."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    for i, arg in enumerate(argv, start=1):
        if unicode_fault(arg):  # bytes that are not UTF-8 reach Python as lone surrogates
            at, ch = next((j, c) for j, c in enumerate(arg) if "\ud800" <= c <= "\udfff")
            what = f"byte 0x{ord(ch) - 0xDC00:02x}" if "\udc80" <= ch <= "\udcff" else repr(ch)
            print(f"hipgraph: error: argument {i} is not valid UTF-8 ({what} at character {at})",
                  file=sys.stderr)
            return 2
    args = parser.parse_args(argv)
    _setup_logging(args)
    try:
        return int(args.func(args) or 0)
    except (InputError, ConfigError) as exc:  # the user's input or options: a usage error
        print(f"hipgraph: error: {exc}", file=sys.stderr)
        return 2
    except HipgraphError as exc:
        print(f"hipgraph: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("hipgraph: interrupted; committed batches are kept, re-run to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
