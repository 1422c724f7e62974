"""Convert legacy speculators v0.3 data (rows_*/data_*.pt) to the speculators 0.9 layout.

Launch (what `inv convert-data` sends, from the host workdir):
    <venv>/bin/python3 -m specops_host.data.convert_data --src OLD_DIR --dst NEW_DIR

Each data_{i}.pt ({input_ids, hidden_states: list of [seq, hidden], loss_mask}) becomes
hidden_states/hs_{k}.safetensors (hidden_states bf16 [seq, n_layers, hidden], token_ids int64)
and row k of an Arrow dataset (input_ids, loss_mask, seq_len), k in (rows range, file index)
order. NEW_DIR must not exist or be an empty directory: nothing is overwritten. The result is
written into a temp dir next to NEW_DIR (.NAME.converting-PID) and renamed onto it at the end:
whole or nothing. A failed run removes its temp dir (one killed outright leaves it, and the
next run onto NEW_DIR removes it), so a re-run is never blocked. Bad input (a corrupt source
file, NEW_DIR a file or not empty) is refused with one line.
"""

import argparse
import json
import os
import re
import shutil
import time
from pathlib import Path

from specops_host.contract import Refused, emit
from specops_host.datafmt import RECORD, check_layer_ids

ROWS = re.compile(r"^rows_(\d+)")
DATA = re.compile(r"^data_(\d+)\.pt$")
TMP = ".converting-"  # DST's temp dir: .{DST name}.converting-{pid}, next to it


class Args(argparse.ArgumentParser):
    def error(self, message):  # argparse would print usage and exit 2 without a payload
        raise Refused(f"convert_data.py: {message} (arguments: --src OLD_DIR --dst NEW_DIR)")


def order(p):
    m, d = ROWS.match(p.parent.name), DATA.match(p.name)
    return (int(m.group(1)) if m else 0, int(d.group(1)) if d else 0)


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # (EPERM: someone else's process)
        return True
    return True


def clear_stale(dst):
    """Remove temp dirs of earlier runs onto dst that died (SIGKILL: no cleanup ran)."""
    prefix = f".{dst.name}{TMP}"
    try:
        entries = list(dst.parent.iterdir())
    except OSError:
        return
    for p in entries:
        if p.name.startswith(prefix) and p.is_dir() and not p.is_symlink():
            pid = p.name[len(prefix):]
            if pid.isdigit() and int(pid) != os.getpid() and not alive(int(pid)):
                shutil.rmtree(p, ignore_errors=True)


def check_dst(dst):
    """Refused unless dst can be created whole: a new path, or an empty directory."""
    if dst.is_symlink():
        raise Refused(f"--dst {dst} is a symbolic link: give a new directory path (nothing is overwritten)")
    if dst.exists() and not dst.is_dir():
        raise Refused(f"--dst {dst} is a file, not a directory: give a new directory path (nothing is overwritten)")
    if dst.is_dir():
        try:
            if any(dst.iterdir()):
                raise Refused(f"{dst} exists and is not empty: give a new --dst (nothing is overwritten)")
        except OSError as e:
            raise Refused(f"--dst {dst} cannot be read ({e.strerror or e}): give a new --dst") from None
    parent = dst.parent
    anc = parent
    while not anc.exists():
        anc = anc.parent
    if not anc.is_dir():
        raise Refused(f"--dst {dst}: {anc} is a file, not a directory: give a path under a directory")
    if not os.access(anc, os.W_OK | os.X_OK):
        raise Refused(f"--dst {dst}: {anc} is not writable by this user: give a path where you can write")


