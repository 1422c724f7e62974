"""synthesize: conversations the verifier writes itself, questions and answers (Magpie's method:
remote/specops_host/data/synthesize.py drives one managed vLLM server of the verifier), as a detached job.
The output, <workdir>/synthesized/NAME.jsonl on the host, holds conversations rows that
`inv prepare-data --data <that path>` takes as they are."""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Optional

from specops.args import USAGE, Refused, refusing
from specops.contract import check_name
from specops.errors import SpecopsError
from specops.host.remote_exec import run_script
from specops.host.transport import Transport
from specops.ops import data
from specops.ops.data import remote_input, verifier_path
from specops.payloads import ServePlan


def default_name(verifier: str, rows: int, seed: int) -> str:
    """The output's name from the verifier's folder, the rows and the seed: smollm2-synth-1000-s0."""
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", PurePosixPath(verifier.rstrip("/")).name).lstrip(".-")[:80]
    return f"{stem or 'verifier'}-synth-{rows}-s{seed}"


def out_path(t: Transport, name: str) -> str:
    """<workdir>/synthesized/NAME.jsonl (NAME: the one name rule)."""
    return f"{t.workdir}/synthesized/{check_name('output name', name)}.jsonl"


class Synthesized(dict):
    """synthesize(): {run_id, out, rows, candidates, dropped, rows_per_s, sampling, next, ...}."""


def _flags(rows: Optional[int] = None, question_temperature: str = "1.0", answer_temperature: str = "0",
           topics: Optional[str] = None, seed_prompts: Optional[str] = None, **_) -> None:
    if not rows:
        raise Refused("synthesize needs --rows N (how many conversations to write, 1 or more)")
    if topics and seed_prompts:
        raise Refused("--topics and --seed-prompts both steer the questions: give one of them", code=USAGE)
    _temperature("--question-temperature", question_temperature)
    _temperature("--answer-temperature", answer_temperature)


def _temperature(flag: str, value: str) -> str:
    v = str(value).strip().lower()
    if v == "config":
        return v
    try:
        ok = 0 <= float(v) <= 5
    except ValueError:
        ok = False
    if not ok:
        raise Refused(f"{flag} {value!r}: give a temperature from 0 (greedy) to 5, or config (the verifier's "
                      f"generation config)", code=USAGE)
    return v


@refusing(_flags)
def synthesize(t: Transport, *, rows: int, out: Optional[str] = None, verifier: Optional[str] = None, seed: int = 0,
               topics: Optional[str] = None, seed_prompts: Optional[str] = None, question_temperature: str = "1.0",
               answer_temperature: str = "0",
               question_tokens: int = 128, max_tokens: int = 1024, concurrency: int = 32, servers: int = 1,
               attempts: Optional[int] = None, max_model_len: Optional[int] = None, vllm_arg: Optional[list] = None,
               overwrite: bool = False, run_id: Optional[str] = None, detach: bool = False) -> Optional[Synthesized]:
    """`rows` conversations the host's verifier writes itself, question and answer, into
    <workdir>/synthesized/NAME.jsonl (out: NAME, default <verifier>-synth-<rows>-s<seed>).
    seed: the same seed, the same rows (where vLLM's sampling is reproducible); topics: a file of
    topics (one a line; laptop file, uploaded, or a host path) that steer the questions; seed_prompts: a file of
    the user's own prompts (JSONL as evaluate's --prompts, conversations, or text a line; laptop or host), each
    the model of new questions of its kind (the rows carry its line and category);
    question_temperature / answer_temperature: a temperature or `config` (the verifier's generation
    config); question_tokens / max_tokens: the caps (a text cut at its cap is dropped); concurrency: requests in
    flight, over `servers` vLLM servers of the verifier (several on one GPU, its memory shared: a small model's
    server is bound by its own CPU-side work, not by the GPU); attempts:
    candidates at most (default 4 x rows + 16). Returns {run_id, out (host path), rows, dropped,
    rows_per_s, sampling, ...}; None when detached. Refuses (SpecopsError) before anything starts
    when the input is unusable (no verifier, no chat template, the output there without overwrite). Resumes
    where an earlier run of the same out stopped (its progress file, synthesized/.NAME.jsonl.partial: the same
    settings, else refused); overwrite starts over."""
    h = t.host
    qt = _temperature("--question-temperature", question_temperature)
    at = _temperature("--answer-temperature", answer_temperature)
    ver = verifier_path(t, verifier)
    dest = out_path(t, out or default_name(ver, int(rows), int(seed)))
    args = ["--out", dest, "--verifier", ver, "--kind", h.profile, "--rows", str(int(rows)), "--seed", str(int(seed)),
            "--question-temperature", qt, "--answer-temperature", at, "--question-tokens", str(int(question_tokens)),
            "--max-tokens", str(int(max_tokens)), "--concurrency", str(int(concurrency)),
            "--servers", str(int(servers))]
    later = []
    for flag, path in (("--topics", topics), ("--seed-prompts", seed_prompts)):
        if path:
            src = remote_input(t, path)
            args += [flag, src]
            later += [f"{flag}-later"] if t.pending(src) else []
    if attempts:
        args += ["--attempts", str(int(attempts))]
    if max_model_len:
        args += ["--max-model-len", str(int(max_model_len))]
    if overwrite:
        args += ["--overwrite"]
    args += h.vllm_flags(list(vllm_arg or []))
    plan = run_script(t, "data.synthesize", args + ["--plan"] + later, changes=False, model=ServePlan)
    if not plan.ok:
        raise SpecopsError(f"synthesize on {h.name} refused: {plan.error} (nothing was started)")
    t.note(f"synthesize: {int(rows)} conversation(s) the verifier writes itself -> {dest}")
    r = plan.get("resume")
    if r:  # (an earlier run's progress beside --out, its settings these: a real run says it as it resumes)
        t.would(f"would resume {PurePosixPath(dest).stem}: {r['rows']:,} rows kept of {r['judged']:,} candidates "
                f"judged (from {r['file']}; --overwrite starts over)")
    for line in plan.get("sampling") or []:
        t.would(f"sample {line}")  # (a real run: the job says it, first)
    res = data.run_writer(t, "data.synthesize", args, plan, kind="synthesize", dest=dest, run_id=run_id,
                          detach=detach)
    return None if res is None else Synthesized(res)
