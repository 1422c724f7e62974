"""The data stage on a host: prepare-data, extract, convert-data (specops_host/data/datagen.py does the work)."""

from __future__ import annotations

import hashlib
import json
import posixpath
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from specops import paths
from specops.ops import jobs
from specops.contract import check_name, human_bytes
from specops.errors import SpecopsError
from specops.host.remote_exec import progress_args, run_script
from specops.host.transport import Plan, Transport, planned
from specops.payloads import Converted, DatagenPlan, ModelBuilt


def data_dir(t: Transport, name_or_path: Optional[str]) -> str:
    """`default` -> <workdir>/data/default; a path (with / or ~) is used as given."""
    v = name_or_path or "default"
    if "/" in v or v.startswith("~"):  # (a relative path is the workdir's: said as the absolute path it is)
        p = t.expand(v)
        return p if p.startswith("/") else posixpath.normpath(f"{t.workdir}/{p}")
    check_name("dataset name", v)  # the one name rule: the path stays under data/
    return f"{t.workdir}/data/{v}"


def remote_input(t: Transport, path: str) -> str:
    """A file on the laptop is uploaded to <workdir>/uploads/<sha256 prefix>-<name> (an upload
    never replaces another: the same name with other content gets its own file; the same content
    is not sent twice); otherwise it is a host path."""
    p = Path(path).expanduser()
    if p.is_file():  # (under --dry-run, check and put are planned)
        digest = hashlib.sha256(p.read_bytes()).hexdigest()[:16]
        dest_dir = f"{t.workdir}/uploads"
        dest = f"{dest_dir}/{digest}-{p.name}"
        if t.exists(dest, "-f"):
            t.note(f"{p} is already on {t.host.name} as {dest}")
            return dest
        t.check(f"mkdir -p {shlex.quote(dest_dir)}", "mkdir uploads")
        t.put(str(p), dest + ".part")
        t.check(f"mv -f {shlex.quote(dest + '.part')} {shlex.quote(dest)}", "finishing the upload")
        t.would_put = t.would_put | {dest}
        t.note(f"uploaded {p} -> {t.host.name}:{dest}")
        return dest
    remote = t.expand(path)
    if not t.exists(remote):
        raise SpecopsError(f"data file {path!r} is neither on this laptop nor on {t.host.name}: check the path")
    return remote


def verifier_path(t: Transport, verifier: Optional[str]) -> str:
    v = verifier or t.host.verifier
    if not v:
        raise SpecopsError(f"no verifier for {t.host.name}: set `verifier:` in hosts.yaml or pass --verifier PATH")
    return t.expand(v)


@dataclass(frozen=True)
class Datagen:
    """specops_host/data/datagen.py's arguments as a value: built once (`Datagen.of`), rendered to argv at one
    edge (`argv`). The host's vLLM settings (hosts.yaml tensor_parallel, trust_remote_code,
    vllm_args) and this run's `--vllm-arg`s (after the host's: the last one wins in vLLM) are
    `vllm`; --max-model-len defaults on the host to the longest row + 1."""

    data: str
    verifier: str
    kind: str
    prepare: Optional[str] = None
    seq_length: int = 2048
    extract: bool = False
    backend: str = "vllm"
    layers: Optional[str] = None
    shard: Optional[str] = None
    rows: Optional[str] = None
    concurrency: int = 32
    max_model_len: Optional[int] = None
    overwrite: bool = False
    vllm: tuple[str, ...] = ()

    @classmethod
    def of(cls, t: Transport, *, data: str, verifier: str, prepare: Optional[str] = None, seq_length: int = 2048,
           extract: bool = False, backend: str = "vllm", layers: Optional[str] = None, shard: Optional[str] = None,
           rows: Optional[str] = None, concurrency: int = 32, max_model_len: Optional[int] = None,
           vllm_args: Optional[list[str]] = None, overwrite: bool = False) -> "Datagen":
        return cls(data=data, verifier=verifier, kind=t.host.profile, prepare=prepare, seq_length=seq_length,
                   extract=extract, backend=backend, layers=layers, shard=shard, rows=rows, concurrency=concurrency,
                   max_model_len=max_model_len, overwrite=overwrite,
                   vllm=tuple(t.host.vllm_flags(list(vllm_args or []))))

    def argv(self, *more: str) -> list[str]:
        """The script's arguments (then `more`, e.g. --plan)."""
        args = ["--data-dir", self.data, "--verifier", self.verifier, "--kind", self.kind]
        if self.prepare:
            args += ["--prepare", self.prepare, "--seq-length", str(self.seq_length)]
        if self.extract:
            args += ["--extract", "--backend", self.backend, "--concurrency", str(self.concurrency)]
            if self.layers:
                args += ["--layers", str(self.layers)]
            if self.shard:
                args += ["--shard", self.shard]
            if self.rows:
                args += ["--rows", self.rows]
        if self.max_model_len:
            args += ["--max-model-len", str(self.max_model_len)]
        if self.overwrite:  # (a dataset prepared from another file, hidden states of other layer ids)
            args.append("--overwrite")
        return args + list(self.vllm) + list(more)


