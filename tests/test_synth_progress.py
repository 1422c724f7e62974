"""`inv synthesize` keeps its progress and resumes (remote/specops_host/data/synth_progress.py): the pure parts, in
the fast layer: a run's progress file read back (rows, drops, the indices judged), a line cut mid-write left out,
a resumed run's rows equal to an uninterrupted run's, other settings refused before anything starts. The real
stop-and-resume over the loopback sshd is test_real.py's test_synthesize_same_seed_same_rows_and_never_replaces."""

import json

import pytest

from specops_host.contract import Refused
from specops_host.data import synth_progress as sp
from specops_host.data import synthesize as host_synth
from test_synthesize import _synth, plan_args


def replies(i, what):
    """Candidate i: every 3rd answer loops, every 4th question is empty, every 5th (from 10) repeats i-1's."""
    if what == "q":
        return ("" if i % 4 == 2 else f"question {i - 1 if i % 5 == 0 and i >= 10 else i}?", "stop")
    return ("yes " * 40 if i % 3 == 0 else f"An answer to question {i} that is plainly fine.", "stop")


def run(tmp_path, name, done=None, whole=None, head=None):
    """A Synth (stand-in replies, the real scheduling) writing its progress to tmp_path/name: (it, indices asked)."""
    s, _ = _synth(20, 6, 200, replies, lambda i: 0.002 * ((97 - i) % 5))  # (back out of order)
    asked, ask = [], s.ask
    s.ask = lambda i: asked.append(i) or ask(i)
    s.done = dict(done or {})
    s.progress = sp.Progress(tmp_path / name, head or {"seed": 0}, whole)
    try:
        s.run()
    finally:
        s.progress.close()
    return s, asked


def test_a_resumed_run_keeps_the_rows_and_drops_an_uninterrupted_run_has(tmp_path):
    whole, _ = run(tmp_path, "full.partial")
    data = (tmp_path / "full.partial").read_bytes()
    lines = data.split(b"\n")
    assert json.loads(lines[0]) == {"settings": {"seed": 0}} and not lines[-1]
    head, done, n = sp.parse(data)
    assert head == {"seed": 0} and n == len(data) and len(done) == whole.tried == len(lines) - 2
    kept, drops = sp.settle(done, rows=20)
    assert [whole.row(i, done[i][0], done[i][2]) for i in kept] == whole.rows and drops == whole.drops
    assert drops["duplicate"] and drops["looping"] and drops["empty"]
    # killed after 11 lines (written as they came back: not the first 11 candidates), the 12th cut mid-write
    cut = b"\n".join(lines[:12]) + b"\n" + lines[12][:len(lines[12]) // 2]
    (tmp_path / "cut.partial").write_bytes(cut)
    _, before, n = sp.read(tmp_path / "cut.partial")
    assert len(before) == 11 and n == len(b"\n".join(lines[:12])) + 1 and sorted(before) != list(range(11))
    again, asked = run(tmp_path, "cut.partial", before, n)
    assert not set(asked) & set(before) and set(range(min(asked))) <= set(before)  # (none twice, holes filled)
    assert again.rows == whole.rows  # (the same rows as the uninterrupted run)
    _, after, m = sp.read(tmp_path / "cut.partial")  # (the torn line gone: the file reads whole again)
    assert m == (tmp_path / "cut.partial").stat().st_size and len(after) == again.tried
    assert sorted(after) == list(range(again.tried)) and all(after[i] == done[i] for i in set(after) & set(done))
    assert again.drops == sp.settle(after, rows=20)[1]  # (the drops before it stopped counted too)

def test_a_torn_or_broken_progress_file_is_read_as_far_as_it_is_whole(tmp_path):
    head = b'{"settings": {"seed": 3}}\n'
    row = {"id": "synth-3-0", "conversations": [{"role": "user", "content": "q?"}, {"role": "assistant",
                                                                                   "content": "a."}]}
    one = json.dumps({"i": 0, "row": row}).encode()
    two = b'{"i": 1, "dropped": "refusal", "q": "Q?"}'
    assert sp.parse(head + one + b"\n" + two[:-3]) == ({"seed": 3}, {0: ("q?", None, "a.", None)},
                                                      len(head + one) + 1)
    # (a last line whole but for its newline: kept; the writer adds the newline before appending)
    h, done, n = sp.parse(head + one + b"\n" + two)
    assert done[1] == ("Q?", None, None, "refusal") and n == len(head + one + two) + 1
    p = tmp_path / ".o.jsonl.partial"
    p.write_bytes(head + one + b"\n" + two)
    w = sp.Progress(p, h, n)
    w.add(2, None, "looping", None, None)
    w.add(3, "q3?", None, "a", "error")  # (a failed request: not kept, asked again)
    w.close()
    assert sp.read(p)[1] == {**done, 2: (None, "looping", None, None)}
    with pytest.raises(ValueError, match="line 2"):
        sp.parse(head + b"{oops\n" + one + b"\n")
    with pytest.raises(ValueError, match="no settings line"):
        sp.parse(b'{"sett')
    with pytest.raises(ValueError, match="dropped 'bored'"):
        sp.parse(head + b'{"i": 4, "dropped": "bored"}\n')


def test_other_settings_are_refused_before_anything_starts_and_overwrite_starts_over(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8, "num_hidden_layers": 2}))
    (tmp_path / "chat_template.jinja").write_text("{{ messages }}")
    a = plan_args(tmp_path)
    info = {"verifier": str(tmp_path), "out": a.out, "question_sampling": {"temperature": 1.0, "top_p": 1.0},
            "answer_sampling": {"temperature": 0.0}}
    part = tmp_path / ".o.jsonl.partial"
    assert sp.path_of(a.out) == part and sp.resumable(a, info) is None
    rows = [{"i": i, "row": {"conversations": [{"role": "user", "content": f"q{i % 3}?"},
                                               {"role": "assistant", "content": "a"}]}} for i in range(5)]
    part.write_text("".join(json.dumps(x) + "\n" for x in [{"settings": sp.settings(a, info)}, *rows]))
    assert sp.resumable(a, info) == {"file": ".o.jsonl.partial", "rows": 3, "judged": 5}  # (2 duplicates)
    assert sp.resumable(plan_args(tmp_path, rows=2), info)["rows"] == 2
    with pytest.raises(Refused, match=r"--seed 0 \(now 7\); --max-tokens 32 \(now 64\): give its settings to "
                                      r"resume, or --overwrite to start over"):
        host_synth.plan(plan_args(tmp_path, seed=7, max_tokens=64))  # (before the tokenizer: none here)
    (tmp_path / "t.txt").write_text("tides\n")
    with pytest.raises(Refused, match=r"--topics none \(now [0-9a-f]{16}\)"):
        sp.resumable(plan_args(tmp_path, topics=str(tmp_path / "t.txt")), info)
    assert sp.resumable(plan_args(tmp_path, overwrite=True, seed=7), info) is None
    part.write_text("")
    with pytest.raises(Refused, match=r"cannot resume from .*\.o\.jsonl\.partial: no settings line.*--overwrite"):
        sp.resumable(a, info)
