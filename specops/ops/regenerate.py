"""regenerate: the verifier's own responses for a dataset's prompts (remote/specops_host/data/regenerate.py runs
`speculators regenerate-responses` against a managed vLLM server of the verifier), as a
detached job. The output, <workdir>/regenerated/NAME.jsonl on the host, holds pre-tokenised rows
(input_ids, loss_mask over the response) that `inv prepare-data --data <that path>` takes."""

from __future__ import annotations

import json
import re
from pathlib import PurePosixPath
from typing import Optional

from specops.args import Refused, refusing
from specops.contract import check_name
from specops.ops.data import remote_input, run_writer, verifier_path
from specops.errors import SpecopsError
from specops.host.remote_exec import progress_args, run_script
from specops.host.transport import Transport
from specops.payloads import ServePlan


def default_name(data: str) -> str:
    """The output's name from the input file's: convs.jsonl -> convs-regen."""
    stem = PurePosixPath(data).name.split(".")[0]
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", stem).lstrip(".-")[:100]
    return f"{stem or 'data'}-regen"


def out_path(t: Transport, name: str) -> str:
    """<workdir>/regenerated/NAME.jsonl (NAME: the one name rule)."""
    return f"{t.workdir}/regenerated/{check_name('output name', name)}.jsonl"


class Regenerated(dict):
    """regenerate(): {run_id, out, prompts, rows, errors, errors_file, seconds, next, sampling, sampling_line,
    max_tokens, cut (answers cut at the cap), looping, quality (the line that says so, or None), ...}."""


def _needs_data(data: Optional[str] = None, **_) -> None:
    if not data:
        raise Refused("regenerate needs --data FILE (.jsonl of conversations or prompts)")


@refusing(_needs_data)
def regenerate(t: Transport, *, data: str, out: Optional[str] = None, verifier: Optional[str] = None,
               max_tokens: Optional[int] = None, seq_length: int = 2048, concurrency: int = 32,
               limit: Optional[int] = None,
               sampling_params: Optional[str] = None, max_model_len: Optional[int] = None,
               vllm_arg: Optional[list] = None, run_id: Optional[str] = None,
               detach: bool = False) -> Optional[Regenerated]:
    """Regenerate `data` (a laptop file, uploaded, or a host path) with the host's verifier.
    out: the output's name (default: <data's stem>-regen); max_tokens: a response's length cap
    (default: seq_length, the dataset's sequence length: prepare-data cuts a row there);
    sampling_params: a JSON object merged into every request (e.g. '{"temperature": 0.6}'; default:
    the verifier's generation_config.json, else greedy; the plan says which in one line);
    vllm_arg: more server arguments.
    Returns {run_id, out (host path), prompts, rows, errors, seconds, ...}; None when detached.
    Refuses (SpecopsError) before anything starts when the input is unusable."""
    h = t.host
    name = out or default_name(data)
    dest = out_path(t, name)
    if sampling_params is not None:
        try:
            ok = isinstance(json.loads(sampling_params), dict)
        except ValueError:
            ok = False
        if not ok:
            raise SpecopsError(f"--sampling-params {sampling_params!r}: give a JSON object, e.g. "
                               f"'{{\"temperature\": 0.6}}' (nothing was started)")
    src = remote_input(t, data)
    args = ["--data", src, "--out", dest, "--verifier", verifier_path(t, verifier), "--kind", h.profile,
            "--seq-length", str(int(seq_length))]
    if max_tokens:
        args += ["--max-tokens", str(int(max_tokens))]
    args += ["--concurrency", str(int(concurrency))]
    if limit:
        args += ["--limit", str(int(limit))]
    if sampling_params:
        args += ["--sampling-params", sampling_params]
    if max_model_len:
        args += ["--max-model-len", str(int(max_model_len))]
    args += h.vllm_flags(list(vllm_arg or [])) + progress_args()
    later = ["--data-later"] if t.pending(src) else []
    plan = run_script(t, "data.regenerate", args + ["--plan"] + later, changes=False, model=ServePlan)
    if not plan.ok:
        raise SpecopsError(f"regenerate on {h.name} refused: {plan.error} (nothing was started)")
    if plan.prompts is not None:
        t.note(f"regenerate: {plan.prompts} prompt(s) of {src} -> the verifier's responses in {dest}")
    if plan.get("sampling_line"):
        t.note(f"regenerate: {plan['sampling_line']}")
    res = run_writer(t, "data.regenerate", args, plan, kind="regenerate", dest=dest, run_id=run_id, detach=detach)
    return None if res is None else Regenerated(res)
