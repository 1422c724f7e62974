"""Write an exact profile for an existing venv (a preinstalled torch) from its freeze.

    .venv/bin/python bootstrap/existing_profile.py --freeze bench/h200/h200-freeze.txt \
        --name cuda-torch2.11 --family cuda > bootstrap/profiles/cuda-torch2.11.txt

What it does: pip resolves the roots (vLLM of the release built for the venv's torch, speculators,
hs-connectors) for the venv's Python and platform with every package of the freeze pinned to its
version, except the KEEP packages (vLLM pins them to versions that the venv's other packages
cannot have: pip's resolver cannot produce any set against the freeze with them pinned). Of pip's
answer the profile lists what the venv lacks, less the OMIT packages (optional kernels vLLM
declares but the stages specops runs never import) and what only they need. The venv keeps its
own version of every KEEP package; `inv bootstrap` (remote/specops_host/install/profile.py) accepts exactly
the `pip check` lines about them and about the omitted packages, and no other.

Each KEEP and OMIT entry is written into the profile with what it costs (`#@ keep:` / `#@ omit:`
lines), so the file says everything that differs from what vLLM asks for.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specops import profiles  # noqa: E402
from specops.ops import wheelhouse as wh  # noqa: E402

# name -> why the venv's own version is kept over the one vLLM pins (checked against vLLM 0.26.0's
# Requires-Dist and the H200 venv's freeze, 2026-12-01)
KEEP = {
    "numpy": "mistral-common (a vLLM dependency) caps numpy<2.4 on Python 3.12 and vLLM's numba pin needs "
             "numpy<2.5; the venv's numpy 2.5 is kept (torch and every other package there were built on it)",
    "numba": "vLLM pins numba==0.65.0 (numpy<2.5); the venv's numba is kept: vLLM imports numba only for "
             "the n-gram speculative proposer and two vision processors, which EAGLE-3 serving does not use",
    "llvmlite": "follows the venv's numba",
    "protobuf": "the venv's protobuf 7 is kept; only nvidia-cutlass-dsl (omitted below) needs protobuf<7",
    "setuptools": "vLLM caps setuptools<81 (its build); the venv's is kept: vLLM's code imports neither "
                  "setuptools nor pkg_resources",
}
# name -> what leaving it out disables (each checked in vLLM 0.26.0's sources: the modules that import it)
OMIT = {
    "nvidia-cutlass-dsl": "CuTe-DSL kernels (vllm/cute_utils, CuTe paths of some attention, linear and MLA "
                          "kernels, chiefly for Blackwell); Hopper serves with FlashAttention 3 without it. It "
                          "needs protobuf<7",
    "quack-kernels": "CuTe-DSL kernels (bf16 low-latency linear, mamba GDN, DeepSeek DSA indexer); needs cutlass-dsl",
    "humming-kernels": "the `humming` quantization method only",
    "tokenspeed-mla": "the TokenSpeed MLA attention backend only (vLLM picks another MLA backend without it)",
    "tilelang": "the tilelang kernels of DeepSeek-V4's mHC (a torch path remains)",
    "pynvvideocodec": "GPU video decoding of multimodal inputs",
    "torchcodec": "video decoding of multimodal inputs",
    "fastsafetensors": "`--load-format fastsafetensors` only",
}
# (gguf: `inv make-verifier --real smollm2` reads the GGUF with it; accelerate is in such a venv already)
ROOTS = {"2.11": ["vllm==0.26.0", "speculators==0.9.0", "hs-connectors==0.9.0", "gguf==0.19.0"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--freeze", required=True, help="the venv's `pip list --format=freeze`")
    ap.add_argument("--name", required=True, help="the profile's name (bootstrap/profiles/NAME.txt)")
    ap.add_argument("--family", default="cuda", help="the profile it stands in for on such a venv")
    ap.add_argument("--python", default="3.12")
    ap.add_argument("--platform", default="manylinux_2_35_x86_64")
    a = ap.parse_args()
    have = wh.read_have(a.freeze)
    torch = (have.get("torch") or "").split("+")[0]
    series = profiles.series(torch)
    if series not in ROOTS:
        raise SystemExit(f"--freeze {a.freeze}: torch {torch or 'absent'}; this script knows the roots for torch "
                         f"{', '.join(ROOTS)}")
    roots = ROOTS[series]
    tags = wh.expand_platform(a.platform)
    pip = wh.Pip(a.python, tags)
    keep = {wh.norm(n) for n in KEEP}
    from packaging.requirements import Requirement

    omit = {wh.norm(n) for n in OMIT}
    # the roots' own metadata, then their requirements less the kept and omitted ones, resolved
    # together (pip cannot leave out a dependency it is asked to resolve)
    own, err, out = pip.report(roots, deps=False)
    if own is None:
        raise SystemExit(f"pip cannot find {' '.join(roots)}: {err}")
    top = wh.Graph(pip.env).add(own)
    names = {wh.norm(Requirement(r).name) for r in roots}
    reqs = sorted({str(d) for n in names for d in top.deps(n)
                   if wh.norm(d.name) not in keep | omit | names} | set(roots))
    with tempfile.TemporaryDirectory() as d:
        cons = Path(d) / "c.txt"
        cons.write_text(wh.constraints_text({n: v for n, v in have.items() if n not in keep}))
        items, err, out = pip.report([r for r in reqs if wh.norm(Requirement(r).name) not in names],
                                     constraints=str(cons))
    if items is None:
        raise SystemExit(f"pip cannot resolve the requirements of {' '.join(roots)} against {a.freeze}: "
                         f"{wh.pip_reason(err, out, have)}")
    items = list(items) + list(own)
    graph = wh.Graph(pip.env).add(items)
    reach = graph.closure([Requirement(r) for r in roots], stop=omit)
    lacking = sorted(n for n in reach if n not in have and n not in omit)
    gone = sorted(n for n in graph.meta if n not in reach and n not in have and n not in omit)
    lines = [f"# specops profile: {a.name} -- an existing venv with torch {series} (CUDA), Python {a.python}",
             "#@ mode: exact", f"#@ family: {a.family}", f"#@ torch: {series}",
             f"# Written by bootstrap/existing_profile.py from {a.freeze} ({time.strftime('%Y-%m-%d')}):",
             f"# roots {', '.join(roots)}; pip resolved them for Python {a.python} ({a.platform})",
             "# with the venv's packages pinned (its torch, transformers, triton, ... are never replaced),",
             "# except the kept ones below. Listed: what such a venv lacks (installed --no-deps, nothing",
             "# resolved on the host).",
             "# `inv bootstrap` on a venv_existing host whose torch is not its profile's picks the profile",
             "# of that family whose `#@ torch:` matches it.",
             "# Kept at the venv's version against vLLM's pins (pip check lines about them are accepted):"]
    lines += [f"#@ keep: {n} -- {why}" for n, why in KEEP.items()]
    lines.append("# Left out (optional kernels and loaders none of specops' stages import):")
    lines += [f"#@ omit: {n} -- {why}" for n, why in OMIT.items()]
    if gone:
        lines.append(f"# Also left out, needed only by those: {', '.join(graph.meta[n]['name'] for n in gone)}")
    lines += [f"{graph.meta[n]['name']}=={graph.version(n)}" for n in lacking]
    print("\n".join(lines))
    print(f"{len(lacking)} packages listed, {len(gone)} left out with the omitted ones", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
