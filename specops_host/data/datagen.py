"""The data stage on this host: prepare-data, then hidden-state extraction (vLLM or HF).

Launch (what `inv prepare-data` / `inv extract` send, from the host workdir; `--plan` first,
synchronously, then the same arguments without it as a detached job):
    <venv>/bin/python3 -m specops_host.data.datagen --data-dir data/default --verifier /models/V --kind cuda \
        [--prepare convs.jsonl --seq-length 2048] \
        [--extract --backend vllm|hf --layers 2,30,58,61 --shard 0/4 | --rows 0:2000] \
        [--tensor-parallel 8] [--trust-remote-code auto|true|false] [--vllm-arg=ARG ...] \
        [--max-model-len N] [--plan [--prepare-later]] [--result runs/R/result.json]

--plan validates everything (verifier config, layer ids, shard, inputs, the disk budget, the
vLLM arguments) and changes nothing; its payload holds `commands`: the argv of every process
the run would start, in order (the vLLM server's port shows as <port>: it is picked at start).
Without it: prepare runs `speculators prepare-data` (a vLLM render server is started when rows
are conversations); extract runs a vLLM server with the `extract_hidden_states` speculative
config and a hidden-states connector (cpu hosts: the CPU-safe one in
specops_host/serve/cpu_hs_connector.py) plus `speculators generate-offline-data --validate-outputs`, or a
transformers forward (`--backend hf`) writing identical files. Existing readable files are
skipped. The server is stopped by its process group whatever happens (SIGTERM and Ctrl-C
included). Its job folder is RUN/server, its connector's staging folder DATA/.hs_stage; with
--shard i/n, RUN/server-i and DATA/.hs_stage-i-of-n (the tasks of a Slurm job array share the
run folder and the data dir, each with its own server).

Every loader gets the same trust_remote_code (vLLM, prepare-data, transformers): `auto` = on
when the verifier ships its own code (`auto_map`). The server spans --tensor-parallel GPUs and
gets --max-model-len = the longest row + 1 (the one token vLLM generates) unless given: the
prepared dataset's longest row, or --seq-length when the rows are prepared in the same run.
--vllm-arg (repeatable; `--vllm-arg=--flag` keeps a leading dash a value) goes last on every
server, after specops' own arguments.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from specops_host import contract
from specops_host.serve import vllm_server
from specops_host.contract import Refused, emit, human_bytes
from specops_host.data.datafmt import RECORD, check_verifier, hs_files, read_arrow_columns, readable, verifier_config
from specops_host.data.datafmt import read_json as read_config
from specops_host.jobs.errlines import first_error

HEADROOM = 1.10
PORT = "<port>"  # (in a plan's commands: the server's port is picked when it starts)


def parse_layers(spec, n):
    if spec:
        try:
            ids = [int(x) for x in str(spec).replace(" ", "").split(",") if x != ""]
        except ValueError:
            raise Refused(f"--layers {spec!r}: give comma-separated integers, e.g. 2,{n // 2},{n - 3},{n}") from None
    else:
        ids = [2, n // 2, n - 3, n]
        if not all(a < b for a, b in zip(ids, ids[1:])) or ids[0] < 0:
            raise Refused(f"the verifier has {n} layers: speculators' default layer ids {ids} are not valid "
                          f"there; pass --layers explicitly (distinct, ascending, last = {n}), "
                          f"e.g. {max(n // 4, 1)},{n // 2},{n - 1},{n}")
    if len(set(ids)) != len(ids) or ids != sorted(ids):
        raise Refused(f"--layers {ids}: ids must be distinct and ascending")
    if min(ids) < 0 or max(ids) > n:
        raise Refused(f"--layers {ids}: the verifier has {n} layers, so ids must lie in [0, {n}]")
    if ids[-1] != n:
        raise Refused(f"--layers {ids}: the last id must be {n} (the residual stream before the final norm, "
                      f"which EAGLE-3 trains against)")
    if len(ids) < 2:
        raise Refused(f"--layers {ids}: give at least one auxiliary layer id before {n}")
    return ids


def parse_range(shard, rows, n_rows):
    """-> (start, end) rows, speculators' contiguous split for --shard i/n."""
    if shard and rows:
        raise Refused("give --shard or --rows, not both")
    if shard:
        try:
            i, n = (int(x) for x in shard.split("/"))
            assert 0 <= i < n
        except (ValueError, AssertionError):
            raise Refused(f"--shard {shard!r}: use i/n with 0 <= i < n, e.g. 0/4") from None
        chunk, rem = divmod(n_rows, n)
        start = i * chunk + min(i, rem)
        return start, start + chunk + (1 if i < rem else 0)
    if rows:
        try:
            a, b = rows.split(":")
            a, b = int(a or 0), int(b) if b else n_rows
            assert 0 <= a <= b
        except (ValueError, AssertionError):
            raise Refused(f"--rows {rows!r}: use a:b with 0 <= a <= b, e.g. 0:2000") from None
        return a, min(b, n_rows)
    return 0, n_rows


