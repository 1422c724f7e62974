"""Typed views of what the host's scripts answer (pydantic; the host side stays stdlib-only)."""

from __future__ import annotations

import json
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from specops.contract import JobState
from specops.errors import SpecopsError


class Payload(BaseModel):
    """Every payload: ok, and the one-line error when not."""

    model_config = ConfigDict(extra="allow")
    ok: bool
    error: Optional[str] = None


class Job(BaseModel):
    """One detached job's record (remote/job.py), state brought up to date."""

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
    sigkill: bool = False
    seconds: Optional[float] = None


class Started(Payload):
    run_id: Optional[str] = None
    pid: Optional[int] = None


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
    (remote/train.py, remote/online.py, remote/dist_check.py). The host reads it with
    remote/trainspec.py: the same field names and types (tests/test_trainspec.py holds the two
    together). Only the fields a run sets are written (exclude_unset): the host fills the rest in."""

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
    #: an online run's server settings and timing (remote/online.py)
    online: Optional[dict[str, Any]] = None
    online_timing: Optional[dict[str, Any]] = None
    #: what run.json keeps of this start
    record: dict[str, Any] = {}
    #: several nodes (a group, or a Slurm job): torchrun's fields (remote/launch.py)
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
        try:
            return cls.model_validate(spec)
        except ValidationError as e:
            first = e.errors()[0]
            raise SpecopsError(f"train spec for {spec.get('run_dir') if isinstance(spec, dict) else spec!r}: field "
                               f"{'.'.join(map(str, first['loc'])) or '(spec)'}: {first['msg']}") from None

    def to_json(self) -> str:
        """The file's text: only the fields set (the host's reader fills in the rest)."""
        return json.dumps(self.model_dump(exclude_unset=True), indent=1)
