"""The suite's scheduler under xdist (`make test`: -n 3 --dist loadfile; conftest.pytest_xdist_make_scheduler).

xdist's loadfile hands each worker the next whole file as it frees. On this project's 2-core CI machine that left
the CPU idle in two places: the light files (the sshd rig and its light venv: fetch, trust, identity, ...) mostly
wait on processes and connections, yet each ran on one of the two workers in turn, the other core busy alone; and
the session fixture `pipeline_run` (one `inv pipeline`, about 90 s) was built on both workers, each taking a file
that reads it. Here, with 3 workers or more:

- the last worker is the light lane: it takes the light files alone (no cpu venv, no Slurm), beside the heavy work;
- the others are heavy lanes: the heavy files first, in conftest.LONGEST_FIRST's order, then light ones left over;
- the files that read `pipeline_run` are one unit of work (one worker builds it, then runs them one after another).

With 2 workers or fewer it is loadfile as it was, but for the one unit."""

from __future__ import annotations

from pathlib import Path

from xdist.scheduler import LoadFileScheduling

#: the unit that holds every file reading the session's pipeline_run
PIPELINE_UNIT = "tests/(pipeline_run)"


class Lanes(LoadFileScheduling):
    """loadfile with lanes (the module's docstring). heavy: the stems of files with a test that uses the cpu venv
    or Slurm (conftest.HEAVY, checked at collection); grouped: the stems of the files that read pipeline_run."""

    def __init__(self, config, log=None, *, heavy, grouped):
        super().__init__(config, log)
        self.heavy, self.grouped = set(heavy), set(grouped)

    def _split_scope(self, nodeid: str) -> str:
        f = nodeid.split("::", 1)[0]
        return PIPELINE_UNIT if Path(f).stem in self.grouped else f

    def is_heavy(self, scope: str) -> bool:
        return scope == PIPELINE_UNIT or Path(scope).stem in self.heavy

    def light_lane(self, node) -> bool:
        return self.numnodes >= 3 and node.gateway.id == f"gw{self.numnodes - 1}"

    def pick(self, node) -> str | None:
        """The next unit for this worker: the light lane's next light file (None: none left); a heavy lane's
        next heavy file, else the next of any kind."""
        if self.light_lane(node):
            return next((s for s in self.workqueue if not self.is_heavy(s)), None)
        return next((s for s in self.workqueue if self.is_heavy(s)), next(iter(self.workqueue)))

    def _assign_work_unit(self, node) -> None:
        scope = self.pick(node)
        if scope is None:  # (the light lane, with only heavy files left: its work is done)
            node.shutdown()
            return
        work_unit = self.workqueue.pop(scope)
        self.assigned_work.setdefault(node, {})[scope] = work_unit
        collection = self.registered_collections[node]
        node.send_runtest_some([collection.index(nodeid) for nodeid, done in work_unit.items() if not done])
