"""hosts.yaml's `scheduler: slurm` hosts: fields, defaults and the one-line refusals (no network)."""

import pytest

from specops import inventory
from specops.errors import SpecopsError

BASE = "hosts:\n  cluster:\n    address: login\n    scheduler: slurm\n    workdir: /shared/u/specops\n    venv: /shared/u/env\n"


def load_text(tmp_path, text):
    p = tmp_path / "hosts.yaml"
    p.write_text(text)
    return inventory.load(str(p))


def test_slurm_host_fields_and_defaults(tmp_path):
    inv = load_text(tmp_path, BASE + "    slurm:\n      partition: gpu\n      account: proj\n      qos: normal\n"
                    "      time: '1-02:03:04'\n      nodes: 2\n      gpus_per_node: 8\n      constraint: h100\n"
                    "      setup: ['module load cuda/12.4', 'export NCCL_DEBUG=WARN']\n")
    h = inv.get("cluster")
    assert h.is_slurm and h.slurm.partition == "gpu" and h.slurm.nodes == 2 and h.gpus == 8
    assert h.slurm.time_s == 86400 + 2 * 3600 + 3 * 60 + 4
    assert h.slurm.setup == ["module load cuda/12.4", "export NCCL_DEBUG=WARN"]
    bare = load_text(tmp_path, BASE).get("cluster")
    assert bare.slurm.partition is None and bare.slurm.nodes == 1 and bare.slurm.time is None and bare.gpus == 0
    assert not inventory.load("hosts.yaml").get("gpu1").is_slurm


@pytest.mark.parametrize("text, seconds", [("30", 1800), ("10:05", 605), ("04:00:00", 14400), ("2-12", 2 * 86400 + 43200),
                                           ("1-00:30", 86400 + 1800), ("UNLIMITED", None)])
def test_slurm_time_forms(text, seconds):
    assert inventory.slurm_seconds(text) == seconds


@pytest.mark.parametrize("extra, expect", [
    ("    slurm: {partition: gpu, colour: red}\n", "field 'slurm.colour': unknown field (allowed: partition, account"),
    ("    slurm: {time: '4h'}\n", "field 'slurm.time': '4h' is not a Slurm time limit"),
    ("    slurm: {time: UNLIMITED}\n", "field 'slurm.time'"),
    ("    slurm: {nodes: 0}\n", "field 'slurm.nodes'"),
    ("    slurm: {partition: 'a b'}\n", "field 'slurm.partition': 'a b': give one word"),
    ("    slurm: {setup: ['']}\n", "field 'slurm.setup': every setup entry is one non-empty shell line"),
    ("    slurm: {gpus_per_node: 4}\n    gpus: 8\n", "field 'gpus': 8 differs from slurm.gpus_per_node (4)"),
    ("    scheduler: pbs\n", "field 'scheduler'"),
])
def test_bad_slurm_fields_one_line(tmp_path, extra, expect):
    text = BASE.replace("    scheduler: slurm\n", "    scheduler: slurm\n" if "scheduler:" not in extra else "") + extra
    with pytest.raises(SpecopsError) as e:
        load_text(tmp_path, text)
    assert expect in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_slurm_needs_scheduler_and_shared_paths(tmp_path):
    with pytest.raises(SpecopsError, match="field 'slurm': only for a cluster's login node: add `scheduler: slurm`"):
        load_text(tmp_path, "hosts:\n  g: {address: h, slurm: {partition: gpu}}\n")
    with pytest.raises(SpecopsError, match="field 'workdir': a slurm host needs `workdir:` and `venv:`"):
        load_text(tmp_path, "hosts:\n  c: {address: h, scheduler: slurm, venv: /shared/env}\n")
    with pytest.raises(SpecopsError, match="field 'venv': a slurm host needs"):
        load_text(tmp_path, "hosts:\n  c: {address: h, scheduler: slurm, workdir: /shared/w}\n")
