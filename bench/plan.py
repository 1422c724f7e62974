"""Benchmark: `inv plan`'s estimate against the real demo pipeline it priced, in the same run (issue 26).

    .venv/bin/python bench/plan.py [--sample 50] [--steps 6] [--rows 200] [--online] [--keep]

Over the loopback sshd of tests/rig.py (as root it logs in $SPECOPS_TEST_USER, default specops-ci;
its ~/ml-env is the cpu profile's venv, bootstrapped if missing; workdir ~/specops-bench-plan, whose
learnable verifier is kept between runs): the demo's verifier (remote/specops_host/fixtures/learnable_verifier.py,
trained once), the demo's rows (--rows conversations of remote/specops_host/fixtures/synthlang.py), configs/demo.yaml,
layers 1,2,3,4, --seq-length 512, vLLM --enforce-eager, as `inv demo` runs them. Then, back to back:
  plan: `inv plan --sample N --steps K --json` (the CLI, as a user runs it);
  real: `inv pipeline` on the same rows and dataset, `--hidden-states offline` (the demo's mode),
        then its planned-vs-actual rows (ops/plan.py `versus`: the host's job times);
  --online: also `inv train --hidden-states online` on the prepared dataset beside the plan's
        online training row.
Per stage: planned s, actual s, error; the whole run's error (goal: within 25%); the plan's own
wall. Removes the data, runs and plans it wrote (--keep keeps them).
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path[:0] = [os.path.dirname(_HERE), os.path.join(os.path.dirname(_HERE), "tests")]

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import shlex  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from bench import _common as C  # noqa: E402
from rig import Rig  # noqa: E402
from specops import inventory  # noqa: E402
from specops.host.connection import connect  # noqa: E402
from specops.ops import jobs, pipeline  # noqa: E402
from specops.ops import plan as P  # noqa: E402

WORKDIR = "~/specops-bench-plan"
DATASET = "bench-plan"


def cli(*args, timeout=3600):
    dt, p = C.timed_run([str(C.VENV_BIN / "inv"), *args], timeout=timeout, env=C.cli_env(), cwd=C.REPO)
    if p.returncode != 0:
        raise SystemExit(f"inv {' '.join(args[:1])} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return dt, p.stdout


def real_train(t, rid, tmp, plan):
    """The real run's own step figures, measured the way the plan measures its sample's."""
    from specops import estimate

    j = jobs.status(t, rid)[0]
    d = tmp / rid
    d.mkdir(exist_ok=True)
    return estimate.train_measurement(P.train_records(t, rid, d), started=j.started, ended=j.ended_at,
                                      tokens=plan["tokens_full"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sample", type=int, default=50)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rows", type=int, default=200)
    ap.add_argument("--online", action="store_true", help="also train online for real (its row of the plan)")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    print(f"machine: {C.machine()}; {time.strftime('%Y-%m-%d %H:%M:%S')}; load {os.getloadavg()[0]:.2f}")
    rig = Rig().start()
    tmp = Path(tempfile.mkdtemp(prefix="specops-bench-plan-"))
    try:
        hf = rig.write_hosts(rig.root / "hosts-bench.yaml", {"bench": rig.host(venv="~/ml-env", workdir=WORKDIR)})
        H = ["--host", "bench", "--hosts", str(hf)]
        cli("bootstrap", *H)
        h = inventory.load(str(hf)).get("bench")
        with connect(h) as t:
            ver = f"{t.workdir}/{pipeline.DEMO_VERIFIER}"
            pipeline.ensure_learnable_verifier(t, ver)
            t.check(f"rm -rf {shlex.quote(t.workdir)}/data/{DATASET} {shlex.quote(t.workdir)}/plans", "a clean start")
        convs = pipeline.demo_conversations(tmp / "demo-conversations.jsonl", n=a.rows)
        common = [*H, "--data", str(convs), "--dataset", DATASET, "--verifier", ver, "--layers", pipeline.DEMO_LAYERS,
                  "--seq-length", "512", "--config", pipeline.DEMO_CONFIG, "--vllm-arg=--enforce-eager"]
        print(f"data: {a.rows} demo conversations; plan on {a.sample} rows, {a.steps} steps per mode; "
              f"config {pipeline.DEMO_CONFIG}; user {rig.user}")

        plan_wall, out = cli("plan", *common, "--sample", str(a.sample), "--steps", str(a.steps), "--json")
        plan = json.loads(out)  # (--json: progress and logs on stderr, one document on stdout)
        print(f"plan: {plan_wall:.1f} s wall (CLI); auto would take {plan['auto']['mode']}")
        for mode, r in plan["modes"].items():
            for s in r["stages"]:
                print(f"  planned {mode:7} {s['stage']:18} {s['seconds']:8.1f} s  ({s['basis']})")

        real_wall, out = cli("pipeline", *common, "--dest", str(tmp / "runs"))
        rid = re.search(r"pipeline done: run (\S+)", out).group(1)
        with connect(h) as t:
            v = P.versus(t, rid)
            real = {"offline": real_train(t, rid, tmp, plan)}
        print(f"real: pipeline {real_wall:.1f} s wall (CLI: bootstrap, check, data job, inspect, train, fetch)")
        print("--- planned vs actual (offline: the demo's pipeline) ---")
        for r in v["rows"]:
            err = "" if r["error"] is None else f"{r['error'] * 100:+6.1f}%"
            act = "" if r["actual_s"] is None else f"{r['actual_s']:8.1f} s"
            print(f"  {r['stage']:18} planned {r['planned_s']:8.1f} s  actual {act}  error {err}")
        on = None
        if a.online:
            # (on the prepared rows without their hidden states, as the plan's online sample: speculators
            # reads a row's extracted file where there is one, and generates only the missing ones)
            with connect(h) as t:
                d = f"{t.workdir}/data"
                t.check(f"rm -rf {d}/{DATASET}-online && mkdir -p {d}/{DATASET}-online && cp -a {d}/{DATASET}/. "
                        f"{d}/{DATASET}-online/ && rm -rf {d}/{DATASET}-online/hidden_states "
                        f"{d}/{DATASET}-online/.hs_stage", "the prepared rows without their hidden states")
            _, out = cli("train", *H, "--dataset", DATASET + "-online", "--verifier", ver, "--layers", pipeline.DEMO_LAYERS,
                         "--config", pipeline.DEMO_CONFIG, "--hidden-states", "online", "--vllm-arg=--enforce-eager",
                         "--no-serve-check", "--follow")
            orid = re.search(r"train (\S+) on bench: finished", out).group(1)
            with connect(h) as t:
                j = jobs.status(t, orid)[0]
                real["online"] = real_train(t, orid, tmp, plan)
            on = (plan["modes"]["online"]["stages"][-1]["seconds"], j.ended_at - j.started)
            print(f"  online train       planned {on[0]:8.1f} s  actual {on[1]:8.1f} s  error "
                  f"{(on[0] - on[1]) / on[1] * 100:+6.1f}%")
        print("--- where the training's error comes from: the sample's steps vs the real run's ---")
        for mode, r in real.items():
            s_ = plan["measured"]["train"][mode]
            print(f"  {mode:7} median tokens/s: sample {s_['tokens_per_s']['median']:.0f} ({s_['timed_steps']} steps) vs "
                  f"real {r['tokens_per_s']['median']:.0f} ({r['timed_steps']} steps); start: sample "
                  f"{s_['startup_s']:.0f} s vs real {r['startup_s']:.0f} s; real min/median/max step "
                  f"{r['step_s']['min']:.2f}/{r['step_s']['median']:.2f}/{r['step_s']['max']:.2f} s")
        tot = v["rows"][-1]
        print("--- summary ---")
        print(f"whole run (offline): planned {tot['planned_s']:.1f} s, actual {tot['actual_s']:.1f} s, error "
              f"{tot['error'] * 100:+.1f}% (goal: within 25%: {'met' if abs(tot['error']) <= 0.25 else 'NOT met'})")
        print(f"the plan itself took {plan['plan_seconds']:.1f} s on the host ({plan_wall:.1f} s CLI), "
              f"{plan_wall / real_wall:.2f}x the real pipeline's {real_wall:.1f} s")
        print(f"load average at the end: {os.getloadavg()[0]:.2f} (other work on the machine moves both)")
    finally:
        if not a.keep:
            try:
                with connect(inventory.load(str(rig.root / "hosts-bench.yaml")).get("bench")) as t:
                    w = shlex.quote(t.workdir)
                    t.run(f"rm -rf {w}/data {w}/runs {w}/plans {w}/uploads")
            except Exception as e:  # noqa: BLE001 - cleanup only
                print(f"cleanup: {e}")
        rig.stop()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(rig.root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
