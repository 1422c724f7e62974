"""plan: know the bill before the GPUs run. The real stages, briefly, on the host, on a sample of
the real rows, with the real verifier and draft configuration (the stage ops themselves: the data
job of remote/specops_host/data/datagen.py with prepare + extract, a few training steps offline and online through
remote/specops_host/train/run.py / remote/specops_host/train/online.py), then the whole run extrapolated
(specops/estimate.py) and kept with the dataset as plan.json; `versus` reads it back beside a finished run's job
times."""

from __future__ import annotations

import hashlib
import json
import shlex
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from dataclasses import dataclass

from specops import estimate, metrics
from specops.args import USAGE, Refused, refusing
from specops.config import load_config
from specops.errors import SpecopsError
from specops.host.transport import Transport
from specops.ops import bakeoff, bootstrap, ceiling as ceilings, data, evaluate, jobs, train
from specops.ops.ceiling import PLAN, read_plan
from specops.contract import concurrency_levels

#: evaluate's timing settings the ceiling takes (`inv plan --repeats ...`)
CEILING_TIMING = ("repeats", "speedup_requests", "speedup_tokens")

#: what a plan takes before it has run once on a host, by profile (seconds: a vLLM server start,
#: the sample's data job, two short trainings, one with its own server); later: the last plan's
GUESS_S = {"cpu": 360.0, "cuda": 150.0}


def count_rows(t: Transport, path: str) -> int:
    """Non-empty lines of a .jsonl file on the laptop or the host."""
    p = Path(path).expanduser()
    if p.is_file():
        with open(p, "rb") as f:
            return sum(1 for ln in f if ln.strip())
    remote = data.remote_input(t, path)  # (a missing host file: the one-line refusal)
    out = t.fact(f"grep -c . {shlex.quote(remote)}")
    return int((out.stdout or "0").strip() or 0)


def sample_file(t: Transport, path: str, rows: int, tmp: Path) -> str:
    """The first `rows` rows of the data file, as a file on the host (a laptop file's sample is
    uploaded; a host file's is cut there)."""
    p = Path(path).expanduser()
    if p.is_file():
        out = tmp / f"sample-{rows}-{p.name}"
        with open(p, "rb") as fin, open(out, "wb") as dst:
            n = 0
            for ln in fin:
                if ln.strip() and n < rows:
                    dst.write(ln if ln.endswith(b"\n") else ln + b"\n")
                    n += 1
        return data.remote_input(t, str(out))
    src = data.remote_input(t, path)  # (a missing host file: the one-line refusal)
    key = hashlib.sha256(f"{src}\n{rows}".encode()).hexdigest()[:12]
    dest = f"{t.workdir}/uploads/plan-{key}-{Path(src).name}"
    t.check(f"mkdir -p {shlex.quote(t.workdir + '/uploads')} && grep . {shlex.quote(src)} | head -n {int(rows)} "
            f"> {shlex.quote(dest + '.part')} && mv -f {shlex.quote(dest + '.part')} {shlex.quote(dest)}",
            "cutting the sample")
    t.wrote(dest)  # (under --dry-run: the data job's plan knows it comes)
    return dest


def expected_seconds(t: Transport, data_dir: str) -> tuple[float, str]:
    """How long this plan will take, said first: the last plan's own wall on this dataset, else a
    guess by profile."""
    last = read_plan(t, data_dir)
    if last and last.get("plan_seconds") and last.get("host") == t.host.name:
        return float(last["plan_seconds"]), "the last plan of this dataset here"
    return GUESS_S.get(t.host.profile, 300.0), f"a first plan on a {t.host.profile} host"


def train_records(t: Transport, run_id: str, tmp: Path) -> list[dict]:
    """The run's metric records, read from its TensorBoard event files on the host (small: no
    checkpoint travels)."""
    logs = jobs.run_path(t, run_id, "logs")
    found = t.fact(f"find {shlex.quote(logs)} -name 'events.out.tfevents.*' -type f").stdout
    files = []
    for i, remote in enumerate(x for x in (found or "").splitlines() if x.strip()):
        raw = t.read_bytes(remote, limit=64 << 20) or b""
        local = tmp / f"{i}-{Path(remote).name}"
        local.write_bytes(raw)
        files.append(local)
    return metrics.from_events(files)


