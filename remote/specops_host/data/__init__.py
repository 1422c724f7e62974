"""Datasets and hidden-state extraction (specops/ops/data.py, inspect_data.py, regenerate.py)."""
