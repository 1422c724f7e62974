"""Deep preflight: real `speculators train` steps on a tiny synthetic fixture, with the host's
training settings first, then fallbacks; says which settings work and records the verdict.

Launch (what `inv check --deep` sends, from the host workdir):
    <venv>/bin/python3 -m specops_host.check.deep --kind cuda \
        --settings '[{"draft-attn-impl": "simple_flex_attention", "loss-implementation": "fused",
                      "compile": true}, {...fallback...}]' [--all] [--steps 2] [--timeout 300]

The fixture (built once per torch/transformers/speculators versions, under
.specops/deep-check/): a tiny random Llama verifier with a local tokenizer
(remote/specops_host/fixtures/tiny_verifier.py), 24 pre-tokenised rows through `speculators prepare-data`, hidden
states from a transformers forward (remote/specops_host/data/datagen.py's hf backend). Each attempt is launched
exactly as `inv train` launches (remote/specops_host/train/run.py's command: torchrun on cuda hosts,
remote/specops_host/train/cpu.py on cpu hosts), for --steps steps; `compile: false` sets TORCHDYNAMO_DISABLE=1
(speculators compiles its draft forward whenever CUDA is available). Attempts stop at the first
that works unless --all. The verdict goes to .specops/deep-check.json (read by `inv train`'s
gate) and is the payload.
"""

import argparse
import hashlib
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from specops_host import hostenv
from specops_host.install import pins
from specops_host.contract import emit
from specops_host.jobs.errlines import RANK, first_error

ROOT = Path(".specops") / "deep-check"
VERDICT = Path(".specops") / "deep-check.json"
FIXTURE_VERSION = 1
LAYERS, HIDDEN = 8, 256
LAYER_IDS = [2, 4, 5, 8]
PACKAGES = ("torch", "speculators", "transformers", "triton", "hs-connectors")


def versions():
    return pins.versions(PACKAGES)


def run(argv, log, env=None, timeout=None):
    """Run argv in its own process group, output to log; kill the group on timeout."""
    with open(log, "ab") as f:
        f.write(f"$ {' '.join(map(str, argv))}\n".encode())
        f.flush()
        p = subprocess.Popen([str(a) for a in argv], stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=env, start_new_session=True)
        try:
            return p.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            return None, True
        except BaseException:
            os.killpg(p.pid, signal.SIGKILL)
            raise


def tail(log, n=15, upto=None):
    """The last lines of a log (up to the line holding `upto`, if given), without the code boxes
    of rich tracebacks."""
    try:
        lines = Path(log).read_text(errors="replace").splitlines()
    except OSError:
        return []
    lines = [RANK.sub("", l).rstrip() for l in lines]
    lines = [l[:400].rstrip() for l in lines if l.strip() and l.strip()[0] not in "│┃╭╰❱"]
    if upto:
        hit = [i for i, l in enumerate(lines) if upto[:60] in l]
        if hit:
            lines = lines[:hit[-1] + 1]
    return lines[-n:]


