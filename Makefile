# The two commands of the README: `make demo` (main job on the built-in `local` host) and
# `make test` (the test suite). Both set up what they need first.
PY ?= python3
VENV := .venv

.PHONY: setup demo test
setup: $(VENV)/.specops-setup

# (the stamp keeps the seconds setup took: `make demo`'s stage table starts with them)
$(VENV)/.specops-setup: pyproject.toml .ci/system-deps
	@echo "start=$$(date +%s)" > .specops-setup.tmp
	bash .ci/system-deps
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -e '.[test,plot]'
	@. ./.specops-setup.tmp && echo "seconds=$$(( $$(date +%s) - start ))" > $@ && rm -f .specops-setup.tmp

demo: setup
	$(VENV)/bin/inv demo

# --durations: the 25 slowest tests and setups, printed at the end (CI allows 90 minutes)
test: setup
	$(VENV)/bin/python -m pytest -q -ra --durations=25
