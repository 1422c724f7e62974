"""Fill vLLM's model-info cache for the architectures a run will serve, before its servers start.

Launch (what `inv demo` starts as a job beside the learnable verifier's training, from the host
workdir):
    <venv>/bin/python3 -m specops_host.serve.vllm_warm --kind cpu \
        --archs LlamaForCausalLM,ExtractHiddenStatesModel,Eagle3LlamaForCausalLM [--result FILE]

A vLLM server that meets an architecture for the first time inspects its model class in a
subprocess (one more interpreter importing torch and vLLM: 13-14 s each at load 3 on 2 cores)
and keeps what it found in VLLM_CACHE_ROOT/modelinfos/ (keyed by the hash of the model's
module); later starts read that file. A fresh demo's data server did two of them (the verifier's
architecture and the extraction's), its first evaluation server a third (the EAGLE-3 draft's),
each in the middle of a server start. This script runs vLLM's own inspection (the registry's
entries: the same subprocess, the same cache file) in the workdir's cache (hostenv, as every
server), while the host has a core to spare. It is only a cache: a server whose architecture is
not there inspects it itself, as before.

Writes {"ok", "archs": [{"arch", "seconds"}], "failed": {arch: error}, "seconds"} to --result
(an architecture vLLM does not know, or whose inspection fails, is listed under failed).
"""

import argparse
import os
import time

from specops_host import contract
from specops_host import hostenv
from specops_host.contract import Refused, emit


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=["cpu", "cuda"], required=True)
    ap.add_argument("--archs", required=True, help="architectures, comma-separated (vLLM's registry names)")
    ap.add_argument("--result", default=None)
    a = ap.parse_args()
    archs = [x.strip() for x in a.archs.split(",") if x.strip()]
    if not archs:
        raise Refused("--archs: give one or more architecture names, e.g. LlamaForCausalLM")
    hostenv.apply(os.getcwd(), a.kind)
    t0 = time.time()
    from vllm.model_executor.models.registry import ModelRegistry

    done, failed = [], {}
    for arch in archs:
        entry = ModelRegistry.models.get(arch)
        if entry is None:
            failed[arch] = "not in vLLM's model registry"
            continue
        t1 = time.time()
        try:
            entry.inspect_model_cls()
        except Exception as e:  # noqa: BLE001 - a cache: the server inspects it itself
            failed[arch] = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"[:300]
            continue
        done.append({"arch": arch, "seconds": round(time.time() - t1, 1)})
        print(f"[specops] vLLM model info of {arch}: cached ({done[-1]['seconds']} s)", flush=True)
    res = {"ok": not failed, "archs": done, "failed": failed, "seconds": round(time.time() - t0, 1)}
    if failed:
        res["error"] = "; ".join(f"{k}: {v}" for k, v in failed.items())
    if a.result:
        contract.write_json(a.result, res)
    else:
        emit(res)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    contract.main(main)
