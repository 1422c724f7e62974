"""Typed views of what the host's scripts answer (pydantic; the host side stays stdlib-only)."""

from __future__ import annotations

import json
from typing import Any, Literal, Optional, Type, TypeVar, Union

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from specops.contract import JobState
from specops.errors import SpecopsError


M = TypeVar("M", bound=BaseModel)


def validated(model: Type[M], data, prefix: str, suffix: str = "") -> M:
    """data as the model, or SpecopsError in one line: prefix, the first field that breaks it, why, suffix."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        raise SpecopsError(f"{prefix}{'.'.join(map(str, first['loc'])) or '(as a whole)'}: {first['msg']}{suffix}"
                           ) from None


class Payload(BaseModel):
    """Every payload: ok, and the one-line error when not; `exit`: the script's exit status.
    Callers read fields as attributes; the fields a model does not name stay as extras
    (extra="allow": a newer host script may say more). A payload also reads like the dict it was
    decoded from (`p["rows"]`, `p.get("x")`, `"x" in p`: a field the host sent), for the views
    that render several scripts' payloads alike."""

    model_config = ConfigDict(extra="allow")
    ok: bool
    error: Optional[str] = None
    exit: Optional[int] = None

    @classmethod
    def of(cls, payload):
        """A payload as given, or this model of a decoded dict."""
        return payload if isinstance(payload, cls) else cls.model_validate(payload)

    @model_validator(mode="before")
    @classmethod
    def _null_is_the_default(cls, data):
        """A host script's null for a field with a non-null default (a list, a flag) reads as the default."""
        if isinstance(data, dict):
            f = cls.model_fields
            return {k: v for k, v in data.items() if not (v is None and k in f and f[k].default is not None)}
        return data

    def __getitem__(self, key: str):
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None

    def get(self, key: str, default=None):
        """A field the host sent, else default (as dict.get: a declared field it left out is not sent)."""
        return getattr(self, key) if key in self else default

    def __contains__(self, key: str) -> bool:
        return key in self.model_fields_set or key in (self.__pydantic_extra__ or {})

    def __setitem__(self, key: str, value) -> None:
        setattr(self, key, value)


class Job(BaseModel):
    """One detached job's record (remote/specops_host/jobs/job.py), state brought up to date."""

    model_config = ConfigDict(extra="allow")
    run_id: str
    kind: str = ""
    state: JobState
    detail: str = ""
    pid: Optional[int] = None
    age_s: float = 0.0
    gpu_mib: Optional[int] = None
    last_line: str = ""
    log_bytes: int = 0
    exit_code: Optional[int] = None
    error: Optional[str] = None
    #: the host's clock when the job started, and (once it ended) when it ended (`ended` says whether)
    started: Optional[float] = None
    ended_at: Optional[float] = None
    #: the jobs this run started itself (an online training's vLLM server, RUN/server/)
    subjobs: list["Job"] = []
    #: the other runs this job reads or writes (an evaluation's training run): `clean` keeps them
    uses: list[str] = []
    #: a run id that is a symlink to another run: why it is no run of its own (one line naming the target)
    symlink: Optional[str] = None
    #: a Slurm job's (specops/slurm/cluster.py): its id, Slurm's state, nodes, pending reason, lock, array size
    slurm_job_id: Optional[str] = None
    slurm_state: Optional[str] = None
    nodes: str = ""
    reason: str = ""
    lock: Optional[str] = None
    array: Optional[int] = None

    @property
    def ended(self) -> bool:
        return self.state.terminal

    @property
    def describe(self) -> str:
        """'failed (exit 3)', 'running', ..."""
        return f"{self.state.value} ({self.detail})" if self.detail else self.state.value


class Jobs(Payload):
    jobs: list[Job] = []


class Stopped(Payload):
    run_id: Optional[str] = None
    state: Optional[JobState] = None
    detail: str = ""
    already: Optional[str] = None
    marked: bool = False  # (a lost run: marked ended, nothing of it being left)
    sigkill: bool = False
    seconds: Optional[float] = None


