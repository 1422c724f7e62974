"""Every number checked, no traceback; the host never a guess (issue 24, items 8 and 11). Through the
real CLI: each refusal comes before anything connects, so no sshd and no venv are needed."""

import inspect
import socket

import pytest

from conftest import inv
from specops import args, inventory
from specops.config import load_config
from specops.host.connection import connect
from specops.errors import SpecopsError

R = ["--run-id", "r1"]
BAD_FLAGS = [
    ("stop", [*R, "--grace", "abc"]), ("stop", [*R, "--grace", "-5"]), ("stop", [*R, "--grace", "nan"]),
    ("inspect-data", ["--sample", "many"]), ("inspect-data", ["--sample", "-1"]), ("inspect-data", ["--layers", "0"]),
    ("fetch", ["--streams", "abc"]), ("fetch", ["--streams", "0"]), ("fetch", ["--bwlimit", "-1"]),
    ("train", ["--epochs", "abc"]), ("train", ["--epochs", "0"]), ("train", ["--nproc", "0"]),
    ("train", ["--max-steps", "-1"]), ("train", ["--max-steps", "2.5"]), ("train", ["--rdzv-port", "70000"]),
    ("train", ["--disk-budget", "0"]), ("extract", ["--concurrency", "0"]), ("extract", ["--max-model-len", "x"]),
    ("evaluate", [*R, "--num-spec-tokens", "0"]), ("evaluate", [*R, "--max-prompts", "0"]),
    ("evaluate", [*R, "--max-tokens", "many"]), ("regenerate", ["--data", "x", "--limit", "0"]),
    ("prepare-data", ["--data", "x", "--seq-length", "-5"]), ("pipeline", ["--data", "x", "--seq-length", "abc"]),
    ("check", ["--min-free-gb", "x"]), ("check", ["--steps", "0"]), ("check", ["--timeout", "-1"]),
    ("make-verifier", ["--seconds", "0"]), ("make-verifier", ["--hidden", "abc"]), ("make-verifier", ["--layers", "0"]),
    ("demo", ["--steps", "0"]), ("dist-check", ["--nproc", "0"]), ("logs", ["--rank", "-1"]),
    ("train", ["--nodes", "abc"]), ("dist-check", ["--nodes", "0"]),
    ("evaluate", [*R, "--speedup-requests", "many"]), ("evaluate", [*R, "--speedup-requests", "16:0"]),
    ("bakeoff", ["--speedup-requests", "0"]),
]


def refused(r, code=2):
    assert r.returncode == code, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specops: "), r.stderr
    return lines[0]


@pytest.mark.parametrize("task,argv", BAD_FLAGS, ids=[f"{t} {' '.join(a[-2:])}" for t, a in BAD_FLAGS])
def test_a_bad_number_is_one_line_exit_2(task, argv):
    """An unknown host: the flag is refused before the inventory is even looked at."""
    line = refused(inv(task, "--host", "no-such-host", *argv))
    flag, value = argv[-2:]
    assert line.startswith(f"specops: {flag} {value}: give ") and "(e.g. " in line, line


def test_every_numeric_flag_is_checked():
    """Each task parameter with a numeric default (and the None-defaulted numeric ones) is in args.FLAGS."""
    import tasks

    for t in tasks.ns.tasks.values():
        for name, p in inspect.signature(t.body).parameters.items():
            d = p.default
            if isinstance(d, (int, float)) and not isinstance(d, bool):
                assert name in {**args.FLAGS, **args.TASK_FLAGS.get(t.body.__name__, {})}, (t.name, name)
    none_default = {"streams", "epochs", "nproc", "max_steps", "limit", "max_model_len", "seconds", "disk_budget"}
    assert none_default <= set(args.FLAGS)


def test_good_numbers_pass():
    assert args.flags("stop", {"grace": "0", "host": None}) == {"grace": 0.0, "host": None}
    assert args.flags("fetch", {"streams": "8", "bwlimit": 0}) == {"streams": 8, "bwlimit": 0}
    assert args.flags("extract", {"layers": "2,30,58,61"}) == {"layers": "2,30,58,61"}  # (not a number there)
    assert args.flags("inspect_data", {"layers": "4"}) == {"layers": 4}


@pytest.mark.parametrize("value", ["", " ", ","])
def test_an_empty_host_is_refused_not_guessed(value):
    line = refused(inv("status", "--host", value))
    assert "no host given" in line and "--host NAME" in line
    line = refused(inv("wheelhouse", "--profile", "cpu", "--host", value))
    assert "no host given" in line