def rows_need_render(src):
    """True if the data are conversations (need the render endpoint), False if pre-tokenised."""
    p = Path(src)
    files = sorted(p.glob("*.json*")) if p.is_dir() else [p]
    for f in files:
        with open(f) as fh:
            first = fh.readline().strip()
        if first.startswith("["):
            first_row = json.loads(Path(f).read_text())[0]
        else:
            first_row = json.loads(first) if first else {}
        return not ("input_ids" in first_row and "loss_mask" in first_row)
    raise Refused(f"{src}: no .json/.jsonl data found")


def source_rows(src):
    """(file, line, row) of every row of the --prepare data (.jsonl lines or .json arrays)."""
    p = Path(src)
    for f in (sorted(p.glob("*.json*")) if p.is_dir() else [p]):
        with open(f, errors="replace") as fh:
            first = fh.read(1 << 12).lstrip()
            fh.seek(0)
            if first.startswith("["):
                try:
                    rows = json.load(fh)
                except ValueError as e:
                    raise Refused(f"--prepare {f}: not JSON ({e})") from None
                yield from ((f, None, r) for r in rows)
                continue
            for n, line in enumerate(fh, 1):
                if line.strip():
                    try:
                        yield f, n, json.loads(line)
                    except ValueError as e:
                        raise Refused(f"--prepare {f}: line {n} is not JSON ({e})") from None


def verifier_vocab(verifier):
    """(vocab_size, where it is read) of the verifier, or (None, None)."""
    cfg, why = read_config(Path(verifier) / "config.json")
    info = check_verifier(cfg)[0] if not why else None
    return ((info or {}).get("vocab_size"), f"vocab_size of {verifier}/config.json")


def check_rows(src, verifier):
    """The cheap checks, before any server starts: every row is conversations or input_ids +
    loss_mask, and a pre-tokenised row's ids lie in the verifier's vocabulary."""
    vocab, where = verifier_vocab(verifier)
    n = 0
    for n, (f, line, row) in enumerate(source_rows(src), 1):
        at = f"--prepare {f}: row {n}" + (f" (line {line})" if line else "")
        if isinstance(row, dict) and "input_ids" in row and "loss_mask" in row:
            ids = row["input_ids"]
            if not isinstance(ids, list) or not all(type(x) is int for x in ids):
                raise Refused(f"{at}: input_ids is not a list of integers (nothing was started)")
            bad = next((j for j, x in enumerate(ids) if x < 0 or (vocab and x >= vocab)), None)
            if bad is not None:
                rng = f"[0, {vocab}) ({where})" if vocab else "[0, ...): token ids are never negative"
                raise Refused(f"{at}: token id {ids[bad]} at position {bad} is outside the verifier's vocabulary "
                              f"{rng}: were the rows tokenised for another model? (nothing was started)")
        elif not (isinstance(row, dict) and isinstance(row.get("conversations"), list)):
            keys = ", ".join(map(str, row)) if isinstance(row, dict) else f"a JSON {type(row).__name__}"
            raise Refused(f"{at} has neither `conversations` (a list of {{role, content}} turns) nor `input_ids` + "
                          f"`loss_mask` (it has: {keys or 'nothing'}): fix the rows (nothing was started)")
    if not n:
        raise Refused(f"--prepare {src}: no rows in it: nothing to prepare")
    return n


def file_sha256(path):
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_record(data):
    try:
        rec = json.loads((Path(data) / RECORD).read_text())
        return rec if isinstance(rec, dict) else {}
    except (OSError, ValueError):
        return {}


