# The course's two commands: `make lab` and `make test`. Everything else is for maintainers.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LAB_PORT ?= 8888
LAB_FLAGS ?=
# JupyterLab refuses to run as root (containers, CI) unless told it may.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)
PIP := $(PY) -m pip --disable-pip-version-check --quiet
# The lessons and tests start many Pythons (kernels, grading workers, commands, ranks): they
# keep their compiled bytecode (__pycache__/, which git ignores) even where the environment
# says not to: each start then skips compiling course_utils and the tests (about 3.5 s of
# each pytest worker's start here).
unexport PYTHONDONTWRITEBYTECODE

# Linux without a GPU: `make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu` installs
# PyTorch's CPU build (a few hundred MB) instead of PyPI's CUDA build (several GB).
TORCH_INDEX ?=
# `make test-compat`: the oldest PyTorch the course supports (docs/environment.md), in a venv
# kept outside the checkout so that its download (about 3 GB from PyPI) is made once.
COMPAT_TORCH ?= 2.10.0
COMPAT_VENV ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/course-compat/torch-$(COMPAT_TORCH)
COMPAT_PY := $(COMPAT_VENV)/bin/python

.PHONY: setup lab test test-fast lint format unit notebooks test-nbval exercises bench test-browser \
	test-constrained compat-env test-compat test-limits record-reference book clean

# Set-up: a venv with the pinned dependencies, the test tools, course_utils (editable) and the
# instructors' pytest plugin (`pytest --course-grade`, see INSTRUCTORS.md; Binder leaves it
# out). Re-runs only when the requirements or a pyproject.toml change, so a second `make`
# takes seconds. A venv left half-built (an interrupted first run) is made again from scratch.
$(STAMP): requirements.txt requirements-dev.txt pyproject.toml instructor_tools/pyproject.toml
	@$(PY) -m pip --version >/dev/null 2>&1 || { rm -rf $(VENV) && $(PYTHON) -m venv $(VENV); }
	$(if $(TORCH_INDEX),$(PIP) install --index-url $(TORCH_INDEX) "$$(grep '^torch==' requirements.txt)")
	$(PIP) install -r requirements.txt -r requirements-dev.txt
	$(PIP) install --no-deps --no-build-isolation -e . -e instructor_tools
	@# No "get notified about Jupyter news?" pop-up over the lessons (it is a network feature).
	$(VENV)/bin/jupyter labextension disable --level=sys_prefix \
		"@jupyterlab/apputils-extension:announcements" >/dev/null 2>&1
	@touch $(STAMP)

# Two system packages are optional: the course, `make lab` and `make test` need neither
# (`make test` skips the tests that do: tests/conftest.py). Said in one line, once per `make`
# (the line `make test` prints, not its inner make's), never a failure; not for `make lab`,
# since a learner needs neither.
setup: $(STAMP)
ifeq ($(filter lab,$(MAKECMDGOALS))$(OPTIONAL_SAID),)
	@missing=""; packages=""; \
	command -v bwrap >/dev/null 2>&1 || { packages="bubblewrap"; \
		missing="bubblewrap (sandboxed grading: instructors, and the sandbox's tests)"; }; \
	command -v chromium >/dev/null 2>&1 || { packages="$${packages:+$$packages }chromium"; \
		missing="$${missing:+$$missing, }chromium (the real-browser test, make test-browser)"; }; \
	[ -z "$$packages" ] || echo "Optional system packages not installed: $$missing; make test \
	skips the tests that need them. To install: sudo apt-get install $$packages"
endif

lab: setup
	@echo "Starting JupyterLab on the course index; open the URL printed below (Ctrl-C stops it)."
	$(VENV)/bin/jupyter lab --ServerApp.ip=127.0.0.1 --ServerApp.port=$(LAB_PORT) \
		--ServerApp.root_dir=$(CURDIR) $(ROOT_FLAG) $(LAB_FLAGS) notebooks/00_welcome.ipynb

# Tests run on two pytest workers (pytest-xdist), one per core of the 2-core machines the
# course is built for; JOBS=1 runs them one at a time. Tests that must not run beside each
# other share an xdist_group (--dist loadgroup sends a group to one worker).
JOBS ?= 2
XDIST := -n $(JOBS) --dist loadgroup

# Every lesson and solution runs once inside `unit` (tests/notebook_runs.py, pinned to one core
# each, two at a time): tests/test_lessons.py and tests/test_exercises.py read those runs.
# Lint runs beside the unit tests (mypy's half minute on a fresh clone is mostly one core);
# make waits for both and fails when either does. (Not --output-sync: it would hold pytest's
# progress until the end.)
test: setup
	@$(MAKE) --no-print-directory -j 2 lint unit OPTIONAL_SAID=1

