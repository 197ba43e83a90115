"""Mutation testing of hipgraph's core rules: does the test suite notice when the code is wrong?

Two kinds of mutants, each run against the tests that guard its module, in a private copy of the
repository (the working tree is never touched):

- ``named`` (default): the hand-written mutations of ``tests/mutants.md`` (``MUTANTS`` below):
  each breaks one documented rule (seeding, synonyms, vector writes, dangling mass in PPR, fact
  validity, time ranges, chunk offsets, deletes) and names the test expected to catch it.
- ``auto``: mutants generated from the AST of the target modules (comparison, arithmetic and
  boolean operators, constants, min/max, ``not``, slices, returns, SQL operators inside query
  strings), a deterministic sample of at most ``--max-per-file`` per module.

A mutant is *killed* when its tests fail (or time out), *survived* when they pass. Survivors of an
``auto`` run are listed with their diff so a reader can judge whether each is equivalent (changes
no observable behaviour) or a gap in the tests. Usage::

    python benchmarks/mutants.py named [--jobs 2]
    python benchmarks/mutants.py auto [--max-per-file 40] [--jobs 2] [--only temporal]
    python benchmarks/mutants.py auto --list            # the mutants, without running them
    python benchmarks/mutants.py auto --only temporal --tests tests/test_temporal.py  # other tests
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures as cf
import difflib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# module -> the tests that guard it (pytest node ids or files, run with -x)
GUARDS: dict[str, list[str]] = {
    "hipgraph/query/graph.py": ["tests/test_graph_seeding.py", "tests/test_query.py"],
    "hipgraph/indexers/graph_update.py": ["tests/test_indexing.py"],
    "hipgraph/query/validity.py": ["tests/test_validity.py", "tests/test_conversations.py"],
    "hipgraph/temporal.py": ["tests/test_temporal.py", "tests/test_conversations.py"],
}


@dataclass(frozen=True)
class Mutant:
    """One change to one file: ``old`` (unique in the file) becomes ``new``."""

    name: str
    path: str
    old: str
    new: str
    rule: str = ""
    caught_by: str = ""  # the test expected to fail (named mutants)
    tests: tuple[str, ...] = ()  # overrides GUARDS[path]


# ------------------------------------------------------------------ named mutants
MUTANTS: list[Mutant] = []  # filled from tests/mutants.md (see load_named)


def load_named(path: Path = REPO / "tests" / "mutants.md") -> list[Mutant]:
    """The mutants of ``tests/mutants.md``: each ``### name`` section holds ``file:``, ``rule:``,
    ``caught by:``, ``tests:`` lines and two fenced blocks, the original text then the mutant."""
    out: list[Mutant] = []
    text = path.read_text(encoding="utf-8")
    for section in text.split("\n### ")[1:]:
        head, _, body = section.partition("\n")
        fields: dict[str, str] = {}
        for line in body.splitlines():
            if line.startswith("- ") and ":" in line:
                key, _, value = line[2:].partition(":")
                fields[key.strip().lower()] = value.strip().strip("`")
        blocks = body.split("```")
        if len(blocks) < 5:
            raise SystemExit(f"mutants.md: section {head!r} needs two fenced blocks (old, new)")
        old, new = (b.partition("\n")[2].rstrip("\n") for b in (blocks[1], blocks[3]))
        tests = tuple(t.strip().strip("`") for t in fields.get("tests", "").split(",") if t.strip())
        out.append(Mutant(head.strip(), fields["file"], old, new, fields.get("rule", ""),
                          fields.get("caught by", ""), tests))
    return out


# ------------------------------------------------------------------ generated mutants
_CMP_SWAP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
             ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
_BIN_SWAP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
             ast.FloorDiv: ast.Mult, ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult}
_SQL_SWAPS = [(" >= ", " > "), (" <= ", " < "), (" <> ", " = "), (" = ", " <> "), (" > ", " >= "),
              (" < ", " <= "), ("least(", "greatest("), ("greatest(", "least("), (" AND ", " OR "),
              (" NOT IN ", " IN "), ("DISTINCT ", ""), ("count(*)", "1"), (" DESC", " ASC"),
              ("min(", "max("), ("max(", "min(")]
_SQL_WORDS = ("SELECT", "INSERT", "UPDATE", "DELETE")


class _Points(ast.NodeVisitor):
    """Collects ``(node, mutated copy, description)`` for every mutation point."""

    def __init__(self) -> None:
        # (node, mutated node or None, description, (old, new) text swap inside the node or None)
        self.points: list[tuple[ast.AST, ast.AST | None, str, tuple[str, str] | None]] = []
        self._skip: set[int] = set()

    def _add(self, node: ast.AST, new: ast.AST | None, what: str,
             swap: tuple[str, str] | None = None) -> None:
        self.points.append((node, new, what, swap))

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:  # noqa: N802
        self._skip_docstring(node)
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef  # noqa: N815

    def visit_ClassDef(self, node: ast.ClassDef) -> None:  # noqa: N802
        self._skip_docstring(node)
        self.generic_visit(node)

    def visit_Module(self, node: ast.Module) -> None:  # noqa: N802
        self._skip_docstring(node)
        self.generic_visit(node)

    def _skip_docstring(self, node) -> None:
        body = getattr(node, "body", [])
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            self._skip.add(id(body[0].value))

    def visit_Call(self, node: ast.Call) -> None:  # noqa: N802
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "logger":
            return  # log messages are not behaviour
        if name in {"min", "max"} and isinstance(func, ast.Name):
            new = _copy(node)
            new.func = ast.Name("max" if name == "min" else "min", ast.Load())
            self._add(node, new, f"{name} -> {'max' if name == 'min' else 'min'}")
        self.generic_visit(node)

    def visit_Raise(self, node: ast.Raise) -> None:  # noqa: N802
        return  # error messages are not mutated

    def visit_Compare(self, node: ast.Compare) -> None:  # noqa: N802
        for i, op in enumerate(node.ops):
            swap = _CMP_SWAP.get(type(op))
            if swap is not None:
                new = _copy(node)
                new.ops[i] = swap()
                self._add(node, new, f"{type(op).__name__} -> {swap.__name__}")
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:  # noqa: N802
        swap = _BIN_SWAP.get(type(node.op))
        if swap is not None and not _is_string(node.left):
            new = _copy(node)
            new.op = swap()
            self._add(node, new, f"{type(node.op).__name__} -> {swap.__name__}")
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:  # noqa: N802
        swap = _BIN_SWAP.get(type(node.op))
        if swap is not None:
            new = _copy(node)
            new.op = swap()
            self._add(node, new, f"augmented {type(node.op).__name__} -> {swap.__name__}")
        self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:  # noqa: N802
        new = _copy(node)
        new.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        self._add(node, new, "and <-> or")
        for i in range(len(node.values)):  # drop one operand
            dropped = _copy(node)
            del dropped.values[i]
            self._add(node, dropped.values[0] if len(dropped.values) == 1 else dropped,
                      f"drop operand {i} of {type(node.op).__name__.lower()}")
        self.generic_visit(node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> None:  # noqa: N802
        if isinstance(node.op, ast.Not):
            self._add(node, _copy(node.operand), "drop not")
        elif isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
            self._add(node, _copy(node.operand), "drop unary minus")
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:  # noqa: N802
        if id(node) in self._skip:
            return
        v = node.value
        if isinstance(v, bool):
            self._add(node, ast.Constant(not v), f"{v} -> {not v}")
        elif isinstance(v, int):
            self._add(node, ast.Constant(v + 1), f"{v} -> {v + 1}")
            if v != 0:
                self._add(node, ast.Constant(0), f"{v} -> 0")
        elif isinstance(v, float):
            self._add(node, ast.Constant(v * 2 if v else 1.0), f"{v} -> {v * 2 if v else 1.0}")
        elif isinstance(v, str) and any(w in v for w in _SQL_WORDS):
            for a, b in _SQL_SWAPS:
                if a in v:
                    self._add(node, None, f"SQL {a.strip()!r} -> {b.strip()!r}", (a, b))

    def visit_Subscript(self, node: ast.Subscript) -> None:  # noqa: N802
        s = node.slice
        if isinstance(s, ast.Slice) and (s.lower is not None or s.upper is not None) and s.step is None:
            self._add(node, _copy(node.value), "drop slice")
        self.generic_visit(node)

    def visit_Return(self, node: ast.Return) -> None:  # noqa: N802
        if node.value is not None and not (isinstance(node.value, ast.Constant) and node.value.value is None):
            self._add(node, ast.Return(ast.Constant(None)), "return None")
        self.generic_visit(node)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:  # noqa: N802
        # f-strings are messages or SQL assembled from parts: mutate the SQL parts only
        for part in node.values:
            if isinstance(part, ast.Constant) and isinstance(part.value, str):
                self.visit_Constant(part)


def _copy(node: ast.AST) -> ast.AST:
    return ast.parse(ast.unparse(node), mode="eval").body if isinstance(node, ast.expr) else \
        ast.parse(ast.unparse(node)).body[0]


def _is_string(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) or isinstance(node, ast.JoinedStr)


def _offsets(source: str) -> list[int]:
    starts, pos = [], 0
    for line in source.splitlines(keepends=True):
        starts.append(pos)
        pos += len(line.encode("utf-8"))
    return starts


def generate(path: str, source: str) -> list[Mutant]:
    """Every AST mutant of ``source``, as exact text replacements of the mutated node."""
    tree = ast.parse(source)
    visitor = _Points()
    visitor.visit(tree)
    raw = source.encode("utf-8")
    starts = _offsets(source)
    out: list[Mutant] = []
    seen: set[tuple[int, int, str]] = set()
    for node, new, what, swap in visitor.points:
        a = starts[node.lineno - 1] + node.col_offset
        b = starts[node.end_lineno - 1] + node.end_col_offset
        old_text = raw[a:b].decode("utf-8")
        if swap is not None:  # inside a string literal: keep its own quoting
            if swap[0] not in old_text:
                continue
            new_text = old_text.replace(swap[0], swap[1], 1)
        else:
            new_text = ast.unparse(new)
            if isinstance(node, ast.expr) and not isinstance(node, ast.Constant | ast.Name):
                new_text = f"({new_text})"
        key = (a, b, new_text)
        if key in seen or new_text == old_text:
            continue
        seen.add(key)
        mutated = raw[:a] + new_text.encode("utf-8") + raw[b:]
        try:
            ast.parse(mutated)
        except SyntaxError:
            continue
        out.append(Mutant(f"{Path(path).stem}:{node.lineno}: {what}", path, "", mutated.decode("utf-8")))
    return out


# ------------------------------------------------------------------ running
@dataclass
class Outcome:
    name: str
    path: str
    status: str  # killed | survived | timeout | error
    seconds: float
    failed_test: str = ""
    diff: str = ""
    rule: str = ""
    caught_by: str = ""


def _workspace(root: Path) -> Path:
    """A private copy of the repository's code, tests and data (``shared`` linked beside it)."""
    repo = root / "repo"
    for part in ("hipgraph", "tests", "data", "benchmarks"):
        shutil.copytree(REPO / part, repo / part, ignore=shutil.ignore_patterns("__pycache__"))
    for part in ("pyproject.toml",):
        shutil.copy2(REPO / part, repo / part)
    shared = REPO.parent / "shared"
    if shared.exists():
        (root / "shared").symlink_to(shared)
    return repo


