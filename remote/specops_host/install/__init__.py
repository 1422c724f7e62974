"""The profile's install into the host venv (specops/ops/bootstrap.py, specops/ops/wheelhouse.py)."""