def check_prepare_source(a, data):
    """The --prepare file: a non-empty regular file (or a folder of .json/.jsonl); and, where the
    dataset is already prepared, the same file and sequence length as then, unless --overwrite.
    Returns (already prepared and to be kept, the file's sha256)."""
    src = Path(a.prepare)
    if a.seq_length < 1:
        raise Refused(f"--seq-length {a.seq_length}: give the longest row in tokens, 1 or more (e.g. 2048)")
    if src.is_dir():
        digest = None
    elif not src.is_file():
        raise Refused(f"--prepare {a.prepare}: not a regular file (a .jsonl of conversations or input_ids + loss_mask)")
    elif src.stat().st_size == 0:
        raise Refused(f"--prepare {a.prepare}: the file is empty: nothing to prepare")
    else:
        digest = file_sha256(src)
    if not list(data.glob("*.arrow")) or a.overwrite:
        return False, digest
    was = read_record(data).get("prepared_from") or {}
    same = was.get("sha256") == digest and digest is not None and was.get("seq_length") == a.seq_length
    if not same:
        what = (f"from {was.get('path')} (sha256 {str(was.get('sha256'))[:12]}, seq length {was.get('seq_length')})"
                if was else "by an earlier prepare-data")
        raise Refused(f"{data} already holds a dataset prepared {what}: pass --overwrite to replace it (its hidden "
                      f"states go too), or give another --dataset (nothing was changed)")
    return True, digest


def check_layers_against_files(a, data, layer_ids):
    """Hidden-state files extracted with other layer ids are never relabelled: refused unless
    --overwrite (which removes them first)."""
    rec = read_record(data)
    if a.overwrite or not rec.get("layer_ids") or rec["layer_ids"] == layer_ids or not hs_files(data):
        return
    raise Refused(f"{data} holds hidden states extracted with layer ids {rec['layer_ids']}, not {layer_ids}: pass "
                  f"--overwrite to extract them again with the new ids, or give another --dataset (nothing was changed)")


def free_bytes(path):
    p = Path(path).resolve()
    while not p.exists():
        p = p.parent
    return shutil.disk_usage(p).free


def reader_of(data):
    """The running job (a train: its run folder holds a train-spec.json) that reads the dataset
    at data, or None. Any running job counts, its record readable or not."""
    from specops_host.jobs import job

    me = Path(data).resolve()
    for rec in job.all_jobs():
        if rec["state"] != "running" or not rec.get("dir"):
            continue
        d = contract.read_json(Path(rec["dir"]) / "train-spec.json")
        used = d.get("data") if isinstance(d, dict) else None
        if isinstance(used, str) and Path(os.path.expanduser(used)).resolve() == me:
            return rec
    return None


def refuse_if_in_use(a, data):
    """--overwrite replaces what a running train reads (it would die mid-run: `Failed to load
    hidden states`): refused, naming the run."""
    rec = reader_of(data) if a.overwrite and (a.prepare or a.extract) else None
    if rec:
        raise Refused(f"{data} is the dataset of the running train {rec['run_id']!r} (pid {rec.get('pid')}): "
                      f"--overwrite would change its files under it; stop it first (`inv stop --run-id "
                      f"{rec['run_id']}`), wait for its end, or give another --dataset (nothing was changed)")


