"""Detached jobs on this host (the laptop's specops/ops/jobs.py): start/status/stop, the supervisor, processes."""