def datagen_args(t: Transport, **kw) -> list[str]:
    """specops_host/data/datagen.py's argv for these settings (`Datagen.of(t, **kw).argv()`)."""
    return Datagen.of(t, **kw).argv()


def plan_datagen(t: Transport, dg: Datagen, *, kind: str, quiet: bool = False) -> DatagenPlan:
    """specops_host/data/datagen.py --plan (changes nothing): the checks, the disk budget (a note), the commands."""
    pending = t.dry_run and dg.prepare is not None and dg.prepare in t.would_put
    plan = run_script(t, "data.datagen", dg.argv("--plan", *(["--prepare-later"] if pending else [])), changes=False,
                      model=DatagenPlan)
    if not plan.ok:
        raise SpecopsError(f"{kind} on {t.host.name} refused: {plan.error}")
    if plan.estimate_bytes is not None and not quiet:
        t.note(f"disk budget: {plan.tokens} tokens x {len(plan.layer_ids)} layers x "
               f"{plan.hidden_size} x 2 B = {human_bytes(plan.estimate_bytes)} "
               f"(+10%); {human_bytes(plan.free_bytes)} free; {plan.todo} file(s) to write, "
               f"{plan.done} already there")
    return plan


def datagen_lock(dg: Datagen) -> str:
    """One writer per data dir."""
    return "data-" + hashlib.sha1(dg.data.encode()).hexdigest()[:12]


def planned_commands(t: Transport, plan: DatagenPlan) -> None:
    """Under --dry-run, what the job would start (the vLLM server, speculators ...): review -tp before GPU hours."""
    if t.dry_run:
        for cmd in plan.commands:
            t.plan("would start: " + shlex.join(map(str, cmd)))


def run_datagen(t: Transport, dg: Datagen, *, kind: str, run_id: Optional[str] = None,
                detach: bool = False, quiet: bool = False) -> Optional[dict | Plan]:
    """Plan (synchronous, changes nothing), then run as a job and follow it: the job's
    result; None when detached; under --dry-run the Plan (with the commands it would start)."""
    plan = plan_datagen(t, dg, kind=kind, quiet=quiet)
    rid = run_id or jobs.new_run_id(kind)
    result = jobs.run_path(t, rid, "result.json")
    argv = [*paths.host_argv(t.expand(t.host.python), "data.datagen"), *dg.argv("--result", result)]
    lock = datagen_lock(dg)
    planned_commands(t, plan)
    if quiet:  # several hosts at once: no interleaved logs; wait for the end
        started = jobs.start(t, rid, argv, kind=kind, lock=lock)
        code = started if planned(started) else jobs.follow(t, rid, write=lambda b: None)[1]
    else:
        code = jobs.run_attached(t, rid, argv, kind=kind, lock=lock, detach=detach)
    if code is None or planned(code):  # detached, or the Plan under --dry-run
        return code
    raw = t.read_bytes(result)
    res = json.loads(raw) if raw else {"ok": False, "error": f"no result (exit {code})"}
    if code != 0 or not res.get("ok"):
        raise SpecopsError(f"{kind} {rid} on {t.host.name} failed: {res.get('error')}",
                           detail=jobs.tail(t, rid, 15))
    res["run_id"] = rid
    return res


