# On a fresh clone:  make grade,  make check STAGE=a01,  make lab  (make help: every target)
# Each creates .venv on first use and installs nothing on later runs.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
IMPL   ?= assignments
STAGE  ?=
# Messages in make's syntax (BORROW=a06,a07 rather than --borrow a06,a07) for what make starts.
export COURSE_VIA_MAKE := 1
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
# CPU-only machines get torch 2.13.0 and the Triton the GPU runs were made with (3.6, for
# its interpreter); GPU machines get the newest torch, which brings its own Triton. Both
# come from pip's default index: on Linux x86_64 that is PyPI's CUDA build (nvidia-*
# wheels, GBs) even without a GPU; README.md's quick start shows the TORCH= for the CPU build.
TORCH  ?= $(if $(shell command -v nvidia-smi 2>/dev/null),torch,torch==2.13.0 triton==3.6.0)
# make lab: JupyterLab (pyproject's `notebooks` extra, installed on first use) on lectures/.
# With no display (Linux without DISPLAY/WAYLAND_DISPLAY) or over ssh it opens no browser
# and prints the URL; as root (GPU containers often are) it passes --allow-root, which
# Jupyter asks for. LAB_ARGS= (empty) or LAB_ARGS="--port 8899" to override.
LAB_STAMP := $(VENV)/.lab-installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
HEADLESS := $(if $(SSH_CONNECTION),yes,$(if $(filter Darwin,$(shell uname -s)),,$(if $(DISPLAY)$(WAYLAND_DISPLAY),,yes)))
LAB_ARGS ?= $(strip $(if $(HEADLESS),--no-browser) $(if $(filter 0,$(shell id -u 2>/dev/null)),--allow-root))

.PHONY: test grade check bench lab ncu notebooks results clean help
help:
	@echo "make grade     - grade your work (IMPL=assignments, the default | solutions | path/to/submission); STAGE=a03 or 3"
	@echo "                 (or 3,8) for some stages; installs .venv on first use; ARGS=--help: how you are scored"
	@echo "make check STAGE=a03 - the stage's tests on your work, stopping at the first failure; K=add_bias picks tests"
	@echo "make bench STAGE=a06 - the stage's benchmark against PyTorch on IMPL= (GPU); ARGS=\"--quick\" passes options"
	@echo "make ncu STAGE=a05 - Nsight Compute on the stage's benchmark case (GPU + ncu); IMPL= as for grade, NCU_ARGS= more options"
	@echo "make lab       - install JupyterLab (first time) and open the lectures (headless: prints the URL)"
	@echo "make test      - the course's self-check (instructors, CI): solutions/ against every test, the stub and mutation checks"
	@echo "make notebooks - execute every lecture notebook"
	@echo "make results STAGE=a06 - rerun on a GPU what lectures/results/ holds for the stage (all stages without STAGE)"

$(STAMP):
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is required, found " + sys.version.split()[0]'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check $(TORCH)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev]'
	@rm -f $(VENV)/.installed-*; touch $@

# --mutants: also the slow course self-checks (the mutation checks, the stub check); CI runs this. On a
# CPU-only machine it runs in one worker process per core (tests/autograder.py; COURSE_WORKERS=0: one).
test: $(STAMP)
	$(BIN)/python -m pytest --impl solutions --mutants --durations=25

# A stage is named as a03, 3, 03 or a03_fused_linear (common/impl.py's stage_key reads every one; anything
# else: an error that lists the stages).

# make grade [STAGE=a03 or 3,5] [IMPL=...] [BORROW=a06,a07] [ARGS="--json"]; make grade ARGS=--help: the rules
grade: $(STAMP)
	$(BIN)/python -m common.course.grade --impl $(IMPL) $(if $(STAGE),--stages '$(STAGE)') $(if $(BORROW),--borrow $(BORROW)) $(ARGS)

# make check STAGE=a03 [IMPL=...] [K="add_bias"] [BORROW=a06,a07]: one stage's tests, -x --tb=short
check: $(STAMP)
	$(if $(STAGE),,$(error make check needs a stage: make check STAGE=a03))
	@tests=$$($(BIN)/python -P common/impl.py stage '$(STAGE)' check) || exit 2; \
	echo "$(BIN)/python -m pytest $$tests --impl $(IMPL) -x --tb=short $(if $(K),-k \"$(K)\") $(if $(BORROW),--borrow $(BORROW))"; \
	$(BIN)/python -m pytest $$tests --impl $(IMPL) -x --tb=short $(if $(K),-k "$(K)") $(if $(BORROW),--borrow $(BORROW))

# make bench STAGE=a06 [IMPL=...] [ARGS="--quick"]: the stage's benchmark (common/course/bench.py), on a GPU
bench: $(STAMP)
	$(if $(STAGE),,$(error make bench needs a stage: make bench STAGE=a06 (a01 ... a09, a07c)))
	$(BIN)/python -m common.course.bench '$(STAGE)' --impl $(IMPL) $(ARGS)

$(LAB_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev,notebooks]'
	@rm -f $(VENV)/.lab-installed-*; touch $@

lab: $(LAB_STAMP)
	@echo "JupyterLab on lectures/ with the course's .venv kernel$(if $(HEADLESS), (no browser here: open the http://localhost:... URL below; from another machine: ssh -L 8888:localhost:8888 this-host)); Ctrl-C twice to stop."
	cd lectures && $(abspath $(BIN))/python -m jupyterlab $(LAB_ARGS)

ncu: $(STAMP)
	$(if $(STAGE),,$(error make ncu needs a stage: make ncu STAGE=a05 (a02 ... a09)))
	$(BIN)/python -m common.course.ncu '$(STAGE)' --impl $(IMPL) $(NCU_ARGS)

notebooks: $(STAMP)
	$(BIN)/python -m pytest tests/test_notebooks.py -v

# make results [STAGE=a06]: the GPU scripts behind the stage's tables and plots (its stage.py's results_runs())
results: $(STAMP)
	$(BIN)/python -m lectures._tools.results $(if $(STAGE),--stage $(STAGE))

clean:
	rm -rf $(VENV)
