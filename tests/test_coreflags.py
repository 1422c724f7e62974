"""A task's --host/--hosts written before the task's name (`inv --hosts F hosts`): invoke alone says `No idea
what '--hosts' is!`; specops says where the flag goes, in one line, exit 2, nothing run (issue 46)."""

import pytest

from conftest import inv
from specops.coreflags import misplaced


@pytest.mark.parametrize("argv, said", [
    (["--hosts", "F.yaml", "hosts"], "--hosts F.yaml: a task's flag, written before the task's name (where invoke reads "
     "only its own flags): put it after the task, `inv hosts --hosts F.yaml`, or set SPECOPS_HOSTS=F.yaml"),
    (["--host=gpu1", "prepare-data", "--data", "x.jsonl"], "put it after the task, `inv prepare-data --host gpu1`, or "
     "set SPECOPS_HOST=gpu1"),
])
def test_a_task_flag_before_the_task_is_one_line_saying_where_it_goes(argv, said, tmp_path):
    r = inv(*argv)
    assert r.returncode == 2 and said in r.stderr, r.stdout + r.stderr
    assert "No idea what" not in r.stderr and len(r.stderr.strip().splitlines()) == 1 and not r.stdout, r.stderr


def test_flags_in_their_places_are_left_alone():
    tasks = ["hosts", "status", "prepare-data"]
    for argv in (["inv", "hosts", "--hosts", "F"], ["inv", "-r", "--hosts", "hosts"], ["inv", "--list"],
                 ["inv", "status", "--host", "a", "hosts", "--hosts", "F"], ["inv", "--complete", "--", "inv", "--hosts"],
                 ["inv", "--help", "hosts"]):
        assert misplaced(argv, tasks) is None, argv
    assert misplaced(["inv", "-e", "--hosts", "F"], tasks).startswith("--hosts F: a task's flag")
    r = inv("hosts", "--hosts", "/nonexistent/hosts.yaml")  # (after the task: the task's own check)
    assert r.returncode != 0 and "hosts file /nonexistent/hosts.yaml not found" in r.stderr + r.stdout