# Beside the notebook runs, one torch thread per pytest worker (tests/conftest.py says why).
# Without the runs at the documented limits: `make test-limits`, which CI runs.
unit: setup
	COURSE_TEST_TORCH_THREADS=1 $(PY) -m pytest \
		-m "not browser and not constrained and not limits and not book and not nbval_strict" \
		$(XDIST)

# The quick loop while editing: the unit tests without the slow ones (real processes: notebook
# kernels, nbval and grader runs, torch.distributed ranks, make, one CLI smoke test per command),
# without the browser and without the constrained runs (every lesson twice: make test-constrained).
# No groups among them: workers steal work from each other, which balances them best.
test-fast: setup
	$(PY) -m pytest -m "not slow and not browser and not constrained and not book" -n $(JOBS) \
		--dist worksteal

# Every lesson, run top to bottom with nbval (outputs are not compared), as an instructor would
# check a copy of the course. `make test` does not run it: its tests read one run of every
# lesson and solution (tests/notebook_runs.py), which nbval would only repeat.
notebooks: setup
	$(PY) -m pytest --nbval-lax --nbval-current-env -p no:cacheprovider notebooks/

# Strict nbval (outputs compared) on every solution: run once and saved (the runs `make test`
# made, reused; made here if missing), each passes `pytest --nbval` twice in a row, and its
# blank handout fails. `make test` checks one lesson's; CI runs this after it.
test-nbval: setup
	$(PY) -m pytest -m nbval_strict -n $(JOBS) --dist load -p no:cacheprovider \
		tests/test_nbval_strict.py

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# Regenerate exercises/ from solutions/ (solution blocks become stubs).
exercises: setup
	$(PY) -m course_utils.grading.make_exercises

bench: setup
	@for f in benchmarks/bench_*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

# Every lesson pinned to one core beside a CPU hog on that core: each headline within 10%.
test-constrained: setup
	$(PY) -m pytest -m constrained -p no:cacheprovider

# On an idle machine: run every lesson and store its measurements as the reference twins.
record-reference: setup
	$(PY) -m course_utils.measure.record

# Every command at the corner of its documented limits, under the memory budget (5 to 7
# minutes of CPU; peak memory, not time, is measured). CI runs it last, alone.
test-limits: setup
	$(PY) -m pytest -m limits $(XDIST) -p no:cacheprovider

# The course as a static HTML book (artifacts/book/html/index.html): every lesson and blank
# exercise notebook with the outputs of its run by `make test` (run that first: without its
# runs this says so and exits 2; it never runs a notebook), then the book's own tests (no
# solution anywhere in it, every lesson page holds its charts, no broken internal link).
book: setup
	$(PY) -m book.build
	$(PY) -m pytest -m book -p no:cacheprovider -q tests/test_book.py

test-browser: setup
	@command -v chromium >/dev/null 2>&1 || { echo "make test-browser needs Debian's chromium: \
	sudo apt-get install chromium fonts-noto-color-emoji (.ci/run installs them)" >&2; exit 2; }
	$(PY) -m pytest -m browser -p no:cacheprovider

# The oldest supported PyTorch, in one pytest run: the unit tests without the slow ones, the
# slow tests of the version-dependent APIs (marked torch_api: torch.distributed.pipelining,
# FSDP2, DCP under torchrun) and lessons 08, 11 and 13 (with nbval; each notebook stays on one
# worker). The lessons come first, so that the longest ones are not left for the end.
# The learner's pins and the test runners from requirements*.txt, with torch replaced.
COMPAT_LESSONS := notebooks/08_sharded_data_parallelism.ipynb \
	notebooks/11_v_shaped_schedules.ipynb notebooks/13_beyond_one_machine.ipynb
# `make compat-env` only installs (CI starts it first, in the background, so that the download
# overlaps `make test`); a second run finds everything installed and takes seconds.
compat-env:
	@$(COMPAT_PY) -m pip --version >/dev/null 2>&1 || \
		{ rm -rf $(COMPAT_VENV) && $(PYTHON) -m venv $(COMPAT_VENV); }
	$(COMPAT_PY) -m pip --disable-pip-version-check --quiet install "torch==$(COMPAT_TORCH)" \
		$$(grep -v -e '^torch==' -e '^\s*#' requirements.txt) \
		$$(grep -E '^(pytest|pytest-xdist|execnet|nbval|hypothesis|pyyaml)==' requirements-dev.txt)
	$(COMPAT_PY) -m pip --disable-pip-version-check --quiet install --no-deps --force-reinstall -e .
	$(COMPAT_PY) -c "import torch; assert torch.__version__.split('+')[0] == '$(COMPAT_TORCH)', torch.__version__"

test-compat: compat-env
	COURSE_TEST_TORCH_THREADS=1 $(COMPAT_PY) -m pytest -p no:cacheprovider \
		-m "not browser and not constrained and not book and (not slow or torch_api)" $(XDIST) \
		--nbval-lax --nbval-current-env $(COMPAT_LESSONS) tests --ignore=tests/fixtures

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache .hypothesis artifacts screenshots
