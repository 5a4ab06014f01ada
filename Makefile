# Two commands do all the set-up on a fresh clone:
#   make demo   venv + install, then `rlpipe train configs/quickstart.toml` on embedded defaults
#   make test   venv + install + system packages (bubblewrap, docker engine), then the tests
VENV    := .venv
PYTHON  ?= python3
BIN     := $(VENV)/bin

.PHONY: demo test venv system lint bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0   # the CPU wheel; an unpinned torch pulls a multi-GB CUDA build
	$(BIN)/pip install -q -e '.[test]'
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

clean:
	rm -rf $(VENV) rlpipe-lake mlruns.db mlartifacts .pytest_cache