def measure_train(t: Transport, mode: str, *, dataset: str, verifier: str, config: Optional[str], steps: int,
                  layers: Optional[str], vllm_arg: list, tokens: int, train_ratio: float, tmp: Path,
                  draft_vocab_size: Optional[str] = None, draft: Optional[str] = None) -> dict:
    """A few real training steps (speculators train, one epoch capped at `steps`, its checkpoint
    and validation included) on the sample: train.train itself (draft: `inv train --draft`'s), then its step times."""
    rid = jobs.new_run_id(f"plan-{draft}-{mode}" if draft else f"plan-{mode}")
    res = train.train(t, config=config, draft=draft, run_id=rid, dataset=dataset, verifier=verifier, follow=True,
                      overrides={"max-steps": steps, "epochs": 1, "draft-vocab-size": draft_vocab_size},
                      hidden_states=mode, layers=layers,
                      vllm_arg=vllm_arg, serve_check=False, own=True)  # (the plan's: Ctrl-C stops it)
    job = jobs.status(t, res["run_id"])[0]
    recs = train_records(t, rid, tmp)
    try:
        m = estimate.train_measurement(recs, started=float(job.started or 0), ended=float(job.ended_at or time.time()),
                                       tokens=tokens, train_ratio=train_ratio)
    except ValueError as e:
        raise SpecopsError(f"plan: the {mode} training {rid} on {t.host.name}: {e} (see "
                           f"`{t.hint(f'logs --run-id {rid}')}`)") from None
    return {**m, "run_id": rid, "ended": job.ended_at}


def measure_ceiling(t: Transport, run_id: str, rates: list, *, kind: str, verifier: str, tmp: Path,
                    num_spec_tokens: int = 3, speedup: str = "1", vllm_arg: Optional[list] = None,
                    **timing) -> dict:
    """The ceiling (ops/ceiling.py): the plan's own draft (run_id, a few steps trained) served with vLLM's
    synthetic acceptance at each rate, timed against the verifier alone by evaluate() (timing: its
    repeats, speedup_requests, speedup_tokens); a failure is kept as {"error"} (the plan's prices stand)."""
    what = ", ".join(f"{r:g}" for r in rates)
    try:
        with t.step(f"plan: the ceiling: the verifier with the draft's proposals accepted at {what} per position "
                    f"(vLLM's synthetic acceptance, k={num_spec_tokens}) against the verifier alone"):
            ev = evaluate.evaluate(t, run_id, num_spec_tokens=num_spec_tokens, speedup=speedup, dest=str(tmp),
                                   vllm_arg=vllm_arg, result_name="evaluation/ceiling.json", write=False,
                                   ceiling=",".join(map(str, rates)), baselines="none", **timing)
    except SpecopsError as e:  # (said by the plan's view: `ceiling: not measured: ...`)
        return {"error": str(e)}
    return ceilings.table(ev, host=t.host.name, verifier=verifier, kind=kind, run_id=run_id)


