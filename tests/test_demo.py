"""`inv demo`: the README's main job, on the built-in `local` host (no SSH)."""

import re

import pytest
import yaml

from conftest import inv

pytestmark = [pytest.mark.heavy]


def test_demo_end_to_end(cpu_box, tmp_path):
    """The demo on `local`, with hosts.yaml pointing `local` at the test run's cpu venv (built
    once per run by the cpu_box fixture) and a fresh workdir: tiny verifier built on the fly,
    data, vLLM extraction, inspection, a short training run, fetched with checkpoint and plot."""
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({"hosts": {"local": {"venv": cpu_box["venv"], "workdir": str(tmp_path / "work")}}}))
    r = inv("demo", "--hosts", str(hosts), "--dest", str(tmp_path / "runs"), "--steps", "4")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    rid = re.search(r"pipeline done: run (\S+)", r.stdout).group(1)
    run = tmp_path / "runs" / rid
    assert (run / "metrics.png").is_file() and (run / "metrics.jsonl").stat().st_size > 0
    assert any(p.name.isdigit() for p in (run / "checkpoints").iterdir())
    assert "profile cpu unchanged" in r.stdout