def test_an_empty_hosts_file_flag_or_variable_is_refused(monkeypatch):
    from invoke.exceptions import Exit

    from specops.cli import host_name

    assert "no inventory file given" in refused(inv("hosts", "--hosts", ""))
    assert "$SPECOPS_HOSTS is set but empty" in refused(inv("hosts", env={"SPECOPS_HOSTS": ""}))
    monkeypatch.setenv("SPECOPS_HOST", "")  # (conftest's inv() drops SPECOPS_HOST)
    with pytest.raises(Exit, match=r"\$SPECOPS_HOST is set but empty") as e:
        host_name(None, None)
    assert e.value.code == 2


@pytest.mark.parametrize("name,text,want", [
    ("latin1", b"hosts:\n  g:\n    address: h\n    user: r\xe9\n", "not UTF-8 text (byte 0xe9 at line 4)"),
    ("jump", b"hosts:\n  g:\n    address: h\n    proxy_jump: root@h:notaport\n", "port 'notaport' is not a port"),
    ("jump2", b"hosts:\n  g:\n    address: h\n    proxy_jump: a@b,c@d\n", "one jump host"),
    ("jump6", b"hosts:\n  g:\n    address: h\n    proxy_jump: root@fe80::1:22\n", "in brackets"),
    ("gpus", b"hosts:\n  g:\n    address: h\n    gpus: 99999999999999999999999\n", "less than or equal to 1024"),
])
def test_bad_hosts_files_are_one_line(tmp_path, name, text, want):
    f = tmp_path / f"{name}.yaml"
    f.write_bytes(text)
    assert want in refused(inv("hosts", "--hosts", str(f)), code=1)


def test_a_directory_as_hosts_file_or_known_hosts(tmp_path):
    assert "is a directory" in refused(inv("hosts", "--hosts", str(tmp_path)), code=1)
    kh = tmp_path / "kh"
    kh.mkdir()
    f = tmp_path / "h.yaml"
    f.write_text(f"hosts:\n  g:\n    address: 127.0.0.1\n    port: 1\n    known_hosts: {kh}\n")
    assert f"known_hosts {kh} is a directory" in refused(inv("status", "--host", "g", "--hosts", str(f)), code=1)


def test_a_good_jump_parses():
    assert inventory.parse_jump("bastion", "me") == ("me", "bastion", 22)
    assert inventory.parse_jump("u@[::1]:2222", "me") == ("u", "::1", 2222)


def test_a_jump_host_failure_names_the_jump_host(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    h = inventory.Host(name="t", address="10.255.255.1", proxy_jump=f"hop@127.0.0.1:{port}",
                       known_hosts=str(tmp_path / "kh"), connect_timeout=2)
    with pytest.raises(SpecopsError) as e:
        connect(h)
    assert f"nothing listening at 127.0.0.1:{port} (jump host hop@127.0.0.1:{port} (proxy_jump of t))" in str(e.value)
    assert "10.255.255.1" not in str(e.value)


@pytest.mark.parametrize("text,want", [
    ('train:\n  epochs: "many"\n', "train: epochs: 'many': give how many epochs to train, 1 or more"),
    ("train:\n  epochs: 0\n", "train: epochs: 0: give"),
    ("train:\n  epochs: true\n", "train: epochs: True: give"),
    ("train:\n  total_seq_len: 512\n", "key 'total_seq_len' is not a speculators train flag name: write it as "
                                       "'total-seq-len'"),
    ("train:\n  --lr: 0.1\n", "write it as 'lr'"),
    ("train:\n  lr: {a: 1}\n", "lr: {'a': 1}: give a value"),
    ("train:\n  epochs: 2\nprofiles:\n  cpu:\n    lr: fast\n", "profiles.cpu: lr: 'fast': give a learning rate"),
    ("train:\n  epochs: 2\nprofiles: [cpu]\n", "profiles: must be a mapping"),
])
def test_config_keys_and_types_checked_when_loaded(tmp_path, text, want):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(SpecopsError, match=None) as e:
        load_config(str(f), "cpu", {})
    assert want in str(e.value), str(e.value)


def test_config_strings_that_are_numbers_pass(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("train:\n  lr: 1e-3\n  epochs: 2\n  logger: tensorboard\n  deterministic-cuda: true\n")
    assert load_config(str(f), "cpu", {})["flags"]["lr"] == "1e-3"  # (YAML 1.1 reads 1e-3 as a string)


def test_a_bad_config_is_shown_by_a_dry_run(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text('train:\n  epochs: "many"\n')
    line = refused(inv("train", "--dry-run", "--config", str(f)), code=1)
    assert "epochs: 'many'" in line
