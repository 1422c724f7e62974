# The two commands of the README: `make demo` (main job on the built-in `local` host) and
# `make test` (the test suite). Both set up what they need first (`make demo` only the demo's
# system packages: .ci/system-deps demo; `make test` the test rig's too; `make test-fast` checks
# the demo's and installs nothing).
PY ?= python3
VENV := .venv
# the laptop venv's installer: uv (pip-installed into the venv first; about 3x less CPU than pip
# here, bench/results/first-ten-minutes.md), pip if uv fails; `make setup INSTALLER=pip`: pip only
INSTALLER ?= uv
UV := 0.13.9
# .ci/system-deps installs what is missing; `--check` (make test-fast's) only names it and fails
DEPS_MODE ?=

.PHONY: setup demo test test-fast lint
setup: $(VENV)/.specops-setup

# (the stamp keeps the seconds setup took: `make demo`'s stage table starts with them)
$(VENV)/.specops-setup: pyproject.toml .ci/system-deps
	@echo "start=$$(date +%s)" > .specops-setup.tmp
	bash $(strip .ci/system-deps $(DEPS_MODE) demo)
	$(PY) -m venv $(VENV)
	if [ "$(INSTALLER)" = uv ] && $(VENV)/bin/pip install -q --disable-pip-version-check uv==$(UV) && \
	  $(VENV)/bin/uv pip install -q --python $(VENV)/bin/python -e '.[test,plot,lint]'; then :; \
	else $(VENV)/bin/pip install -q --disable-pip-version-check -e '.[test,plot,lint]'; fi
	@. ./.specops-setup.tmp && echo "seconds=$$(( $$(date +%s) - start ))" > $@ && rm -f .specops-setup.tmp

demo: setup
	$(VENV)/bin/inv demo

# --durations: the 25 slowest tests and setups, printed at the end (CI allows 90 minutes)
# (the test rig's system packages too: sshd, Slurm, munge; `make demo` needs none of them)
# -n 3: three workers, whole files each (tests sharing a costly session fixture live in one file), two heavy lanes and
# a light one (tests/lanes.py: the cpu venv's and Slurm's files longest first, tests/conftest.py HEAVY, LONGEST_FIRST),
# each worker its own rig user; `make test JOBS=0` runs them in this process, one after another
JOBS ?= 3
XDIST = $(if $(filter 0,$(JOBS)),,-n $(JOBS) --dist loadfile --no-loadscope-reorder)
test: setup
	bash .ci/system-deps test
	$(VENV)/bin/python -m pytest -q -ra --durations=25 $(XDIST)

# the fast layer alone (about a minute, no rig; it changes nothing on the machine: setup's system
# packages are checked, not installed, DEPS_MODE reaching setup as a target-specific variable; a fast
# test that starts apt or pip fails, tests/conftest.py): the recording connection (tests/fakes.py)
# and pure logic; tests/conftest.py marks every test by the fixtures it uses (rig, slurm, cpu_box),
# and whatever needs none of them is `fast`
test-fast: DEPS_MODE := --check
test-fast: setup
	$(VENV)/bin/python -m pytest -q -ra -m fast --durations=10 $(XDIST)

# ruff (pycodestyle, pyflakes, bugbear, blind excepts; 120 columns) over the whole tree, and mypy over the laptop
# package and tasks.py (pyproject.toml [tool.ruff], [tool.mypy]); CI runs it before the tests
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
