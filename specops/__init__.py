"""specops: train speculative-decoding drafts on a remote GPU host over SSH."""

__version__ = "0.1.0"