def plan(a):
    """Everything checkable before anything starts. Raises Refused."""
    if not a.verifier:
        raise Refused("no verifier: set `verifier:` for the host in hosts.yaml or pass --verifier PATH")
    vc = verifier_config(a.verifier)
    if vc is None:
        raise Refused(f"verifier {a.verifier}: no config.json there (a HF model directory is needed)")
    hidden, n = vc
    if a.tensor_parallel < 1:
        raise Refused(f"--tensor-parallel {a.tensor_parallel}: give 1 or more (GPUs one vLLM server spans)")
    if a.max_model_len is not None and a.max_model_len < 2:
        raise Refused(f"--max-model-len {a.max_model_len}: give the longest row + 1 or more")
    vllm_server.check_user_args(a.vllm_arg)
    out = {"verifier": a.verifier, "hidden_size": hidden, "num_hidden_layers": n, "data_dir": a.data_dir,
           "trust_remote_code": vllm_server.decide_trust(a.verifier, a.trust_remote_code),
           "custom_code": vllm_server.custom_code(a.verifier), "tensor_parallel": a.tensor_parallel,
           "vllm_args": list(a.vllm_arg)}
    data = Path(a.data_dir)
    refuse_if_in_use(a, data)
    longest = None
    if a.prepare and a.prepare_later and not Path(a.prepare).exists():
        out["prepare_later"] = True  # (a dry run: the laptop's file is uploaded before the real run)
    elif a.prepare:
        if not Path(a.prepare).exists():
            raise Refused(f"--prepare {a.prepare}: no such file on this host")
        out["already_prepared"], out["prepare_sha256"] = check_prepare_source(a, data)
        out["needs_render_server"] = rows_need_render(a.prepare)
        if not out["already_prepared"]:
            out["source_rows"] = check_rows(a.prepare, a.verifier)
    if a.extract:
        out["layer_ids"] = parse_layers(a.layers, n)
        check_layers_against_files(a, data, out["layer_ids"])
        if a.backend == "vllm" and a.rows:
            raise Refused("--rows is for --backend hf; the vllm backend splits with --shard i/n")
        if (data / "state.json").is_file():
            seq = read_arrow_columns(data, ["seq_len"])["seq_len"]
            longest = max(seq, default=None)
            start, end = parse_range(a.shard, a.rows, len(seq))
            have = hs_files(data)
            todo = [i for i in range(start, end) if not (i in have and readable(have[i]))]
            tokens = sum(seq[i] for i in todo)
            need = tokens * len(out["layer_ids"]) * hidden * 2
            free = free_bytes(data)
            out.update(rows=[start, end], todo=len(todo), done=(end - start) - len(todo), tokens=tokens,
                       estimate_bytes=need, free_bytes=free)
            print(f"[specops] disk budget: {tokens} tokens x {len(out['layer_ids'])} layers x {hidden} hidden x "
                  f"2 B = {human_bytes(need)} needed (+10%), {human_bytes(free)} free at {data}", flush=True)
            if need * HEADROOM > free:
                raise Refused(f"extraction needs {human_bytes(need)} (+10% headroom = {human_bytes(need * HEADROOM)}) "
                              f"but only {human_bytes(free)} is free at {data.resolve()}: free space, shard the rows, "
                              f"or move the data dir")
        elif not a.prepare:
            raise Refused(f"{data}: no prepared dataset (state.json): run `inv prepare-data` first")
    if a.max_model_len:
        out["max_model_len"] = a.max_model_len
    elif longest and not (a.prepare and not out.get("already_prepared")):
        out["max_model_len"] = longest + 1  # (the longest row + the one token vLLM generates)
    elif a.prepare:
        out["max_model_len"] = a.seq_length + 1
    else:
        out["max_model_len"] = None
    out["commands"] = commands(a, out)
    return out


def needs_server(a, info):
    return bool((a.prepare and info.get("needs_render_server", True) and not info.get("already_prepared"))
                or (a.extract and a.backend == "vllm"))


def hs_stage(a):
    """The server's staging folder in the data dir (its connector writes each row there, speculators
    moves it into hidden_states/), one per shard as its job folder is (server_name): a job array's
    tasks (one data dir and run folder, a server each) never share one, nor clear each other's."""
    return Path(a.data_dir) / (f".hs_stage-{a.shard.replace('/', '-of-')}" if a.shard else ".hs_stage")


def server_name(a):
    return f"server-{a.shard.split('/')[0]}" if a.shard else "server"


def server_cmd(a, info, port):
    return vllm_server.server_argv(
        a.verifier, port, kind=a.kind, layer_ids=info["layer_ids"] if a.extract and a.backend == "vllm" else None,
        stage=hs_stage(a), max_model_len=info.get("max_model_len"),
        tensor_parallel=a.tensor_parallel, trust_remote_code=info["trust_remote_code"], user_args=a.vllm_arg)


def beside(data):
    """Where prepare-data builds the dataset: a hidden folder beside it, moved in at the end (a
    failed or interrupted prepare leaves nothing in the dataset folder that blocks the re-run)."""
    data = Path(data)
    return data.parent / f".{data.name}.preparing"