def measure(t: Transport, *, data_file: str, dataset: Optional[str] = None, verifier: Optional[str] = None,
            config: Optional[str] = None, layers: Optional[str] = None, seq_length: int = 2048, sample: int = 32,
            steps: int = 10, epochs: Optional[int] = None, hidden_states: str = "auto", backend: str = "vllm",
            vllm_arg: Optional[list] = None, disk_budget_gb: Optional[float] = None,
            draft_vocab_size: Optional[str] = None, ceiling: Optional[str] = None, drafts: Optional[str] = None,
            configs: Optional[str] = None, **timing) -> dict:
    """The plan of a run on the host: measured on `sample` rows, extrapolated to the file's rows.
    hidden_states: offline or online measures that mode only; auto both (and says which auto would
    take). ceiling: acceptance rates (ops/ceiling.py) the first mode's draft is timed at
    (measure_ceiling(); timing: its settings); none: the last plan's ceiling of this verifier and host is
    kept. drafts (a bake-off's kinds, `inv bakeoff --drafts`; configs: its --configs FOLDER): the first kind's plan
    as above (its config, configs/KIND.yaml or FOLDER/KIND.yaml), then `steps` training steps of each other kind on the
    same sample in the mode the plan takes (hidden_states, or auto's pick), and the whole bake-off priced (the data
    stage once, each kind's training: plan["bakeoff"]). Returns the plan (also written to the dataset's plan.json on
    the host); a dry run says what measuring would run, then stops at the sample's data job (what follows reads it)."""
    if hidden_states not in train.HIDDEN_STATES:
        raise SpecopsError(f"--hidden-states {hidden_states!r}: choose offline, online or auto")
    rates = ceilings.rates(ceiling)
    h = t.host
    kinds = bakeoff.parse_drafts(drafts) if drafts else []
    over = {"epochs": epochs, "draft-vocab-size": draft_vocab_size}
    cfgs = bakeoff.configs_of(kinds, configs, h.profile, over)  # (each kind's, matched to it, before anything runs)
    draft = kinds[0] if kinds else None
    config = bakeoff.config_of(draft, configs) if draft else config
    cfg = cfgs[draft] if draft else load_config(config, h.profile, over)  # (keys, numbers)
    n_epochs = int(cfg["flags"].get("epochs") or 1)
    ratio = _ratio(cfg)
    ddir = data.data_dir(t, dataset)
    ver = data.verifier_path(t, verifier)
    modes = ("offline", "online") if hidden_states == "auto" else (hidden_states,)
    secs, why = expected_seconds(t, ddir)
    t.note(f"plan: measuring {sample} row(s) on {h.name}, {steps} training step(s) per mode ({', '.join(modes)}): "
           f"about {secs / 60:.0f} min ({why})" + (f"; then {steps} step(s) of each of {', '.join(kinds[1:])} in "
                                                    f"the mode it takes" if kinds else ""))
    t0 = time.time()
    total = count_rows(t, data_file)  # (a missing or empty file: refused before anything runs)
    if total < 1:
        raise SpecopsError(f"data file {data_file!r} holds no rows: nothing to plan")
    bootstrap.bootstrap(t)
    n = min(int(sample), total)
    key = hashlib.sha256(f"{ddir}\n{ver}".encode()).hexdigest()[:10]
    base = f"{t.workdir}/plans/{key}"
    sdir, odir = f"{base}/sample", f"{base}/sample-online"
    with tempfile.TemporaryDirectory() as tmpd:
        tmp = Path(tmpd)
        src = sample_file(t, data_file, n, tmp)
        args = data.Datagen.of(t, data=sdir, verifier=ver, prepare=src, seq_length=seq_length,
                               extract="offline" in modes, backend=backend, layers=layers, vllm_arg=vllm_arg,
                               overwrite=True)
        w0 = time.time()
        with t.step(f"plan: the data job on {n} row(s) (prepare" + (" + extract)" if "offline" in modes else ")")):
            also = (f" ({draft}), then {steps} of each of {', '.join(kinds[1:])} in the mode "
                    + ("auto picks" if hidden_states == "auto" else hidden_states)) if kinds else ""
            t.would(f"then: {steps} training step(s) " + " and ".join(modes) + " on the sample" + also + ", "
                    + (f"the ceiling (the draft at acceptance {ceiling}), " if rates else "") + "the plan "
                    f"extrapolated to the file's rows and written to {ddir}/{PLAN} (not shown: they depend on it)")
            dg = data.run_datagen(t, args, kind="plan-data")
        assert dg is not None  # (not detached: its result)
        wall = time.time() - w0
        ex = dg.get("extract") or {}
        shape = run_shape(t, sdir, ver, layers, vllm_arg)
        tokens = int(ex.get("tokens") or shape["tokens"])
        if "offline" in modes:
            du = t.fact(f"du -sb {shlex.quote(sdir + '/hidden_states')} | cut -f1").stdout
            hs_bytes, bpt_basis = int((du or "0").strip() or 0), "measured: the sample's hidden-state files"
        else:
            hs_bytes, bpt_basis = shape["estimate_bytes"], "the layout's size (layers x hidden x 2 B), not measured"
        t.check(f"rm -rf {shlex.quote(odir)} && mkdir -p {shlex.quote(odir)} && cp -a {shlex.quote(sdir)}/. "
                f"{shlex.quote(odir)}/ && rm -rf {shlex.quote(odir)}/hidden_states {shlex.quote(odir)}/.hs_stage",
                "the sample's prepared rows for the online training")
        kw: dict[str, Any] = dict(verifier=ver, steps=steps, layers=layers, vllm_arg=list(vllm_arg or []),
                                  tokens=tokens, tmp=tmp, draft_vocab_size=draft_vocab_size)
        trained, others = {}, {}
        for mode in modes:
            with t.step(f"plan: {steps} training step(s) {mode} on the sample" + (f" ({draft})" if draft else "")):
                trained[mode] = measure_train(t, mode, dataset=sdir if mode == "offline" else odir, config=config,
                                              draft=draft, train_ratio=ratio, **kw)
        budget = None if disk_budget_gb is None else disk_budget_gb * 2**30
        pick = hidden_states if hidden_states != "auto" else estimate.auto_choice(
            hs_bytes / max(tokens, 1) * tokens * total / n, free_bytes=shape.get("free_bytes"), disk_budget=budget,
            hours={})["mode"]  # (rows()' own choice, said below: the mode the other kinds are measured in)
        for k in kinds[1:]:
            with t.step(f"plan: {steps} training step(s) {pick} on the sample ({k})"):
                others[k] = measure_train(t, pick, dataset=sdir if pick == "offline" else odir, draft=k,
                                          config=bakeoff.config_of(k, configs), train_ratio=_ratio(cfgs[k]), **kw)
        kind = str(cfg["flags"].get("speculator-type") or "eagle3")
        ceil = (measure_ceiling(t, trained[modes[0]]["run_id"], rates, kind=kind, verifier=ver, tmp=tmp,
                                vllm_arg=vllm_arg, **timing) if rates else
                ceilings.kept(read_plan(t, ddir), host=h.name, verifier=ver))
    log = (t.read_bytes(jobs.run_path(t, dg["run_id"], "output.log"), limit=16 << 20) or b"").decode("utf-8", "replace")
    measured = {"rows_total": total, "rows_sample": n, "tokens_sample": tokens,
                "data": {"wall_s": wall, "prepare_s": float(dg.get("prepare_seconds") or 0.0),
                         "extract_s": float(ex.get("seconds") or 0.0), "tokens": tokens, "run_id": dg["run_id"],
                         **estimate.datagen_work(log)},
                "bytes_per_token": hs_bytes / max(tokens, 1), "bytes_per_token_basis": bpt_basis,
                "hidden_state_bytes": hs_bytes, "train": trained, "free_bytes": shape.get("free_bytes")}
    gpus = h.gpus if h.gpus is not None else (0 if h.profile == "cpu" else 1)
    out = estimate.rows(measured, epochs=n_epochs, gpus=gpus, price_per_hour=h.price_per_hour, per=h.price_per,
                        disk_budget=budget, train_ratio=ratio)
    # (the host's clock when the plan's last job ended: `versus` counts the data jobs started after it)
    host_end = max((float(x.get("ended") or 0) for x in [*trained.values(), *others.values()]), default=0.0) or None
    chosen = out["modes"].get(out["auto"]["mode"]) or next(iter(out["modes"].values()))
    tr = chosen["stages"][-1]["parts"]
    long = estimate.too_long(tr["seconds"], tr["tokens_per_s"], epochs=n_epochs,
                             draft_vocab=cfg["flags"].get("draft-vocab-size"), basis=f"measured on {n} row(s)")
    plan = {"host": h.name, "created": time.time(), "long": long,
            "host_clock_end": host_end, "data_file": str(data_file), "data_dir": ddir, "verifier": ver,
            "config": cfg["path"], "config_flags": cfg["flags"], "hidden_states": hidden_states, "layers": layers,
            "seq_length": seq_length, "sample_rows": n, "steps": steps, "gpus": gpus,
            "price_per_hour": h.price_per_hour, "price_per": h.price_per, "measured": measured, **out,
            "ceiling": ceil, "plan_seconds": time.time() - t0}
    if kinds:
        per = {k: {"train": trained[pick] if k == draft else others[k], "epochs": int(c["flags"].get("epochs") or 1),
                   "train_ratio": _ratio(c), "config": c["path"]} for k, c in cfgs.items()}
        plan["bakeoff"] = estimate.bakeoff(out, per, mode=pick, gpus=gpus, price_per_hour=h.price_per_hour,
                                           per=h.price_per)
    t.check(f"mkdir -p {shlex.quote(ddir)}", "the dataset dir (the plan is kept there)")
    t.put_text(json.dumps(plan, indent=1, default=str), f"{ddir}/{PLAN}", label="(plan.json)", whole=True)
    plan["path"] = f"{ddir}/{PLAN}"
    return plan


