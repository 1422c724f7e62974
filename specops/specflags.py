"""The flags of `speculators train` (speculators 0.9.0, the version every profile pins:
bootstrap/profiles/), read from its argparse parser (speculators.train.config.resolution.build_parser).
A training config's key that is none of them is refused when the config is loaded (the plan, a
dry run), not when the trainer starts on the host. Update with the pin."""

SPECULATORS = "0.9.0"

#: every long option of `speculators train`, without the leading dashes
TRAIN_FLAGS = frozenset({
    "base-anchor-full-weight", "base-anchor-weight", "block-size", "ce-from-data", "checkpoint-freq",
    "confidence-head-alpha", "confidence-head-with-markov", "config", "consistency-passes",
    "consistency-weight", "conv-group-size", "conv-kernel-size", "d2t-path", "data-path",
    "deterministic-cuda", "dflash-decay-gamma", "down-sample-ratio", "down-sample-ratio-min", "dpace-alpha",
    "draft-arch", "draft-attn-impl", "draft-config", "draft-hidden-act", "draft-mrope-full-head-hack",
    "draft-vocab-size", "dry-run", "dump-config", "embed-requires-grad", "enable-confidence-head", "epochs",
    "fc-norm", "from-pretrained", "fsdp-shard", "full-attention-indices", "generation-validation-retries",
    "gradient-checkpointing", "hidden-states-backend", "hidden-states-dtype", "hidden-states-path", "log-dir",
    "log-freq", "logger", "loss-fn", "loss-implementation", "lr", "markov-head-type", "markov-rank",
    "mask-token-id", "max-anchors", "max-consecutive-generation-failures", "max-retries", "max-steps",
    "mooncake-device", "mooncake-global-segment-gib", "mooncake-local-buffer-gib", "mooncake-master",
    "mooncake-metadata-server", "mooncake-protocol", "muon-adjust-lr-fn", "muon-lr", "muon-momentum",
    "muon-ns-steps", "muon-weight-decay", "no-confidence-head-with-markov", "no-draft-mrope-full-head-hack",
    "no-embed-requires-grad", "no-enable-confidence-head", "no-norm-before-fc", "no-norm-before-residual",
    "no-norm-output", "no-resume-from-checkpoint", "no-sample-from-anchor", "no-sliding-window-non-causal",
    "norm-before-fc", "norm-before-residual", "norm-output", "num-depths", "num-jacobi-passes", "num-layers",
    "num-speculative-steps", "num-workers", "on-generate", "on-missing", "optimizer",
    "per-position-loss-weight", "prefetch-factor", "request-timeout", "run-name", "sample-from-anchor",
    "save-best", "save-path", "scheduler-num-cosine-cycles", "scheduler-total-steps", "scheduler-type",
    "scheduler-warmup-ratio", "scheduler-warmup-steps", "seed", "selector-loss-alpha", "selector-rank",
    "selector-top-k", "sliding-window", "sliding-window-non-causal", "speculator-type", "step-weight-beta",
    "t2d-path", "target-layer-ids", "token-freq-path", "total-seq-len", "train-data-ratio",
    "trust-remote-code", "ttt-step-loss-decay", "ttt-steps", "verifier-name-or-path", "vllm-endpoint",
    "weight-decay", "xpress-mlp-ratio", "xpress-rank",
})