def publish(stage, data, overwrite, source):
    """The built dataset into its folder: what was there goes only now (with --overwrite all of
    it but the --prepare source; else what the new files replace), then each entry is renamed in
    (same filesystem: no copy), the stage removed."""
    names = {p.name for p in stage.iterdir()}
    source = Path(source).resolve()
    for p in list(data.iterdir()):
        if (overwrite or p.name in names) and not (source == p.resolve() or p.resolve() in source.parents):
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    for p in list(stage.iterdir()):
        os.replace(p, data / p.name)
    stage.rmdir()


def prepare_cmd(a, info, url):
    argv = [sys.executable, "-m", "speculators", "prepare-data", "--model", a.verifier,
            "--data", a.prepare, "--output", str(beside(a.data_dir)), "--seq-length", str(a.seq_length),
            "--no-skip-token-freq"]
    if info["trust_remote_code"]:
        argv += ["--trust-remote-code"]
    if info.get("needs_render_server", True):
        argv += ["--render-endpoint", url]
    return argv


def generate_cmd(a, url):
    argv = [sys.executable, "-m", "speculators", "generate-offline-data", "--endpoint", f"{url}/v1",
            "--model", a.verifier, "--preprocessed-data", str(a.data_dir), "--concurrency",
            str(a.concurrency), "--validate-outputs", "--fail-on-error"]
    if a.shard:
        i, n = a.shard.split("/")
        argv += ["--world-size", n, "--rank", i]
    return argv


def commands(a, info, port=PORT):
    """The argv of every process the run starts, in order (the plan shows them; execute runs
    exactly these). A --prepare file not uploaded yet (--prepare-later) counts as conversations."""
    url = f"http://127.0.0.1:{port}"
    out = []
    if needs_server(a, info):
        out.append(server_cmd(a, info, port))
    if a.prepare and not info.get("already_prepared"):
        out.append(prepare_cmd(a, info, url))
    if a.extract and a.backend == "vllm":
        out.append(generate_cmd(a, url))
    return out