def convert(files, src, tmp):
    """Write the 0.9 layout of files into tmp; Refused (naming the file) on a file it cannot read."""
    import torch
    from datasets import Dataset
    from safetensors.torch import save_file

    (tmp / "hidden_states").mkdir(parents=True)
    cols = {"input_ids": [], "loss_mask": [], "seq_len": []}
    n_layers = None
    for k, p in enumerate(files):
        try:
            obj = torch.load(p, map_location="cpu", weights_only=True)
            ids = obj["input_ids"].reshape(-1).to(torch.int64)
            hs = obj["hidden_states"]
            hs = torch.stack(list(hs), dim=1) if isinstance(hs, (list, tuple)) else hs
            mask = obj["loss_mask"].reshape(-1).to(torch.int64)
            if not isinstance(hs, torch.Tensor) or hs.ndim != 3:
                raise ValueError(f"hidden_states is {type(hs).__name__} {list(getattr(hs, 'shape', []))}; "
                                 f"expected a list of [seq, hidden] tensors")
        except Exception as e:  # noqa: BLE001 - a corrupt source file: one line naming it
            msg = (str(e).strip().splitlines() or [""])[0][:200]
            raise Refused(f"{p}: cannot convert ({type(e).__name__}: {msg}) after {k} of {len(files)} file(s): "
                          f"fix or remove it, then run convert-data again (nothing was written)") from None
        if hs.shape[0] != ids.numel() or mask.numel() != ids.numel():
            raise Refused(f"{p}: lengths disagree (input_ids {ids.numel()}, hidden_states {list(hs.shape)}, "
                          f"loss_mask {mask.numel()}): fix or remove it, then run convert-data again "
                          f"(nothing was written)")
        if n_layers is not None and hs.shape[1] != n_layers:
            raise Refused(f"{p}: {hs.shape[1]} stored layers, the files before it {n_layers}: one layer count "
                          f"throughout is required (nothing was written)")
        n_layers = hs.shape[1]
        save_file({"hidden_states": hs.to(torch.bfloat16).contiguous(), "token_ids": ids.contiguous()},
                  str(tmp / "hidden_states" / f"hs_{k}.safetensors"))
        cols["input_ids"].append(ids.tolist())
        cols["loss_mask"].append(mask.tolist())
        cols["seq_len"].append(ids.numel())
    Dataset.from_dict(cols).save_to_disk(str(tmp))
    record = {"converted_from": str(src.resolve()), "format": "legacy-v0.3", "stored_layers": n_layers}
    cfg = src / "data_config.json"
    if cfg.is_file():
        try:
            legacy = json.loads(cfg.read_text())
        except (OSError, ValueError) as e:
            raise Refused(f"{cfg}: not valid JSON ({str(e).splitlines()[0]}): fix or remove it "
                          f"(nothing was written)") from None
        if not isinstance(legacy, dict):
            raise Refused(f"{cfg}: a JSON {type(legacy).__name__}; expected an object (nothing was written)")
        (tmp / "legacy_data_config.json").write_text(json.dumps(legacy, indent=1))
        for key in ("layer_ids", "eagle_aux_hidden_state_layer_ids"):
            v = legacy.get(key)
            if v is not None and check_layer_ids(v) is None:  # (ids inspect-data would refuse are left out)
                record["layer_ids"] = v
        for key in ("verifier", "model", "base_model", "verifier_name_or_path"):
            if isinstance(legacy.get(key), str) and legacy[key] and Path(legacy[key]).is_dir():
                record["verifier"] = legacy[key]
    (tmp / RECORD).write_text(json.dumps(record, indent=1))


def main(argv=None):
    ap = Args(prog="convert_data.py")
    ap.add_argument("--src", required=True)
    ap.add_argument("--dst", required=True)
    a = ap.parse_args(argv)
    if not a.src.strip() or not a.dst.strip():
        raise Refused("--src and --dst must not be empty: give the legacy data dir and a new directory")
    src, dst = Path(a.src), Path(os.path.abspath(a.dst))
    files = sorted(src.glob("rows_*/data_*.pt"), key=order)
    if not files:
        raise Refused(f"{src}: no rows_*/data_*.pt files: not a legacy v0.3 layout")
    check_dst(dst)
    if dst.resolve() == src.resolve() or src.resolve() in dst.resolve().parents:
        raise Refused(f"--dst {dst} lies inside --src {src}: give a directory outside it")

    t0 = time.time()
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise Refused(f"--dst {dst}: cannot create {dst.parent} ({e.strerror or e}): give another path") from None
    clear_stale(dst)
    tmp = dst.parent / f".{dst.name}{TMP}{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        convert(files, src, tmp)
        try:
            os.rename(tmp, dst)  # whole or nothing (an empty dst directory is replaced)
        except OSError as e:
            raise Refused(f"{dst} appeared while converting ({e.strerror or e}): give a new --dst "
                          f"(nothing is overwritten)") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    emit({"ok": True, "rows": len(files), "dst": str(dst), "seconds": round(time.time() - t0, 2)})
    return 0


if __name__ == "__main__":
    from specops_host import contract

    contract.main(main)
