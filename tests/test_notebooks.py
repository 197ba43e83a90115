"""The notebooks run offline on data/ (executed here, so a broken one fails CI) and are stored
without outputs."""

from __future__ import annotations

import json
import os

import pytest
from conftest import REPO

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def test_the_three_notebooks_exist():
    assert [p.name for p in NOTEBOOKS] == ["01_quickstart.ipynb", "02_explore_graph.ipynb",
                                           "03_conversation_memory.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stored_without_outputs(path):
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    code = [c for c in cells if c["cell_type"] == "code"]
    assert code and all(not c["outputs"] and c["execution_count"] is None for c in code)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, tmp_path, tmp_path_factory):
    import nbclient  # dev dependencies (`make test` installs them): a missing one fails, never skips
    import nbformat
    shared = tmp_path_factory.getbasetemp() / "notebook-indexes"  # 01 builds the index 02 reuses
    env = {"HIPGRAPH_NOTEBOOK_INDEX": str(shared / "sample"),
           "HIPGRAPH_NOTEBOOK_MEMORY": str(tmp_path / "memory"), "MPLBACKEND": "Agg"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        nb = nbformat.read(path, as_version=4)
        nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                                resources={"metadata": {"path": str(path.parent)}}).execute()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    html = [o["data"]["text/html"] for c in nb.cells if c.cell_type == "code" for o in c.outputs
            if "text/html" in o.get("data", {})]
    assert html, "hits, answers or stats render as HTML tables"
