"""`inv synthesize` (issue 46 item 2): conversations the verifier writes itself (Magpie's method). The pure
parts here, in the fast layer: the filters, the sampling, the plan's refusals, the seed prompts read, the
flags refused before anything connects (the exact commands: test_ops_commands.py). The real runs over the
loopback sshd are in test_real.py, on SmolLM2 (converted once there for the must-show that trains on its
rows): rows written, taken by prepare-data as they are, the filters counted, the same seed the same rows,
seeded by a user's prompts, a verifier without a chat template refused."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import inv
from specops_host.contract import Refused
from specops_host.data import synth_filters as filters, synthesize as host_synth

FAST = ["--enforce-eager"]


# -- the pure parts ------------------------------------------------------------------------------

def test_filters_see_loops_refusals_and_duplicates():
    loop = "the cat sat on the mat. " * 10
    assert filters.looping(loop) and filters.judge_answer(loop, "length") == "looping"
    prose = ("Speculative decoding lets a small draft model propose several tokens that the large model then checks "
             "in one forward pass, so the output is unchanged while the wall time falls when the draft is right.")
    assert not filters.looping(prose) and filters.judge_answer(prose, "stop") is None
    assert filters.judge_answer(prose, "length") == "answer_cut"
    assert filters.judge_question("What is a draft model?", "length") == "question_cut"
    assert filters.looping("猫が好きです。" * 12)  # (no spaces: character n-grams)
    assert not filters.looping("moss cloud rain wind leaf root")  # (too short to say)
    for r in ("I'm sorry, but I can't help with that.", "As an AI language model, I cannot", "  I cannot do that"):
        assert filters.refusal(r) and filters.judge_answer(r, "stop") == "refusal", r
    assert not filters.refusal("Sorrow is a feeling of deep distress.")
    assert filters.judge_answer("  ", "stop") == filters.judge_question("", "stop") == "empty"
    assert host_synth.normal("What is  a Draft?") == host_synth.normal("what is a draft") != host_synth.normal("why")
    assert filters.seed_of(0, 1) == filters.seed_of(0, 1) != filters.seed_of(1, 1)
    assert 0 <= filters.seed_of(7, 10**6) < 2**31


def test_sampling_is_said_and_greedy_questions_are_refused(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_p": 0.9, "do_sample": True}))
    s = host_synth.sampling
    assert s("--q", "1.0", tmp_path, "questions") == ({"temperature": 1.0, "top_p": 1.0},
                                                      "questions: temperature 1, top_p 1 (Magpie's)")
    assert s("--a", "0", tmp_path, "answers") == ({"temperature": 0.0}, "answers: greedy (temperature 0)")
    assert s("--a", "config", tmp_path, "answers") == (
        {"temperature": 0.6, "top_p": 0.9}, "answers: the verifier's generation config (temperature 0.6, top_p 0.9)")
    with pytest.raises(Refused, match="greedy questions are all one"):
        s("--question-temperature", "0", tmp_path, "questions")
    with pytest.raises(Refused, match="give a temperature from 0"):
        s("--answer-temperature", "hot", tmp_path, "answers")
    (tmp_path / "generation_config.json").write_text(json.dumps({"bos_token_id": 1}))  # (no sampling in it)
    assert s("--a", "config", tmp_path, "answers")[0] == {"temperature": 0.0}
    with pytest.raises(Refused, match=r"samples nothing .* --question-temperature 1.0"):
        s("--question-temperature", "config", tmp_path, "questions")


def plan_args(tmp_path, **over):
    return SimpleNamespace(**{"verifier": str(tmp_path), "rows": 8, "question_tokens": 16, "max_tokens": 32,
                              "concurrency": 4, "servers": 1, "tensor_parallel": 1, "attempts": None, "max_model_len": None,
                              "vllm_arg": [], "out": str(tmp_path / "o.jsonl"), "overwrite": False,
                              "question_temperature": "1.0", "answer_temperature": "0", "seed": 0,
                              "trust_remote_code": "auto", "topics": None, "topics_later": False, "kind": "cpu",
                              "seed_prompts": None, "seed_prompts_later": False,
                              **over})


def test_plan_refuses_a_model_without_a_chat_template_before_anything_starts(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8, "num_hidden_layers": 2}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    with pytest.raises(Refused, match=r"its tokenizer has no chat template .*give a chat \(instruct\) model"):
        host_synth.plan(plan_args(tmp_path))
    with pytest.raises(Refused, match="--rows 0: give 1 or more"):
        host_synth.plan(plan_args(tmp_path, rows=0))
    with pytest.raises(Refused, match="--servers 0: give 1 or more"):
        host_synth.plan(plan_args(tmp_path, servers=0))
    with pytest.raises(Refused, match=r"--servers 5: more servers than requests in flight \(--concurrency 4\): give "
                                      r"--concurrency 5 or more"):
        host_synth.plan(plan_args(tmp_path, servers=5))
    with pytest.raises(Refused, match="no config.json there"):
        host_synth.plan(plan_args(tmp_path / "nothing"))
    with pytest.raises(Refused, match="must fit with the template"):
        host_synth.plan(plan_args(tmp_path, max_model_len=40))
    (tmp_path / "chat_template.jinja").write_text("{{ messages }}")
    (tmp_path / "o.jsonl").write_text("")
    with pytest.raises(Refused, match="exists: pick another --out name, or --overwrite"):
        host_synth.plan(plan_args(tmp_path))
    (tmp_path / "topics.txt").write_text("\n \n")
    with pytest.raises(Refused, match="no topic in it"):
        host_synth.read_topics(tmp_path / "topics.txt")


def test_seed_prompts_are_read_as_evaluates_prompts_conversations_or_text(tmp_path):
    rows = [{"prompt": "How do tides work?", "category": "stem"}, {"question_id": 81, "category": "writing",
            "turns": ["Write a haiku about rain.", "Again."]},
            {"conversations": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Sort a list "},
                               {"role": "assistant", "content": "sorted(x)"}]}]
    (tmp_path / "seeds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    assert host_synth.read_seed_prompts(tmp_path / "seeds.jsonl") == [
        {"prompt": "How do tides work?", "line": 1, "category": "stem"},
        {"prompt": "Write a haiku about rain.", "line": 2, "category": "writing"},
        {"prompt": "Sort a list", "line": 3}]
    (tmp_path / "seeds.txt").write_text("What is a prime?\n\n  Name three rivers.\n")
    assert host_synth.read_seed_prompts(tmp_path / "seeds.txt") == [{"prompt": "What is a prime?", "line": 1},
                                                                    {"prompt": "Name three rivers.", "line": 3}]
    args = SimpleNamespace(topics=None, seed_prompts=str(tmp_path / "seeds.txt"))
    assert host_synth.steers(args) == [host_synth.SEED.format(prompt="What is a prime?"),
                                       host_synth.SEED.format(prompt="Name three rivers.")]
    for text, why in (('{"prompt": "a"}\nnot json\n', "line 2 is not JSON"),
                      ('{"prompt": [1, 2]}\n', "line 1 holds no prompt text"),
                      ('{"prompt": "a", "category": 3}\n', 'line 1: "category" is a JSON int'), ("\n \n", "no prompt")):
        (tmp_path / "bad.jsonl").write_text(text)
        with pytest.raises(Refused) as e:
            host_synth.read_seed_prompts(tmp_path / "bad.jsonl")
        assert str(e.value).startswith(f"--seed-prompts {tmp_path / 'bad.jsonl'}: ") and why in str(e.value), e.value
    with pytest.raises(Refused, match="no such file on this host"):
        host_synth.read_seed_prompts(tmp_path / "nothing.jsonl")
    with pytest.raises(Refused, match="--topics and --seed-prompts both steer the questions"):
        host_synth.plan(plan_args(tmp_path, topics="t.txt", seed_prompts="s.txt"))


@pytest.mark.parametrize("flags, said", [
    (["--rows", "0"], "--rows 0: give how many conversations to write, 1 or more"),
    ([], "synthesize needs --rows N"),
    (["--rows", "4", "--answer-temperature", "warm"], "--answer-temperature 'warm': give a temperature from 0"),
    (["--rows", "4", "--topics", "t.txt", "--seed-prompts", "s.jsonl"], "--topics and --seed-prompts both steer"),
])
def test_bad_flags_are_one_line_before_anything_connects(flags, said):
    r = inv("synthesize", "--host", "nowhere-at-all", *flags)
    assert r.returncode != 0 and said in r.stderr + r.stdout, r.stderr + r.stdout
    assert "Traceback" not in r.stderr and "nowhere-at-all" not in r.stderr + r.stdout


def _synth(rows, concurrency, attempts, replies, delay):
    """A Synth whose requests are answered by replies(i, what) after delay(i) seconds, in threads (the
    order they come back is not the order they went): the scheduling alone, the real server's runs are
    in test_real.py."""
    import threading
    import time as _t

    s = host_synth.Synth.__new__(host_synth.Synth)
    s.a = SimpleNamespace(rows=rows, concurrency=concurrency, seed=0)
    s.info = {"attempts": attempts}
    s.topics = s.seeds = None
    s.rows, s.good, s.good0, s.tried, s.first_error, s.done, s.progress = [], 0, 0, 0, None, {}, None
    s.drops = dict.fromkeys(host_synth.DROPS, 0)
    s.t0 = _t.time()
    s.clock = host_synth.contract.Every()
    lock, live = threading.Lock(), {"now": 0, "most": 0}

    def reply(i, what):
        with lock:
            live["now"] += 1
            live["most"] = max(live["most"], live["now"])
        _t.sleep(delay(i))
        with lock:
            live["now"] -= 1
        return replies(i, what)

    s.ask = lambda i: reply(i, "q")
    s.answer = lambda i, q: reply(i, "a")
    return s, live


def test_candidates_flow_concurrency_at_a_time_and_rows_come_in_candidate_order():
    # candidate i: every 3rd an answer that loops, every 5th (from 10) repeats candidate i-1's question;
    # the later a candidate the sooner its replies come back (the reverse of the order they went)
    def replies(i, what):
        if what == "q":
            return (f"question {i - 1 if i % 5 == 0 and i >= 10 else i}?", "stop")
        return ("yes " * 40 if i % 3 == 0 else f"An answer to question {i} that is plainly fine.", "stop")

    rows = []
    for conc, delay in ((4, lambda i: 0.02 * (1 + (97 - i) % 7)), (16, lambda i: 0.001 * (i % 5))):
        s, live = _synth(20, conc, 200, replies, delay)
        s.run()
        assert live["most"] <= conc and (conc == 4 or live["most"] > 4)
        assert len(s.rows) == 20 and s.tried < 60, (len(s.rows), s.tried)
        ids = [int(r["id"].rsplit("-", 1)[1]) for r in s.rows]
        assert ids == sorted(ids) and not any(i % 3 == 0 or (i % 5 == 0 and i >= 10) for i in ids), ids
        assert s.drops["looping"] > 0 and s.drops["duplicate"] > 0
        rows.append(s.rows)
    assert rows[0] == rows[1]  # (the same candidates, the same rows, however they came back)


def test_attempts_spent_leaves_the_rows_kept_and_the_drops_counted():
    s, _ = _synth(50, 8, 30, lambda i, what: ("q?", "stop") if what == "q" else ("no " * 40, "stop"),
                  lambda i: 0.0)
    s.run()
    assert s.tried == 30 and s.rows == [] and s.drops["duplicate"] == 29 and s.drops["looping"] == 1


def test_a_verifier_that_keeps_few_candidates_gets_more_in_flight_than_the_rows_wanted():
    # 1 candidate in 4 kept: once a few are back, about 4 go for each row still wanted, up to --concurrency
    s, live = _synth(6, 16, 400, lambda i, what: (f"q{i}?", "stop") if what == "q" else (
        f"A fine answer to question {i}, said plainly." if i % 4 == 1 else "no " * 40, "stop"), lambda i: 0.05)
    s.run()
    assert [r["id"] for r in s.rows] == [f"synth-0-{i}" for i in (1, 5, 9, 13, 17, 21)]
    assert live["most"] > 6, live


def test_candidates_spread_over_the_servers_and_a_dead_one_ends_the_run(tmp_path, monkeypatch):
    """--servers N: candidate i's question and answer both go to server i mod N (its own seed there, as with one);
    any server's end is the run's end (one line naming it)."""
    s = host_synth.Synth.__new__(host_synth.Synth)
    s.a = SimpleNamespace(request_timeout=5, seed=0, question_tokens=8, max_tokens=8)
    s.info = {"verifier": "/m/v", "question_sampling": {}, "answer_sampling": {}}
    s.urls, s.prefix, s.first_error = ["http://a:1", "http://b:2", "http://c:3"], ["p"], None
    s.server_dirs = [tmp_path / "server", tmp_path / "server-1", tmp_path / "server-2"]
    seen = []
    monkeypatch.setattr(host_synth, "post", lambda url, body, timeout: seen.append(url) or ("fine", "stop"))
    for i in range(4):
        s.ask(i)
        s.answer(i, "q?")
    assert seen == ["http://a:1/v1/completions", "http://a:1/v1/chat/completions",
                    "http://b:2/v1/completions", "http://b:2/v1/chat/completions",
                    "http://c:3/v1/completions", "http://c:3/v1/chat/completions",
                    "http://a:1/v1/completions", "http://a:1/v1/chat/completions"]
    states = {"server": "running", "server-1": "failed", "server-2": "running"}
    monkeypatch.setattr(host_synth, "job_state", lambda d: {"state": states[Path(d).name]})
    monkeypatch.setattr(host_synth.vllm_server, "died_line", lambda what, d: f"{what}: {Path(d).name}")
    with pytest.raises(host_synth.vllm_server.ServerDied, match=r"the vLLM server exited \(failed\) during "
                                                                r"synthesis: server-1"):
        s.check_server()