class Started(Payload):
    run_id: Optional[str] = None
    pid: Optional[int] = None
    #: the run's output.log size before this start (a re-run, a resume, appends): its follower starts there
    log_from: int = 0
    slurm_job_id: Optional[str] = None  # (a Slurm host's job)


class CheckRow(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    value: str = ""
    hint: str = ""
    ok: Optional[bool] = None
    hard: bool = True


class Check(Payload):
    rows: list[CheckRow] = []


class TrainSpec(BaseModel):
    """runs/R/train-spec.json: what `inv train` (and dist-check) hand the host's launchers
    (remote/specops_host/train/run.py, remote/specops_host/train/online.py, remote/specops_host/check/dist.py). The host
    reads it with remote/specops_host/train/spec.py: the same field names and types (tests/test_trainspec.py holds the
    two together). Only the fields a run sets are written (exclude_unset): the host fills the rest in."""

    model_config = ConfigDict(extra="forbid", strict=True)
    run_dir: str
    kind: Literal["cpu", "cuda"]
    #: trainer processes per node
    nproc: int = 1
    verifier: Optional[str] = None
    data: Optional[str] = None
    #: the aux layers (the dataset's layer ids without the last)
    target_layer_ids: Optional[list[int]] = None
    #: speculators train's flags (the resolved config)
    flags: dict[str, Any] = {}
    hidden_states: Literal["offline", "online"] = "offline"
    trust_remote_code: Union[str, bool] = "auto"
    #: an online run's server settings and timing (remote/specops_host/train/online.py)
    online: Optional[dict[str, Any]] = None
    online_timing: Optional[dict[str, Any]] = None
    #: what run.json keeps of this start
    record: dict[str, Any] = {}
    #: several nodes (a group, or a Slurm job): torchrun's fields (remote/specops_host/jobs/launch.py)
    nnodes: int = 1
    node_rank: Optional[int] = None
    rdzv_endpoint: Optional[str] = None
    rdzv_port: Optional[int] = None
    local_addr: Optional[str] = None
    nodes: Optional[list[str]] = None
    scheduler: Optional[str] = None
    #: filled in on the host, from Slurm's environment (never written by the laptop)
    slurm_job_id: Optional[str] = None

    @model_validator(mode="after")
    def _online_has_server(self) -> "TrainSpec":
        if self.hidden_states == "online" and self.online is None:
            raise ValueError("online hidden states need `online` (the server's settings)")
        return self

    @classmethod
    def of(cls, spec: Union["TrainSpec", dict]) -> "TrainSpec":
        """A spec as given, or built from a dict (checked the same way: SpecopsError naming the field)."""
        if isinstance(spec, cls):
            return spec
        where = spec.get("run_dir") if isinstance(spec, dict) else repr(spec)
        return validated(cls, spec, f"train spec for {where}: field ")

    def to_json(self) -> str:
        """The file's text: only the fields set (the host's reader fills in the rest)."""
        return json.dumps(self.model_dump(exclude_unset=True), indent=1)


# --- the other host scripts' replies (run_script(..., model=M)): the fields the laptop reads ---


class DeepCheck(Payload):
    """specops_host/check/deep.py: each candidate setting's training steps."""
    results: Optional[list[dict[str, Any]]] = None
    tail: list[str] = []
    #: the config file the settings came from (set by the laptop)
    config: Optional[str] = None


class ServeCheck(Payload):
    """specops_host/check/serve.py: vLLM served the verifier with an untrained draft (or why not)."""
    skipped: Optional[str] = None
    check_seconds: Optional[float] = None
    cached: bool = False
    cached_at: Any = None
    root_cause: Optional[str] = None
    stage: Optional[str] = None
    log: Optional[str] = None
    refused: bool = False
    bug: bool = False


class Installed(Payload):
    """specops_host/install/profile.py --list-installed: the venv's packages and platform."""
    installed: dict[str, str] = {}
    python: Optional[str] = None
    glibc: str = ""
    machine: str = ""


class Install(Payload):
    """specops_host/install/profile.py: the profile installed (or verified), or what did not fit."""
    mode: Optional[str] = None
    action: Optional[str] = None
    changed: dict[str, Any] = {}
    pip_exit: Optional[int] = None
    broken: list[str] = []
    missing: list[str] = []
    mismatches: list[dict[str, Any]] = []
    tail: list[str] = []
    seconds: Optional[float] = None
    #: a top-up of an existing venv: what it added, kept as it was, could not bring
    added: dict[str, Any] = {}
    kept: list[Any] = []
    absent: list[dict[str, Any]] = []
    pip_check: list[str] = []
    overrides: list[Any] = []


class DatagenPlan(Payload):
    """specops_host/data/datagen.py --plan: the disk budget and the commands the job would start."""
    tokens: Optional[int] = None
    layer_ids: list[int] = []
    hidden_size: Optional[int] = None
    estimate_bytes: Optional[int] = None
    free_bytes: Optional[int] = None
    todo: Optional[int] = None
    done: Optional[int] = None
    commands: list[list[Any]] = []


class Converted(Payload):
    """specops_host/data/convert_data.py: a dataset converted to specops' layout."""
    rows: Optional[int] = None
    dst: Optional[str] = None
    seconds: Optional[float] = None


class ModelBuilt(Payload):
    """specops_host/fixtures/tiny_verifier.py / learnable_verifier.py / real_verifier.py: a verifier built on the
    host."""
    path: Optional[str] = None
    shape: Optional[str] = None
    layers: Optional[int] = None
    hidden: Optional[int] = None
    vocab: Optional[int] = None
    params: Optional[int] = None
    # (fixtures/real_verifier.py: a real model's name, its wheel, positions, a greedy answer, cached or built)
    model: Optional[str] = None
    source: Optional[str] = None
    positions: Optional[int] = None
    question: Optional[str] = None
    answer: Optional[str] = None
    cached: Optional[bool] = None


class ServePlan(Payload):
    """specops_host/serve/evaluate.py / data/regenerate.py --plan: the servers the job would start."""
    commands: list[list[Any]] = []
    prompts: Any = None
    sides: list[str] = []  # (evaluate: what each command serves, after the first)
    skipped: list[dict[str, Any]] = []  # (evaluate: the baselines the host's vLLM cannot serve, and why)


class Inspection(Payload):
    """specops_host/data/inspect_data.py: the data layout's verdict (ok false with violations: data that fail)."""
    format: Optional[str] = None
    files: Optional[int] = None
    rows: Optional[int] = None
    violations: list[dict[str, Any]] = []
    n_violations: int = 0
    record: Optional[dict[str, Any]] = None
    verifier_vocab_size: Optional[int] = None
    verifier_config: Optional[str] = None


class Manifest(Payload):
    """specops_host/fetch/manifest.py: every file under a directory, with its size and sha256."""
    files: dict[str, dict[str, Any]] = {}


class Checkpoints(Payload):
    """specops_host/ckpt.py: a run's checkpoints by the one rule, and the names asked resolved."""
    complete: list[str] = []
    incomplete: dict[str, str] = {}  # name: why (its save did not finish, set aside)
    aliases: dict[str, str] = {}  # symlink in checkpoints/: the folder it names
    resolved: list[dict[str, Any]] = []  # per name asked: asked, name, path; or asked, reason, why, error


class HiddenStatesPlan(Payload):
    """specops_host/train/online.py (read-only): which hidden states a run uses, and why."""
    mode: Optional[Literal["offline", "online"]] = None
    asked: Optional[str] = None
    reason: str = ""
    notes: list[str] = []
    rows: Optional[int] = None
    files: Optional[int] = None
    missing: Optional[int] = None
    prepared: Optional[bool] = None
    tokens: Optional[int] = None
    hidden_size: Optional[int] = None
    file_bytes: Optional[int] = None
    layer_ids: list[int] = []
    nproc: Optional[int] = None
    verifier: Optional[str] = None
    data_dir: Optional[str] = None
    server: Optional[dict[str, Any]] = None
    server_command: Optional[list[Any]] = None
