"""Preflights (specops/ops/check.py): the venv, the deep check, the draft-serves check, the distributed check."""
