"""`inv regenerate`'s sampling, cap, progress and answer checks (remote/specops_host/data/answers.py),
as pure logic; the real run over sshd is tests/test_online.py's."""

import json
from argparse import Namespace

import pytest

from specops_host.contract import Refused
from specops_host.data import answers
from specops_host.data import regenerate as host_regen


def verifier(tmp_path, gen=None, positions=8192):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 100, "hidden_size": 8,
                                                      "num_hidden_layers": 2, "max_position_embeddings": positions}))
    if gen is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(gen))
    return str(tmp_path)


def test_sampling_is_greedy_without_a_generation_config_never_vllms_temperature_1(tmp_path):
    params, source = answers.choose_sampling(verifier(tmp_path))
    assert params == {"temperature": 0.0} and "no generation_config.json" in source
    line = answers.sampling_line(params, source)
    assert line == ("sampling: greedy (temperature 0) (greedy: the verifier has no generation_config.json; "
                    "--sampling-params sets another)")


def test_sampling_follows_the_verifiers_generation_config(tmp_path):
    v = verifier(tmp_path, {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "bos_token_id": 1})
    params, source = answers.choose_sampling(v)
    assert params == {"temperature": 0.6, "top_p": 0.9} and source == "the verifier's generation_config.json"
    assert answers.sampling_line(params, source).startswith("sampling: temperature 0.6, top_p 0.9 (the verifier's")
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": False, "temperature": 0.6}))
    assert answers.choose_sampling(v) == ({"temperature": 0.0},
                                          "greedy: the verifier's generation_config.json says do_sample false")
    (tmp_path / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    assert answers.choose_sampling(v)[0] == {"temperature": 0.0}
    assert answers.choose_sampling(v, '{"temperature": 1.0}') == ({"temperature": 1.0}, "--sampling-params")


def test_the_cap_comes_from_the_sequence_length_and_fits_the_model():
    assert answers.choose_cap(None, 2048, 8192) == (2048, "--seq-length 2048")
    assert answers.choose_cap(None, 2048, 2048) == (1024, "--seq-length 2048, halved to fit the model length 2048")
    assert answers.choose_cap(300, 2048, 8192) == (300, "--max-tokens")
    assert answers.choose_cap(None, 512, None) == (512, "--seq-length 512")


def plan_args(v, tmp_path, **kw):
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": "hi"}) + "\n")
    base = dict(data=str(data), out=str(tmp_path / "o.jsonl"), verifier=v, kind="cpu", seq_length=2048,
                max_tokens=None, concurrency=4, limit=None, sampling_params=None, max_retries=3, max_model_len=None,
                tensor_parallel=1, trust_remote_code="auto", vllm_arg=[], data_later=False)
    return Namespace(**{**base, **kw})


def test_every_request_carries_the_chosen_sampling_and_cap(tmp_path):
    """The plan's speculators command sends greedy and the --seq-length cap (today's request carried
    no sampling at all, and vLLM sampled at temperature 1.0 for a verifier without a generation config)."""
    (tmp_path / "v").mkdir()
    v = verifier(tmp_path / "v")
    info = host_regen.plan(plan_args(v, tmp_path))
    regen = info["commands"][1]
    assert regen[regen.index("--sampling-params") + 1] == '{"temperature": 0.0}'
    assert regen[regen.index("--max-tokens") + 1] == "2048" and info["max_tokens_from"] == "--seq-length 2048"
    assert info["sampling_line"].endswith("; answers capped at 2048 tokens (--seq-length 2048)")
    with pytest.raises(Refused, match=r"--seq-length 0: give 1 or more"):
        host_regen.plan(plan_args(v, tmp_path, seq_length=0))


def test_a_loop_is_a_repeating_tail():
    assert answers.looping([1, 2, 3, 4] * 20)
    assert answers.looping(list(range(40)) + [7, 8, 9] * 20)
    assert answers.looping([5] * 40)
    assert not answers.looping(list(range(200)))
    assert not answers.looping([1, 2] * 10)  # (too short to call)
    assert not answers.looping(list(range(60)) + [1, 2, 3] * 3)  # (a short repeat at the end: not half the answer)


def test_answers_read_as_the_file_grows_then_the_lines_say_it(tmp_path):
    out, errs = tmp_path / "r.jsonl", tmp_path / "r.errors.jsonl"
    ans = answers.Answers(out, errs)
    assert ans.read().done() == 0  # (no file yet)

    def row(i, answer, reason="stop"):
        return json.dumps({"primary_id": f"p{i}", "input_ids": [9, 9] + answer, "loss_mask": [0, 0] + [1] * len(answer),
                           "metadata": {"finish_reason": reason}}) + "\n"

    out.write_text(row(0, list(range(50))) + row(1, [4, 5, 6] * 20, "length")[:20])
    assert ans.read().done() == 1 and ans.cut == 0  # (half a line waits for its end)
    with open(out, "a") as f:
        f.write(row(1, [4, 5, 6] * 20, "length")[20:] + row(2, [1] * 40, "length"))
    errs.write_text(json.dumps({"id": "p3", "metadata": {"error": "x"}}) + "\n")
    assert ans.read().done() == 4 and (ans.rows, ans.cut, ans.looping) == (3, 2, 2)
    assert answers.quality_line(ans, 60).startswith("2 of 3 answers cut at the cap (60 tokens), 2 looping")
    assert answers.progress_line(4, 10, 2.0) == "regenerate: 4 of 10 prompts answered, 2.00/s, ETA 3s"
    assert answers.progress_line(10, 10, 125.0) == "regenerate: 10 of 10 prompts answered, 0.08/s, done in 2m 05s"
    assert answers.progress_line(0, None, 5.0) == "regenerate: 0 prompts answered, 0.00/s"
    clean = answers.Answers(tmp_path / "none", errs)
    assert answers.quality_line(clean, 60) is None
