"""The vLLM server's life (start, wait, stop), its model-info warm-up, and evaluation (specops/ops/evaluate.py)."""
