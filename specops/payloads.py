"""Typed views of what the host's scripts answer (pydantic; the host side stays stdlib-only)."""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict

from specops.contract import JobState


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
