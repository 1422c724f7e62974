"""pipeline: bootstrap, check, prepare, extract, inspect, train, fetch on one host; and the
demo: the same on the built-in `local` host with a tiny random verifier built on the fly."""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path
from typing import Optional

from . import bootstrap, check, data, fetch, inspect, metrics, train
from .errors import SpecopsError
from .transport import Transport

WORDS = ("the a of to and in is it you that was for on are with as his they be at one have this from or had "
         "by word but what some we can out other were all there when up use your how said each she which do "
         "their time if will way about many then them write would like so these her long make thing see him "
         "two has look more day could go come did number sound no most people my over know water than call "
         "first who may down side been now find any new work part take get place made live where after back "
         "little only round man year came show every good me give our under name very through just form "
         "python code function return value list model token draft speculative decoding verifier hidden").split()


def demo_conversations(path: Path, n: int = 48, seed: int = 123) -> Path:
    """A small synthetic chat dataset (role/content turns) for the demo and the tests."""
    rng = random.Random(seed)

    def sent(a, b):
        s = " ".join(rng.choice(WORDS) for _ in range(rng.randint(a, b)))
        return s[0].upper() + s[1:] + "."

    with open(path, "w") as f:
        for i in range(n):
            conv = [{"role": "system", "content": "You are a helpful assistant."}] if i % 4 == 0 else []
            for _ in range(1 if i % 3 else 2):
                conv.append({"role": "user", "content": sent(4, 15)})
                conv.append({"role": "assistant", "content": " ".join(sent(5, 20) for _ in range(rng.randint(1, 4)))})
            f.write(json.dumps({"conversations": conv}) + "\n")
    return path


def run(t: Transport, *, data_file: str, dataset: Optional[str] = None, verifier: Optional[str] = None,
        backend: str = "vllm", layers: Optional[str] = None, seq_length: int = 2048,
        config: Optional[str] = None, overrides: Optional[dict] = None, dest: str = "runs",
        skip_bootstrap: bool = False, on_inspect=None) -> Optional[dict]:
    """The whole job; None under --dry-run (the plan is on the connection). on_inspect(result)
    gets inspect-data's result (the task renders it)."""
    h = t.host
    if not skip_bootstrap:
        bootstrap.bootstrap(t)
    with t.step(f"check {h.name}"):
        res = check.check(t, min_free_gb=1.0)
    check.verdict(h.name, res)
    ddir = data.data_dir(t, dataset)
    ver = data.verifier_path(t, verifier)
    args = data.datagen_args(t, data=ddir, verifier=ver, prepare=data.remote_input(t, data_file),
                             seq_length=seq_length, extract=True, backend=backend, layers=layers)
    dg = data.run_datagen(t, args, kind="data")
    if dg is None:  # --dry-run
        t.plan("then: inspect-data, train and fetch, once the data exist (not shown: they depend on it)")
        return None
    ex = dg.get("extract", {})
    t.note(f"✓ data: prepared and extracted ({backend}): {ex.get('tokens')} tokens, {ex.get('tokens_per_s')} tokens/s",
           "done")
    ins = inspect.inspect(t, ddir, sample=8, verifier=ver)
    if on_inspect:
        on_inspect(ins)
    inspect.verdict(ins)
    tr = train.train(t, config=config, dataset=ddir, verifier=ver, overrides=overrides, follow=True)
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


def demo(t: Transport, *, dest: str = "runs", steps: Optional[int] = None, on_inspect=None) -> Optional[dict]:
    if t.host.profile != "cpu":
        raise SpecopsError(f"the demo runs on a cpu-profile host (`local` by default); {t.host.name} is "
                           f"{t.host.profile}: use `inv pipeline` there")
    bootstrap.bootstrap(t)
    vpath = f"{t.expand(t.host.workdir_path)}/models/tiny-llama"
    if not t.exists(f"{vpath}/config.json", "-f"):
        with t.step("build a tiny random Llama verifier + tokenizer"):
            data.make_tiny_verifier(t, vpath)
    with tempfile.TemporaryDirectory() as tmp:
        convs = demo_conversations(Path(tmp) / "demo-conversations.jsonl")
        return run(t, data_file=str(convs), dataset="demo", verifier=vpath, backend="vllm", layers="1,3,4,6",
                   seq_length=512, config="configs/demo.yaml", dest=dest, skip_bootstrap=True,
                   overrides={"max-steps": steps} if steps else None, on_inspect=on_inspect)