def _ratio(cfg: dict) -> float:
    """A config's train_data_ratio (speculators' default where unset)."""
    return float(cfg["flags"].get("train-data-ratio") or estimate.TRAIN_RATIO)


def run_shape(t: Transport, sdir: str, ver: str, layers: Optional[str], vllm_arg: Optional[list]) -> dict:
    """The prepared sample's tokens, free bytes and the hidden states' size by the layout (datagen's
    own plan: read-only)."""
    from specops.host.remote_exec import run_script

    args = data.Datagen.of(t, data=sdir, verifier=ver, extract=True, layers=layers, vllm_arg=vllm_arg)
    from specops.payloads import DatagenPlan

    res = run_script(t, "data.datagen", args.argv("--plan"), changes=False, model=DatagenPlan)
    if not res.ok:
        raise SpecopsError(f"plan on {t.host.name}: {res.error}")
    return {"tokens": res.tokens or 0, "estimate_bytes": res.estimate_bytes or 0, "free_bytes": res.free_bytes}


def job_wall(j) -> Optional[float]:
    return (j.ended_at - j.started) if j.ended_at and j.started else None


def versus(t: Transport, run_id: str) -> Optional[dict]:
    """A finished training run beside its dataset's plan: {plan, mode, rows: [{stage, planned_s,
    actual_s, error}]}: the data jobs of that dataset started after the plan (prepare/extract),
    and the run itself. None when the run's dataset has no plan."""
    raw = t.read_bytes(jobs.run_path(t, run_id, "train-spec.json"))
    try:
        spec = json.loads(raw) if raw else {}
    except ValueError:
        spec = {}
    ddir = spec.get("data")
    plan = read_plan(t, ddir) if ddir else None
    if not plan:
        return None
    mode = spec.get("hidden_states", "offline")
    planned = {s["stage"]: s["seconds"] for s in (plan.get("modes", {}).get(mode) or {}).get("stages", [])}
    if not planned:
        return None
    lock = "data-" + hashlib.sha1(str(ddir).encode()).hexdigest()[:12]
    all_jobs = jobs.status(t)
    since = plan.get("host_clock_end") or plan["created"]
    mine = [j for j in all_jobs if getattr(j, "lock", None) == lock and (j.started or 0) >= since
            and j.state.value == "succeeded"]
    walls = [job_wall(j) for j in mine]
    data_actual = sum(w for w in walls if w) if mine else None
    run = next((j for j in all_jobs if j.run_id == run_id), None)
    rows = []
    for stage, p in planned.items():
        a = job_wall(run) if stage == "train" and run else (data_actual if stage != "train" else None)
        rows.append({"stage": stage, "planned_s": p, "actual_s": a,
                     "error": estimate.error(p, a) if a else None,
                     "runs": [run_id] if stage == "train" else [j.run_id for j in mine]})
    tot_a = sum(r["actual_s"] for r in rows if r["actual_s"]) if all(r["actual_s"] for r in rows) else None
    tot_p = sum(r["planned_s"] for r in rows)
    rows.append({"stage": "total", "planned_s": tot_p, "actual_s": tot_a,
                 "error": estimate.error(tot_p, tot_a) if tot_a else None, "runs": []})
    return {"plan": plan.get("path") or f"{ddir}/{PLAN}", "mode": mode, "rows": rows, "created": plan["created"]}