def run_cmd(argv, env=None, keep=1 << 16):
    """Run argv, its output into this job's log as it comes; a failure is StepFailed with the
    program's own error line (`ValueError: ...`, `OSError: [Errno 28] No space left on device`)."""
    print(f"[specops] $ {' '.join(argv)}", flush=True)
    t0 = time.time()
    p = subprocess.Popen(argv, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    tail = b""
    while chunk := os.read(p.stdout.fileno(), 1 << 16):
        sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()
        tail = (tail + chunk)[-keep:]
    rc = p.wait()
    if rc != 0:
        why = first_error(tail.decode(errors="replace"))
        raise vllm_server.StepFailed(f"{' '.join(argv[2:4])} exited {rc}" + (f": {why}" if why else ""))
    return time.time() - t0


def execute(a, info):
    data = Path(a.data_dir)
    made = not data.exists()
    data.mkdir(parents=True, exist_ok=True)
    run_dir = Path(a.result).parent if a.result else data
    res = {"steps": []}
    stage = beside(data)
    preparing = a.prepare and not info.get("already_prepared")
    if preparing:
        shutil.rmtree(stage, ignore_errors=True)  # (an earlier run's, interrupted)
    if a.overwrite and preparing:
        print(f"[specops] --overwrite: the dataset is built beside {data} ({stage.name}) and replaces it at "
              f"the end", flush=True)
    elif a.overwrite and a.extract and (data / "hidden_states").is_dir():  # only the states go, first
        shutil.rmtree(data / "hidden_states")
        print(f"[specops] --overwrite: cleared {data}/hidden_states for the new run", flush=True)
    try:
        return run_steps(a, info, data, run_dir, res, stage)
    except BaseException:  # (nothing of a failed run blocks the next: no stage, no empty folder)
        if preparing:
            shutil.rmtree(stage, ignore_errors=True)
        shutil.rmtree(hs_stage(a), ignore_errors=True)  # (the server's staging; it is stopped)
        if made and data.is_dir() and not any(data.iterdir()):
            data.rmdir()
        raise
    finally:
        try:
            hs_stage(a).rmdir()  # (empty once the states are in hidden_states/)
        except OSError:
            pass


def run_steps(a, info, data, run_dir, res, stage):
    server = None
    url = None
    try:
        if needs_server(a, info):
            port = vllm_server.free_port()
            env = vllm_server.server_env(os.getcwd(), a.kind, a.tensor_parallel)
            hs_stage(a).mkdir(exist_ok=True)
            server = vllm_server.start(run_dir, server_cmd(a, info, port), env, port, a.server_timeout,
                                       name=server_name(a))
            url = f"http://127.0.0.1:{port}"
        if a.prepare:
            if info.get("already_prepared"):
                print(f"[specops] {data} already holds this file's dataset (same sha256 and seq length): "
                      f"prepare-data skipped", flush=True)
            else:
                res["prepare_seconds"] = round(run_cmd(prepare_cmd(a, info, url)), 1)
                publish(stage, data, a.overwrite, a.prepare)
                rec = read_record(data)
                rec["prepared_from"] = {"path": os.path.abspath(a.prepare), "sha256": info.get("prepare_sha256"),
                                        "seq_length": a.seq_length, "when": time.time()}
                contract.write_json(data / RECORD, rec)
            res["steps"].append("prepare")
        if a.extract:
            # now that the dataset exists: rows, budget (refuses if too big); the commands and the
            # server's arguments stay those of the plan (they are what ran)
            fresh = plan(a)
            info.update({k: v for k, v in fresh.items()
                         if k not in ("commands", "max_model_len", "already_prepared", "needs_render_server")})
            start, end = info["rows"]
            if a.backend == "vllm":
                secs = run_cmd(generate_cmd(a, url))
                res["extract"] = {"tokens": info["tokens"], "seconds": round(secs, 2),
                                  "tokens_per_s": round(info["tokens"] / secs, 1) if secs > 0 else None}
            else:
                from specops_host.data.hf_backend import hf_extract  # (transformers: only for this backend)

                res["extract"] = hf_extract(data, a.verifier, info["layer_ids"], start, end, a.kind,
                                            trust=info["trust_remote_code"], tensor_parallel=a.tensor_parallel)
            res["steps"].append("extract")
            rec_path = data / RECORD
            rec = read_record(data)
            rec.update(verifier=os.path.abspath(a.verifier), layer_ids=info["layer_ids"],
                       stored_layers=len(info["layer_ids"]), hidden_size=info["hidden_size"],
                       backend=a.backend, trust_remote_code=info["trust_remote_code"], updated=time.time())
            contract.write_json(rec_path, rec)  # (whole or not at all)
    finally:
        if server is not None:
            vllm_server.stop(server)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--verifier", default=None)
    ap.add_argument("--kind", choices=["cpu", "cuda"], required=True)
    ap.add_argument("--prepare", default=None, help="conversation/pre-tokenised .jsonl to prepare")
    ap.add_argument("--seq-length", type=int, default=2048)
    ap.add_argument("--extract", action="store_true")
    ap.add_argument("--backend", choices=["vllm", "hf"], default="vllm")
    ap.add_argument("--layers", default=None)
    ap.add_argument("--shard", default=None)
    ap.add_argument("--rows", default=None)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--max-model-len", type=int, default=None,
                    help="vLLM --max-model-len (default: the longest row + 1)")
    ap.add_argument("--tensor-parallel", type=int, default=1, help="GPUs one vLLM server spans")
    ap.add_argument("--trust-remote-code", default="auto", choices=vllm_server.TRUST_CHOICES,
                    help="run the verifier's own code (auto: when its config has auto_map)")
    ap.add_argument("--vllm-arg", action="append", default=[],
                    help="one more vLLM server argument, last (repeatable; --vllm-arg=--flag)")
    ap.add_argument("--server-timeout", type=float, default=900)
    ap.add_argument("--overwrite", action="store_true",
                    help="replace a dataset prepared from another file, or hidden states of other layer ids")
    ap.add_argument("--plan", action="store_true")
    ap.add_argument("--prepare-later", action="store_true",
                    help="with --plan: the --prepare file is not there yet (a dry run's upload)")
    ap.add_argument("--result", default=None)
    a = ap.parse_args()
    try:
        info = plan(a)
    except Refused as e:
        print(f"[specops] refused: {e}", flush=True)
        emit({"ok": False, "error": str(e), "refused": True})
        return 2
    if a.plan:
        emit({"ok": True, **info})
        return 0

    return vllm_server.server_job("datagen", a.kind, a.result, lambda: {**info, **execute(a, info)})


if __name__ == "__main__":
    contract.main(main)
