# The two commands of the README: `make demo` (main job on the built-in `local` host) and
# `make test` (the test suite). Both set up what they need first.
PY ?= python3
VENV := .venv

.PHONY: setup demo test
setup: $(VENV)/.specops-setup

$(VENV)/.specops-setup: pyproject.toml .ci/system-deps
	bash .ci/system-deps
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -e '.[test,plot]'
	touch $@

demo: setup
	$(VENV)/bin/inv demo

test: setup
	$(VENV)/bin/python -m pytest -q -ra