@dataclass
class Priced:
    """price(): the plan measure() made, and the command to run next (with why)."""
    plan: dict
    next: str
    why: str


def _plan_flags(data: Optional[str] = None, ceiling: Optional[str] = None, speedup: str = "1",
                num_spec_tokens: int = 3, drafts: Optional[str] = None, configs: Optional[str] = None,
                config: Optional[str] = None, **kw) -> None:
    if drafts is not None:
        bakeoff.check_kinds(drafts, configs)
        if config is not None:
            raise Refused(f"--config {config} with --drafts: a bake-off trains each kind from its own config, "
                          f"--configs FOLDER's KIND.yaml (default configs/): drop --config", code=USAGE)
    elif configs is not None:
        raise Refused(f"--configs {configs} is a bake-off's (with --drafts such as {bakeoff.DEFAULT}); one kind's "
                      f"config: --config FILE", code=USAGE)
    if not data:
        raise Refused("plan needs --data FILE (.jsonl: the rows the run will train on)", code=USAGE)
    try:
        levels = concurrency_levels(speedup)
        if ceilings.rates(ceiling) and not levels:
            raise SpecopsError(f"--ceiling {ceiling} is timed: give --speedup levels (not none), or --ceiling none")
        evaluate.timing_args(levels, **{k: kw[k] for k in CEILING_TIMING if kw.get(k) is not None})
    except SpecopsError as e:
        raise Refused(str(e)) from None
    if int(num_spec_tokens) < 1:
        raise Refused(f"--num-spec-tokens {num_spec_tokens}: give 1 or more (the draft tokens the ceiling is timed at)")