def _apply(repo: Path, mutant: Mutant) -> tuple[str, str]:
    target = repo / mutant.path
    original = (REPO / mutant.path).read_text(encoding="utf-8")
    if mutant.old:
        if original.count(mutant.old) != 1:
            raise ValueError(f"{mutant.name}: the original text occurs {original.count(mutant.old)} "
                             f"times in {mutant.path} (must be once)")
        mutated = original.replace(mutant.old, mutant.new)
    else:
        mutated = mutant.new
    target.write_text(mutated, encoding="utf-8")
    return original, mutated


def run_mutant(repo: Path, mutant: Mutant, timeout: float) -> Outcome:
    original, mutated = _apply(repo, mutant)
    diff = "".join(difflib.unified_diff(original.splitlines(True), mutated.splitlines(True),
                                        mutant.path, mutant.path, n=0))
    tests = list(mutant.tests or GUARDS.get(mutant.path, ["tests"]))
    env = dict(os.environ, PYTHONPATH=str(repo), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-W", "ignore",
           "--no-header", "-o", "addopts=", *tests]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=timeout)
        # 1: tests failed; 2: interrupted, e.g. the mutant made its module unimportable (a
        # collection error the suite reports); anything else means the tests could not run
        status = "survived" if proc.returncode == 0 else "killed" if proc.returncode in (1, 2) else "error"
        failed = next((("" if line.startswith("FAILED ") else "error in ")
                       + line.split(" ", 1)[1].split(" - ")[0]
                       for line in proc.stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))), "")
        if status == "error":
            failed = (proc.stdout + proc.stderr).strip().splitlines()[-1][:200] if (proc.stdout + proc.stderr).strip() else ""
    except subprocess.TimeoutExpired:
        status, failed = "timeout", ""
    finally:
        (repo / mutant.path).write_text(original, encoding="utf-8")
    return Outcome(mutant.name, mutant.path, status, round(time.perf_counter() - start, 1), failed, diff,
                   mutant.rule, mutant.caught_by)