def convert(t: Transport, src: str, dst: str) -> Converted | Plan:
    """A legacy data dir converted (specops_host/data/convert_data.py); the Plan under --dry-run."""
    res = run_script(t, "data.convert_data", ["--src", t.expand(src), "--dst", t.expand(dst)], model=Converted)
    if planned(res):
        return res
    if not res.ok:
        raise SpecopsError(f"convert-data on {t.host.name}: {res.error}")
    return res


def model_slot(t: Transport, path: str, overwrite: bool, what: str) -> str:
    """path expanded, once it may take a new model: an empty or missing folder, or (overwrite) one
    whose files will be replaced (said under --dry-run). Refused in one line otherwise."""
    path = t.expand(path)
    if t.exists(path) and t.fact(f"ls -A {shlex.quote(path)} | head -c1").stdout:
        if not overwrite:
            raise SpecopsError(f"{what}: {t.host.name}:{path} already holds files: pass --overwrite to replace "
                               f"them, or another --path (nothing was changed)")
        if t.dry_run:
            t.plan(f"would replace the model at {path} (--overwrite)")
    return path


def make_tiny_verifier(t: Transport, path: str, *, layers: Optional[int] = None, hidden: int = 256,
                       shape: str = "llama", overwrite: bool = False) -> ModelBuilt | Plan:
    """Build a tiny random verifier + local tokenizer on the host (demo, tests; no model hub): a
    Llama, or (shape kimi) Kimi-K2.5's config shape with its custom code (tests/fixtures/kimi/,
    sent to the host first). An existing model is replaced only with overwrite. The Plan under --dry-run."""

    path = model_slot(t, path, overwrite, "make-verifier")
    args = [path, "--shape", shape, "--hidden", str(hidden)] + (["--layers", str(layers)] if layers else [])
    if shape == "kimi":
        code = f"{t.workdir}/{paths.STATE}/fixtures/kimi"
        t.sync_up(str(paths.REPO / "tests" / "fixtures" / "kimi"), code)
        args += ["--code", code]
    if overwrite:
        args.append("--overwrite")
    res = run_script(t, "fixtures.tiny_verifier", args, timeout=900, model=ModelBuilt)
    if planned(res):
        return res
    if not res.ok:
        raise SpecopsError(f"building the tiny verifier on {t.host.name} failed: {res.error}")
    return res


#: specops_host/fixtures/learnable_verifier.py's --size presets -> their default training budget (seconds)
LEARNABLE_SIZES = {"tiny": 90.0, "1b": 300.0, "3b": 600.0}


def make_learnable_verifier(t: Transport, path: str, *, seconds: Optional[float] = None, overwrite: bool = False,
                            steps: Optional[int] = None, size: str = "tiny") -> ModelBuilt | Plan:
    """Train a tiny Llama on the synthetic language on the host's CPU (specops_host/fixtures/learnable_verifier.py,
    at most `seconds` of training) and publish it at path with its tokenizer and chat template.
    Returns the script's payload (path, layers, hidden, vocab, params, steps, loss,
    greedy_agreement, language{fingerprint, ...}); the Plan under --dry-run. An existing model is
    replaced only with overwrite. size: "tiny" (4 layers, hidden 128: CPU) or "1b" / "3b" (about
    one / 2.8 billion parameters, trained on the host's GPU: verifiers whose decoding is bound by memory)."""
    if size not in LEARNABLE_SIZES:
        raise SpecopsError(f"make-verifier --size {size!r}: choose {', '.join(LEARNABLE_SIZES)}")
    seconds = float(seconds if seconds is not None else LEARNABLE_SIZES[size])
    path = model_slot(t, path, overwrite, "make-verifier --learnable")
    args = [path, "--seconds", f"{seconds:g}", "--size", size] + (["--steps", str(int(steps))] if steps else [])
    if overwrite:
        args.append("--overwrite")
    res = run_script(t, "fixtures.learnable_verifier", args + progress_args(), timeout=float(seconds) + 600,
                     progress=True, model=ModelBuilt)  # (its progress lines as they come: steps, loss, agreement)
    if planned(res):
        return res
    if not res.ok:
        raise SpecopsError(f"building the learnable verifier on {t.host.name} failed: {res.error}")
    return res
