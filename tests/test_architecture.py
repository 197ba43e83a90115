"""Import boundaries between hipgraph's packages, checked on the source (every import statement,
module-level or inside a function, absolute or relative)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "hipgraph"
READ_SIDE = ["query", "generation", "evaluation.py", "memory_eval.py"]


def _module_name(path: Path, package_dir: Path = PACKAGE) -> str:
    parts = path.relative_to(package_dir.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(path: Path, package_dir: Path = PACKAGE) -> list[tuple[int, str]]:
    """``(line, absolute module name)`` of every import in ``path``, sorted; for ``from X import a``
    both ``X`` and ``X.a`` are listed (``a`` may be a submodule)."""
    module = _module_name(path, package_dir)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            out.append((node.lineno, source))
            out += [(node.lineno, f"{source}.{alias.name}") for alias in node.names]
    return sorted(out)


def _violations(targets: list[str], forbidden: tuple[str, ...]) -> list[str]:
    files: list[Path] = []
    for target in targets:
        path = PACKAGE / target
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    assert files and all(f.is_file() for f in files), targets
    found = []
    for path in files:
        for line, name in _imported_modules(path):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                found.append(f"{_module_name(path)} (line {line}) imports {name}")
    return found


def test_read_side_imports_nothing_from_the_indexers():
    assert _violations(READ_SIDE, ("hipgraph.indexers",)) == []


def test_shared_vocabulary_imports_neither_side_nor_the_store():
    forbidden = ("hipgraph.indexers", "hipgraph.query", "hipgraph.store")
    assert _violations(["text"], forbidden) == []


def test_relative_imports_resolve_to_absolute_names(tmp_path):
    """The resolver the two tests above rely on: relative forms name the module they import."""
    pkg = tmp_path / "hipgraph" / "query"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import engine\n")
    source = pkg / "mod.py"
    source.write_text("import os\nfrom ..indexers import compute\n"
                      "def f():\n    from ..indexers.normalize import x\n    from .hits import y\n")
    root = tmp_path / "hipgraph"
    assert _imported_modules(source, root) == [
        (1, "os"), (2, "hipgraph.indexers"), (2, "hipgraph.indexers.compute"),
        (4, "hipgraph.indexers.normalize"), (4, "hipgraph.indexers.normalize.x"),
        (5, "hipgraph.query.hits"), (5, "hipgraph.query.hits.y")]
    assert _imported_modules(pkg / "__init__.py", root) == [
        (1, "hipgraph.query"), (1, "hipgraph.query.engine")]


def _attribute_uses(targets: list[str], names: set[str], exclude: tuple[str, ...] = ()) -> list[str]:
    """``module (line) uses .name`` for every attribute access ``x.name`` in the targets."""
    found = []
    for target in targets:
        path = PACKAGE / target
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            rel = file.relative_to(PACKAGE).as_posix()
            if any(rel.startswith(e) for e in exclude):
                continue
            for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Attribute) and node.attr in names:
                    found.append(f"{_module_name(file)} (line {node.lineno}) uses .{node.attr}")
    return found


def test_only_the_store_and_the_indexers_touch_the_database_connection():
    raw = {"con", "execute", "executemany", "sql", "cursor", "_root_con"}
    assert _attribute_uses(["."], raw, exclude=("store/", "indexers/")) == []


def test_the_read_side_never_writes():
    """No store or index write calls in the read side (it writes derived caches only: the graph
    snapshot and BM25 files under cache/)."""
    writes = {"transaction", "writing", "on_commit", "meta_set", "insert", "write_vectors",
              "bump_generation", "allocate_ids", "allocate_id_blocks", "apply", "delete_documents", "add_documents",
              "persist_learned_facts"}
    assert _attribute_uses(READ_SIDE, writes) == []


def test_no_module_is_longer_than_600_lines():
    long = {f.relative_to(PACKAGE).as_posix(): n for f in sorted(PACKAGE.rglob("*.py"))
            if (n := len(f.read_text(encoding="utf-8").splitlines())) > 600}
    assert long == {}
