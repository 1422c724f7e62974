"""The sha256 manifest of a run folder, for verified fetches (specops/ops/fetch.py)."""