@refusing(_plan_flags)
def price(t: Transport, data: str, *, dataset: Optional[str] = None, disk_budget: Optional[float] = None,
          **kw) -> Priced:
    """`inv plan`: measure() on the host (kw: its settings; --disk-budget in GiB), with the pipeline it priced next
    (a bake-off's, --drafts: `inv bakeoff` with the same kinds and configs)."""
    p = measure(t, data_file=data, dataset=dataset, disk_budget_gb=disk_budget, **kw)
    if p.get("bakeoff"):
        b, folder, ds = p["bakeoff"], kw.get("configs"), f" --dataset {dataset}" if dataset else ""
        ver = f" --verifier {kw['verifier']}" if kw.get("verifier") else ""
        return Priced(p, t.hint(f"bakeoff --drafts {','.join(b['kinds'])} --hidden-states {b['mode']}{ds}{ver}"
                                + (f" --configs {folder}" if folder else "")),
                      f"the bake-off this plan priced, once `{t.hint(f'prepare-data --data {data}{ds}')}`"
                      + (f" and `{t.hint('extract' + ds)}`" if b["mode"] == "offline" else "") + " prepared its data")
    return Priced(p, t.hint(f"pipeline --data {data} --hidden-states {p['auto']['mode']}"
                            + (f" --dataset {dataset}" if dataset else "")), "the run this plan priced")


def _one_host(**kw) -> None:
    _plan_flags(**kw)
    raise Refused("plan measures one host: give --host NAME (the host the run will use)", code=USAGE)


@refusing(_one_host)
def one_host(hosts, **_) -> None:
    """A group given to `inv plan`: refused before anything connects (it measures the one host the run will use)."""
    _one_host(**_)
