# Two commands on a fresh clone:  make test   and   make grade
# Both create .venv on first use and install nothing on later runs.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
IMPL   ?= assignments
STAGE  ?=
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
# CPU-only machines get torch 2.13.0 and the Triton the GPU runs were made with (3.6, for
# its interpreter); GPU machines get the newest torch, which brings its own Triton. Both
# come from pip's default index: on Linux x86_64 that is PyPI's CUDA build (nvidia-*
# wheels, GBs) even without a GPU; README.md's quick start shows the TORCH= for the CPU build.
TORCH  ?= $(if $(shell command -v nvidia-smi 2>/dev/null),torch,torch==2.13.0 triton==3.6.0)

.PHONY: test grade notebooks bench-linear clean help
help:
	@echo "make test      - install (first time) and run the autograder on solutions/ + the stub and mutation checks"
	@echo "make grade     - grade IMPL=assignments (default) | solutions | path/to/submission; STAGE=a03 (or a03,a08) for some stages"
	@echo "make notebooks - execute every lecture notebook"

$(STAMP):
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is required, found " + sys.version.split()[0]'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check $(TORCH)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev]'
	@rm -f $(VENV)/.installed-*; touch $@

# --mutants: also the slow course self-checks (the mutation checks, the stub check); CI runs this.
test: $(STAMP)
	$(BIN)/python -m pytest --impl solutions --mutants

grade: $(STAMP)
	$(BIN)/python -m common.grade --impl $(IMPL) $(if $(STAGE),--stages $(STAGE))

notebooks: $(STAMP)
	$(BIN)/python -m pytest tests/test_notebooks.py -v

clean:
	rm -rf $(VENV)
