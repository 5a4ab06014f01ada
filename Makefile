# Two commands do all the set-up on a fresh clone:
#   make demo   venv + install, then `rlpipe train configs/quickstart.toml` on embedded defaults
#   make test   venv + install + system packages (bubblewrap, docker engine), then the tests
VENV    := .venv
PYTHON  ?= python3
BIN     := $(VENV)/bin
PIP_VERSION := 26.3

.PHONY: demo test venv system lint bench lock clean venv-vllm test-vllm

# The versions CI tested (requirements.lock: every package, torch the CPU wheel), then rlpipe
# itself without resolving anything again; --no-build-isolation builds it with the locked
# setuptools instead of downloading the newest one.
$(BIN)/.installed: pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q pip==$(PIP_VERSION)
	$(BIN)/pip install -q -r requirements.lock
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
	$(BIN)/pip check
	touch $@

venv: $(BIN)/.installed

system:
	bash scripts/system-setup.sh

demo: venv
	$(BIN)/rlpipe train configs/quickstart.toml

test: venv system
	$(BIN)/lint-imports
	$(BIN)/pytest -q

bench: venv
	$(BIN)/python benchmarks/step_breakdown.py

# After changing pyproject.toml's dependencies: in a venv made by `pip install -e '.[test]'`,
# write what it holds as the new lock (keeping the file's header), then test and commit both.
lock:
	{ grep '^#' requirements.lock; $(BIN)/pip freeze --all --exclude-editable | grep -v -i -E '^(pip|rlpipe)=='; } > requirements.lock.new
	mv requirements.lock.new requirements.lock

# vLLM's CPU build in a venv of its own (it pins transformers<5.20, which requirements.lock's
# 5.24 contradicts): every package from requirements-vllm.lock without resolving, then rlpipe
# --no-deps. No `pip check`: the lock leaves out torchvision/torchaudio/torchcodec on purpose
# (see its header). The tests load only tests/vllm's conftest (tests/conftest.py needs prefect).
VLLM_VENV := .venv-vllm
$(VLLM_VENV)/bin/.installed: pyproject.toml requirements-vllm.lock
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q pip==$(PIP_VERSION)
	$(VLLM_VENV)/bin/pip install -q --no-deps -r requirements-vllm.lock
	$(VLLM_VENV)/bin/pip install -q --no-deps --no-build-isolation -e .
	touch $@

venv-vllm: $(VLLM_VENV)/bin/.installed

test-vllm: venv-vllm
	$(VLLM_VENV)/bin/pytest -q --confcutdir=tests/vllm -p no:cacheprovider tests/vllm

clean:
	rm -rf $(VENV) $(VLLM_VENV) rlpipe-lake mlruns.db mlartifacts .pytest_cache