def _sample(mutants: list[Mutant], limit: int, seed: int) -> list[Mutant]:
    if len(mutants) <= limit:
        return mutants
    rng = random.Random(seed)
    return sorted(rng.sample(mutants, limit), key=mutants.index)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=("named", "auto"), nargs="?", default="named")
    ap.add_argument("--only", default="", help="substring of the module paths or mutant names to run")
    ap.add_argument("--max-per-file", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per mutant (a timeout kills it)")
    ap.add_argument("--list", action="store_true", help="print the mutants and exit")
    ap.add_argument("--out", type=Path, help="write every outcome as JSON lines here")
    ap.add_argument("--tests", nargs="+", metavar="TEST",
                    help="run these tests (files or node ids) against every mutant instead of its guards")
    args = ap.parse_args(argv)

    if args.kind == "named":
        mutants = load_named()
    else:
        mutants = []
        for path in GUARDS:
            mutants += _sample(generate(path, (REPO / path).read_text(encoding="utf-8")), args.max_per_file,
                               args.seed)
    if args.only:
        mutants = [m for m in mutants if args.only in m.path or args.only in m.name]
    if args.tests:
        mutants = [replace(m, tests=tuple(args.tests)) for m in mutants]
    if args.list:
        for m in mutants:
            print(m.name)
        print(f"{len(mutants)} mutants")
        return 0

    with tempfile.TemporaryDirectory(prefix="hipgraph-mutants-") as tmp:
        repos = [_workspace(Path(tmp) / f"w{i}") for i in range(max(1, args.jobs))]
        free = list(repos)
        outcomes: list[Outcome] = []
        with cf.ThreadPoolExecutor(len(repos)) as pool:
            pending = {}
            queue = list(mutants)
            while queue or pending:
                while queue and free:
                    repo = free.pop()
                    m = queue.pop(0)
                    pending[pool.submit(run_mutant, repo, m, args.timeout)] = repo
                done, _ = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
                for fut in done:
                    free.append(pending.pop(fut))
                    o = fut.result()
                    outcomes.append(o)
                    tail = f" [{o.failed_test}]" if o.failed_test else ""
                    print(f"{o.status:8s} {o.seconds:6.1f}s  {o.name}{tail}", flush=True)
                    if args.out:
                        with args.out.open("a", encoding="utf-8") as fh:
                            fh.write(json.dumps(asdict(o)) + "\n")
    killed = sum(o.status in {"killed", "timeout"} for o in outcomes)
    errors = [o for o in outcomes if o.status == "error"]
    survived = [o for o in outcomes if o.status == "survived"]
    print(f"\n{killed} of {len(outcomes)} mutants killed ({100.0 * killed / max(1, len(outcomes)):.1f}%), "
          f"{len(survived)} survived, {len(errors)} errors (the tests could not run: see below)")
    if args.kind == "named":
        wrong = [o for o in outcomes if o.status != "survived" and o.caught_by
                 and o.caught_by.split("::")[-1] not in o.failed_test]
        for o in wrong:
            print(f"note: {o.name} was caught by {o.failed_test or o.status}, not {o.caught_by}")
    for o in survived + errors:
        print(f"\n--- {o.status}: {o.name}\n{o.diff}{o.failed_test}")
    return 0 if not survived and not errors else 1


if __name__ == "__main__":
    sys.exit(main())
