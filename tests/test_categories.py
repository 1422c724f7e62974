"""evaluate's prompts by category (serve/categories.py): MT-Bench's and SPEED-Bench's question rows and
generic {"prompt", "category"} rows read as they are, a bad row refused in one line naming the file and
line, --max-prompts taking every category in turn, the shipped set's eight categories, the table."""

import json
from pathlib import Path

import pytest

from specops_host.contract import Refused
from specops_host.serve import categories
from specops_host.serve.counters import acceptance
from specops_host.serve.evaluate import file_prompts

REPO = Path(__file__).resolve().parents[1]
MT_BENCH = [  # (MT-Bench's question.jsonl rows, as published: question_id, category, turns)
    {"question_id": 81, "category": "writing", "turns": ["Write a travel blog post.", "Rewrite it in limericks."]},
    {"question_id": 82, "category": "writing", "turns": ["Draft a professional email."]},
    {"question_id": 101, "category": "reasoning", "turns": ["Who is in second place?", "And now?"]},
    {"question_id": 111, "category": "math", "turns": ["What is the area of the triangle?"]},
]


def write(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_mt_bench_rows_give_their_first_turn_and_category(tmp_path):
    prompts, source = file_prompts(write(tmp_path / "question.jsonl", MT_BENCH), 32)
    # (a user's turn: marked for the verifier's chat template, applied on the host: categories.chat())
    assert prompts == [{"prompt": "Write a travel blog post.", "category": "writing", "turn": True},
                       {"prompt": "Draft a professional email.", "category": "writing", "turn": True},
                       {"prompt": "Who is in second place?", "category": "reasoning", "turn": True},
                       {"prompt": "What is the area of the triangle?", "category": "math", "turn": True}]
    assert source == {"source": str(tmp_path / "question.jsonl")}
    # SPEED-Bench's rows: the same fields and more (sub_category, source, ...), read the same way
    speed = [{"question_id": "q1", "category": "coding", "sub_category": "python", "turns": ["Sort a list."],
              "source": "x", "src_id": "1", "difficulty": "easy", "multiturn": False}]
    assert file_prompts(write(tmp_path / "speed.jsonl", speed), 8)[0] == [{"prompt": "Sort a list.",
                                                                          "category": "coding", "turn": True}]


def test_generic_rows_with_and_without_a_category(tmp_path):
    rows = [{"prompt": "Hello", "category": "chat"}, {"prompt": [1, 2, 3], "category": " code "}, {"text": "plain"}]
    prompts, _ = file_prompts(write(tmp_path / "p.jsonl", rows), 8)
    assert prompts == [{"prompt": "Hello", "category": "chat"}, {"prompt": [1, 2, 3], "category": "code"},
                       {"prompt": "plain"}]
    assert categories.grouped(prompts) == [("chat", [0]), ("code", [1]), (categories.NONE, [2])]
    assert categories.grouped([{"prompt": "a"}, {"prompt": "b"}]) == []  # (no category: sent as they come)


@pytest.mark.parametrize("row,why", [
    ({"prompt": "x", "category": 3}, r'line 2: "category" is a JSON int: give it as text'),
    ({"question_id": 1, "category": "math", "turns": []}, r'line 2 holds no "prompt" \(nor input_ids, text, turns\)'),
])
def test_a_bad_row_is_one_line_naming_the_file_and_row(tmp_path, row, why):
    import re

    from specops.args import Refused as LaptopRefused
    from specops.ops.evaluate import check_prompts_file

    path = write(tmp_path / "bad.jsonl", [{"prompt": "ok", "category": "a"}, row])
    with pytest.raises(Refused) as e:
        file_prompts(path, 8)
    msg = str(e.value)
    assert "\n" not in msg and re.match(rf"--prompts {re.escape(str(path))}: {why}", msg), msg
    if "category" in why:  # (the laptop refuses the same row before anything is uploaded)
        with pytest.raises(LaptopRefused) as e2:
            check_prompts_file(str(path))
        assert str(e2.value) == msg


def test_max_prompts_takes_every_category_in_turn(tmp_path):
    rows = [{"prompt": f"{c}{i}", "category": c} for c in "abc" for i in range(4)]
    prompts, _ = file_prompts(write(tmp_path / "p.jsonl", rows), 6)
    assert [p["prompt"] for p in prompts] == ["a0", "a1", "b0", "b1", "c0", "c1"]
    assert [p["prompt"] for p in file_prompts(write(tmp_path / "q.jsonl", [{"prompt": "x"}] * 5), 2)[0]] == ["x", "x"]


def test_the_shipped_set_has_mt_benchs_eight_categories():
    path = REPO / "configs" / "prompts" / "mt-categories.jsonl"
    prompts, _ = file_prompts(path, 1000)
    groups = dict(categories.grouped(prompts))
    assert list(groups) == ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"]
    assert all(len(idx) == 5 for idx in groups.values())
    assert len(set(p["prompt"] for p in prompts)) == 40
    assert all(p["turn"] for p in prompts)  # (MT-Bench's rows: a chat model is asked through its chat template)
    # evaluate's default --max-prompts 32: four of each
    assert [len(idx) for _, idx in categories.grouped(file_prompts(path, 32)[0])] == [4] * 8


def counters(drafts, accepted, per_pos):
    return {"drafts": drafts, "draft_tokens": 3 * drafts, "accepted": accepted, "per_pos": dict(enumerate(per_pos))}


def test_categories_counters_add_up_to_the_whole_and_the_table_shows_them(capsys):
    from specops import views

    marks = [counters(0, 0, [0, 0, 0]), counters(10, 12, [6, 4, 2]), counters(30, 18, [10, 6, 2])]
    by = {c: categories.entry(acceptance(marks[i], marks[i + 1]), 2, 40) for i, c in enumerate(("math", "coding"))}
    whole = acceptance(marks[0], marks[-1])
    assert by["math"]["mean_acceptance_length"] == 2.2 and by["coding"]["mean_acceptance_length"] == 1.3
    for k in ("drafts", "accepted"):
        assert sum(e["counters"][k] for e in by.values()) == whole["counters"][k]
    ev = {"prompts": 4, "num_spec_tokens": 3, "generated_tokens": 80, **whole, "by_category": by}
    views.evaluation("r1", ev, "causes")
    out = capsys.readouterr().out
    assert "acceptance by category" in out and "math" in out and "coding" in out
    assert "2.200" in out and "1.300" in out and f"{whole['mean_acceptance_length']:.3f}" in out
    # a training-free method on the same prompts (`--baselines ngram`: evaluate's free_acceptance): tokens a verifier
    # step, a column beside the draft's per category and in all (issue 46: "beside ngram", by category); its mean
    # acceptance length counts only the steps it drafted at (here 10 of them, 3.0 there, 70 tokens in 50 steps: 1.4)
    from specops_host.serve.evaluate import per_step

    got = per_step({"counters": {"drafts": 10, "accepted": 20}, "mean_acceptance_length": 3.0, "generated_tokens": 70})
    assert got["tokens_per_step"] == 1.4 and per_step({"counters": {}, "generated_tokens": 0})["tokens_per_step"] is None
    ng = {**got, "by_category": {"math": {"tokens_per_step": 1.7}, "coding": {"tokens_per_step": 1.25}}}
    views.evaluation("r1", {**ev, "free_acceptance": {"ngram": ng}}, "causes")
    out = capsys.readouterr().out
    rows = {ln.split("\t")[0]: ln.split("\t") for ln in out.splitlines() if "\t" in ln}
    assert rows["category"][-1] == "ngram: tokens a step", rows["category"]
    assert (rows["math"][-1], rows["coding"][-1], rows["all"][-1]) == ("1.700", "1.250", "1.400"), rows
    views.evaluation("r1", {**ev, "free_acceptance": {"ngram": {**got, "by_category": {"math": {"tokens_per_step": 1.7}}}}},
                     "causes")  # (a category the method has no figure for: blank, never its figure over all prompts)
    rows = {ln.split("\t")[0]: ln.split("\t") for ln in capsys.readouterr().out.splitlines() if "\t" in ln}
    assert (rows["math"][-1], rows["coding"][-1], rows["all"][-1]) == ("1.700", "", "1.400"), rows
    assert ("ngram on the same prompts, greedy: 1.400 tokens a verifier step (it drafted at 10 steps, mean acceptance "
            "length 3.000 there)") in out
    views.evaluation("r1", {**ev, "free_acceptance": {"ngram": {"error": "URLError: refused"}}}, "causes")
    out = capsys.readouterr().out  # (its server failed the pass: said, no column)
    assert "ngram on the same prompts: not measured (URLError: refused)" in out and "tokens a step" not in out


def test_evaluate_gives_acceptance_by_category_on_a_real_server(pipeline_run, hosts_file, tmp_path):
    """The shipped set served by the real vLLM (CPU build) with a trained run's draft, half of it as MT-Bench's rows
    (through the verifier's chat template): one row per category, each category's counters its share of the
    whole's (read between categories), and the table printed."""
    from conftest import inv

    rid = pipeline_run["run_id"]
    # half the categories as MT-Bench's rows (a user's turn and a follow-up): through the verifier's chat template;
    # the others as plain prompts, sent as they are
    rows = [json.loads(x) for x in (REPO / "configs" / "prompts" / "mt-categories.jsonl").read_text().splitlines()]
    rows = [{**x, "turns": [x["turns"][0], "Say it again, shorter."]}
            if x["category"] in ("writing", "math", "coding", "stem") else
            {"category": x["category"], "prompt": x["turns"][0]} for x in rows]
    r = inv("evaluate", "--host", "box", "--hosts", str(hosts_file), "--run-id", rid, "--prompts",
            str(write(tmp_path / "mixed.jsonl", rows)), "--max-prompts", "16", "--max-tokens", "16",
            "--speedup", "none", "--dest", str(tmp_path))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    ev = json.loads((tmp_path / rid / "evaluation.json").read_text())
    by = ev["by_category"]
    assert list(by) == ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"]
    assert all(e["prompts"] == 2 for e in by.values()) and ev["prompts"] == 16
    assert ev["prompt_source"]["chat_template"] == 8, ev["prompt_source"]
    assert sum(e["generated_tokens"] for e in by.values()) == ev["generated_tokens"] > 0
    for k in ("drafts", "draft_tokens", "accepted"):
        assert sum(e["counters"][k] for e in by.values()) == ev["counters"][k], (k, by)
    for e in by.values():
        c = e["counters"]
        assert c["drafts"] > 0 and c["draft_tokens"] == 3 * c["drafts"], e
        assert e["mean_acceptance_length"] == 1 + c["accepted"] / c["drafts"]
        assert len(e["acceptance_by_position"]) == 3
    # the whole's mean acceptance length: the categories' weighted by their drafts
    drafts = ev["counters"]["drafts"]
    assert abs(sum(e["mean_acceptance_length"] * e["counters"]["drafts"] for e in by.values()) / drafts
               - ev["mean_acceptance_length"]) < 1e-9
    assert "acceptance by category" in r.stdout and "humanities" in r.stdout
    print("by category: " + json.dumps({c: round(e["mean_acceptance_length"], 3) for c, e in by.items()})
          + f"; all {ev['mean_acceptance_length']:.3f}")