def fixture(kind, log):
    """Build (or reuse) the tiny verifier + prepared data + hidden states. -> (verifier, data, seconds)"""
    key = hashlib.sha1(json.dumps([FIXTURE_VERSION, kind, versions()], sort_keys=True).encode()).hexdigest()[:12]
    base = ROOT / f"fixture-{key}"
    ver, data = base / "verifier", base / "data"
    done = base / "ready"
    if done.is_file():
        return ver.resolve(), data.resolve(), 0.0
    t0 = time.time()
    base.mkdir(parents=True, exist_ok=True)
    rc, _ = run([sys.executable, "-m", "specops_host.fixtures.tiny_verifier", ver, "--layers", LAYERS,
                 "--hidden", HIDDEN], log)
    if rc != 0:
        raise RuntimeError(f"building the tiny verifier failed (exit {rc}); see {log}")
    vocab = json.loads((ver / "config.json").read_text())["vocab_size"]
    rng = random.Random(0)
    rows = base / "rows.jsonl"
    with open(rows, "w") as f:
        for _ in range(24):
            n = rng.randint(160, 400)
            f.write(json.dumps({"input_ids": [rng.randrange(7, vocab) for _ in range(n)],
                                "loss_mask": [0] * (n // 3) + [1] * (n - n // 3)}) + "\n")
    rc, _ = run([sys.executable, "-m", "speculators", "prepare-data", "--model", ver, "--data", rows,
                 "--output", data, "--seq-length", "512", "--no-skip-token-freq"], log)
    if rc != 0:
        raise RuntimeError(f"speculators prepare-data on the fixture failed (exit {rc}); see {log}")
    from specops_host.data.hf_backend import hf_extract

    hf_extract(str(data), str(ver), LAYER_IDS, 0, 24, kind)
    done.write_text(json.dumps({"versions": versions(), "built": time.time()}))
    return ver.resolve(), data.resolve(), round(time.time() - t0, 1)


def attempt(i, settings, kind, ver, data, steps, timeout):
    # remote/specops_host/train/run.py: the same command `inv train` runs
    from specops_host.train import run as launcher

    d = (ROOT / f"attempt-{i}").resolve()
    subprocess.run(["rm", "-rf", str(d)])
    d.mkdir(parents=True)
    flags = {"speculator-type": "eagle3", "draft-vocab-size": 256, "epochs": 1, "max-steps": steps,
             "total-seq-len": 1024, "lr": 1e-3, "num-workers": 0, "on-missing": "raise", "log-freq": 1,
             "draft-attn-impl": settings["draft-attn-impl"], "loss-implementation": settings["loss-implementation"]}
    argv = launcher.command({"run_dir": str(d), "kind": kind, "nproc": 1, "verifier": str(ver), "data": str(data),
                             "target_layer_ids": LAYER_IDS[:-1], "flags": flags})
    env = {**os.environ, "COLUMNS": "1000", "PYTHONUNBUFFERED": "1"}
    if not settings.get("compile", True):
        env["TORCHDYNAMO_DISABLE"] = "1"
    log = d / "output.log"
    t0 = time.time()
    rc, timed_out = run(argv, log, env=env, timeout=timeout)
    secs = round(time.time() - t0, 1)
    text = log.read_text(errors="replace")
    losses = []
    for line in text.splitlines():
        m = re.search(r"train/loss=(-?[\d.e+-]+|nan|inf)", line)
        if m:
            try:
                losses.append(float(m.group(1)))
            except ValueError:
                losses.append(float("nan"))
    finite = bool(losses) and all(math.isfinite(x) for x in losses)
    ok = rc == 0 and not timed_out and len(losses) >= steps and finite
    err = None
    if not ok:
        err = (f"timed out after {timeout:.0f}s ({len(losses)} step(s) done)" if timed_out
               else first_error(text) or (f"non-finite loss {losses}" if losses and not finite else None)
               or f"exit {rc} after {len(losses)} step(s)")
    return {"settings": settings, "ok": ok, "seconds": secs, "steps": len(losses),
            "loss": losses[-1] if losses else None, "error": err, "exit": rc, "log": str(log),
            "tail": [] if ok else tail(log, upto=err)}


def gpu_name(kind):
    if kind != "cuda":
        return None
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=["cpu", "cuda"], required=True)
    ap.add_argument("--settings", required=True, help="JSON list of settings to try, the configured ones first")
    ap.add_argument("--all", action="store_true", help="try every settings entry, not just until one works")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per attempt")
    a = ap.parse_args()
    try:
        cands = json.loads(a.settings)
        assert isinstance(cands, list) and cands and all(
            isinstance(c, dict) and {"draft-attn-impl", "loss-implementation"} <= set(c) for c in cands)
    except (ValueError, AssertionError):
        emit({"ok": False,
              "error": "--settings must be a JSON list of {draft-attn-impl, loss-implementation, compile}"})
        return 2
    hostenv.apply(os.getcwd(), a.kind)
    if len(os.environ.get("TMPDIR", "")) > 60:  # multiprocess' AF_UNIX sockets live there (<108 bytes)
        short = Path(f"/tmp/specops-tmp-{os.getuid()}")
        short.mkdir(mode=0o700, exist_ok=True)
        os.environ["TMPDIR"] = str(short)
    ROOT.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    try:
        ver, data, fx_secs = fixture(a.kind, ROOT / "fixture.log")
    except Exception as e:  # noqa: BLE001
        emit({"ok": False, "error": f"deep-check fixture: {type(e).__name__}: {e}", "tail": tail(ROOT / "fixture.log")})
        return 1
    results = []
    for i, s in enumerate(cands):
        r = attempt(i, s, a.kind, ver, data, a.steps, a.timeout)
        results.append(r)
        print(f"[specops] deep-check {json.dumps(s)}: {'ok' if r['ok'] else 'FAILED: ' + str(r['error'])} "
              f"({r['seconds']}s)", flush=True)
        if r["ok"] and not a.all:
            break
    works = next((r["settings"] for r in results if r["ok"]), None)
    verdict = {"ok": works is not None, "configured_ok": results[0]["ok"], "configured": cands[0], "works": works,
               "results": results, "kind": a.kind, "gpu": gpu_name(a.kind), "versions": versions(),
               "python": sys.executable, "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "steps": a.steps,
               "fixture_seconds": fx_secs, "seconds": round(time.time() - t0, 1)}
    VERDICT.write_text(json.dumps(verdict, indent=1))
    emit(verdict)
    return 0 if verdict["configured_ok"] else 1


if __name__ == "__main__":
    from specops_host import contract

    contract.main(main)
