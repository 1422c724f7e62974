"""The extraction's program on a loaded host (remote/specops_host/data/datagen.py): speculators'
generate-offline-data waits a fixed 10 s (no flag sets it) for each hidden-states file's lock, which vLLM's
connector holds until the file is written; on 2 shared cores under load the write came later and the whole
`inv extract` failed (TimeoutError). Here a real program dies of that same wait, as speculators' does (its
`wait_for_lock_async`: an asyncio timeout around a non-blocking flock of a lock another process holds)."""

import fcntl
import sys
import textwrap

import pytest

from specops_host.data import datagen
from specops_host.serve.vllm_server import StepFailed

#: speculators 0.9.0's wait (data_generation/vllm_client.py), at 0.3 s instead of 10
SPECULATORS_WAIT = textwrap.dedent("""
    import asyncio, fcntl, os, sys
    from pathlib import Path

    async def _poll_lock_async(fd, poll_interval):
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                await asyncio.sleep(poll_interval)

    async def wait_for_lock_async(lock_path, timeout=0.3, poll_interval=0.1):
        fd = os.open(lock_path, os.O_RDWR)
        try:
            async with asyncio.timeout(timeout):
                await _poll_lock_async(fd, poll_interval)
        finally:
            os.close(fd)

    tries, lock, fail_at, concurrency = Path(sys.argv[3]), sys.argv[4], int(sys.argv[5]), sys.argv[7]
    n = int(tries.read_text()) + 1 if tries.exists() else 1
    tries.write_text(str(n))
    if n < fail_at:
        asyncio.run(wait_for_lock_async(lock))
    if sys.argv[8:]:
        raise ValueError("Prompt token IDs mismatch")
    print("Saved", n, "at --concurrency", concurrency)
""")


@pytest.fixture
def held_lock(tmp_path):
    lock = tmp_path / "hs_0.safetensors.lock"
    lock.touch()
    fd = open(lock, "w")
    fcntl.flock(fd, fcntl.LOCK_EX)  # (vLLM's connector holds it until the file is written)
    yield lock
    fd.close()


def argv(tmp_path, lock, fail_at, *more):
    """generate()'s argv_of: the program's argv at a concurrency."""
    prog = tmp_path / "generate.py"
    prog.write_text(SPECULATORS_WAIT)
    return lambda c: [sys.executable, str(prog), "speculators", "generate-offline-data", str(tmp_path / "tries"),
                      str(lock), str(fail_at), "--concurrency", str(c), *more]


def test_a_lock_wait_that_runs_out_is_tried_again_resuming(tmp_path, held_lock, capsys):
    secs = datagen.generate(argv(tmp_path, held_lock, 3), 32, count=lambda: 7)
    assert (tmp_path / "tries").read_text() == "3" and secs > 0
    out = capsys.readouterr().out
    # (three runs, each one's log whole: two died in the wait)
    assert out.count("[specops] $ ") == 3 and out.count("\nTimeoutError\n") == 2
    assert ("[specops] speculators' fixed 10 s wait for a hidden-states file's lock ran out (the host is loaded: the "
            "file's write came later): try 2 of 4, resuming at --concurrency 8; 7 file(s) written are kept") in out
    assert "try 3 of 4, resuming at --concurrency 2;" in out and "try 4 of 4" not in out
    assert "Saved 3 at --concurrency 2" in out


def test_a_lock_wait_that_never_ends_fails_in_one_line_and_another_error_is_never_retried(tmp_path, held_lock):
    with pytest.raises(StepFailed) as e:
        datagen.generate(argv(tmp_path, held_lock, 99), 1, tries=2)
    assert str(e.value) == ("speculators generate-offline-data failed 2 times: speculators' fixed 10 s wait for a "
                            "hidden-states file's lock ran out (the host is loaded: the file's write came later); "
                            "run it again when the host is less busy (the files written are kept)")
    assert (tmp_path / "tries").read_text() == "2"
    (tmp_path / "tries").unlink()
    with pytest.raises(StepFailed, match=r"exited 1: ValueError: Prompt token IDs mismatch$"):
        datagen.generate(argv(tmp_path, held_lock, 1, "bad"), 32)
    assert (tmp_path / "tries").read_text() == "1"


#: speculators 0.9.0's own log of it (`inv extract` of 48 SmolLM2 rows at load 13, the first row's wait): rich
#: wraps the traceback into its log's column
RICH_LOG = """
[09:03:54] ERROR    Fatal: sample 0 aborted with    generate_offline_data.py:174
                    --fail-on-error:
                    Traceback (most recent call
                    last):
                      File
                    "/home/specops-smol2/ml-env/lib
                    /python3.11/site-packages/specu
                    lators/cli/generate_offline_dat
                    a.py", line 154, in _worker
                        await
                    wait_for_lock_async(lock_path)
                      File
                    "/home/specops-smol2/ml-env/lib
                    /python3.11/site-packages/specu
                    lators/data_generation/vllm_cli
                    ent.py", line 149, in
                    wait_for_lock_async
                        async with
                    asyncio.timeout(timeout):
                      File
                    "/usr/lib/python3.11/asyncio/ti
                    meouts.py", line 98, in
                    __aexit__
                        raise TimeoutError
                    TimeoutError
"""


def test_the_lock_wait_is_found_in_speculators_own_wrapped_log():
    assert datagen.lock_wait(RICH_LOG)
    # (a request's own timeout is another failure: not this wait)
    assert not datagen.lock_wait(RICH_LOG.replace("wait_for_lock_async", "generate_hidden_states_async"))
