"""The benchmark scripts a GPU session runs (bench/gpu/, bench/h200/): a mistake in one costs device minutes, found
only on the device. Here, on the CPU: every script parses (`bash -n`), and bench/gpu/bakeoff.sh's bake-off line,
said (INV=echo: nothing run) for a narrowed DRAFTS, carries only flags `inv bakeoff` takes for those kinds (on
2026-12-07 its default --num-spec-tokens named peagle in a run of eagle3 and dflash: refused after 3 minutes of
setup on an H100)."""

import shlex
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("script", sorted(str(p.relative_to(REPO)) for p in (REPO / "bench").rglob("*.sh")))
def test_every_bench_script_parses(script):
    r = subprocess.run(["bash", "-n", script], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("drafts,tune", [("eagle3,dflash", None), ("eagle3,dflash,peagle", None),
                                         ("dflash,peagle", ""), ("eagle3,peagle", "eagle3:3,peagle:5,dflash:6")])
def test_the_bakeoff_scripts_line_names_only_its_kinds(tmp_path, drafts, tune):
    from specops.ops import bakeoff

    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "INV": "echo", "B": str(tmp_path / "b"), "SIZE": "1b",
           "SIZE_FILE": str(tmp_path / "none"), "DRAFTS": drafts, **({} if tune is None else {"TUNE": tune})}
    r = subprocess.run(["bash", "bench/gpu/bakeoff.sh", "all", "bake"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "== bake: rc=0" in r.stdout, r.stdout + r.stderr
    line = next(x for x in (tmp_path / "b" / "bake.log").read_text().splitlines() if x.startswith("bakeoff "))
    argv = shlex.split(line)
    flag = {a: argv[i + 1] for i, a in enumerate(argv[:-1]) if a.startswith("--")}
    kinds = bakeoff.parse_drafts(flag["--drafts"])
    assert kinds == drafts.split(",")
    ks = bakeoff.per_kind(flag["--num-spec-tokens"], kinds, "--num-spec-tokens", many=False)  # (else: Refused)
    from specops_host.serve.speedup import requests_given  # (requests per level: only the levels timed, else Refused)

    assert requests_given(flag["--speedup-requests"], [1, 16]) == {1: 16, 16: 64} and flag["--speedup"] == "1,16"
    assert sorted(ks) == sorted(kinds), ks
    if tune == "":
        assert "--tune-k" not in flag
    else:
        sweep = bakeoff.per_kind(flag["--tune-k"], kinds, "--tune-k", many=True)
        assert set(sweep) <= set(kinds) and sweep, sweep


@pytest.mark.parametrize("mode", [("all",), ("start", "5"), ("start", "5", "bake", "show")])
def test_the_bakeoff_script_refuses_a_bake_of_one_kind_before_any_stage(tmp_path, mode):
    """DRAFTS of one kind with the bake stage to run: refused in one line before setup (on 2026-12-07 an H100 ran
    setup, boot, prep and extract, 5 minutes, for `inv bakeoff` to refuse `--drafts peagle`), as `inv bakeoff`
    refuses it; stages without bake still run for that DRAFTS."""
    from specops.args import Refused
    from specops.ops import bakeoff

    with pytest.raises(Refused, match="two or more kinds"):
        bakeoff.parse_drafts("peagle")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "INV": "echo", "B": str(tmp_path / "b"), "SIZE": "1b",
           "SIZE_FILE": str(tmp_path / "none"), "DRAFTS": "peagle"}
    r = subprocess.run(["bash", "bench/gpu/bakeoff.sh", *mode], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and r.stderr.strip() == ("DRAFTS=peagle: a bake-off compares two or more kinds (such "
                                                      "as eagle3,peagle): name another, or leave out the bake stage")
    assert not (tmp_path / "b").exists() and r.stdout == ""
    r = subprocess.run(["bash", "bench/gpu/bakeoff.sh", "all", "show"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "== show: rc=0" in r.stdout, r.stdout + r.stderr
