"""Complete checkpoints: a marker written last after each save, and the incomplete ones set aside.

stdlib only; both sides import it (the laptop reads listings with the same names).

speculators writes a checkpoint as checkpoints/N/ (N: the epoch; a mid-epoch save rewrites N).
A trainer killed while saving leaves N half-written, and speculators' resume loads the highest N
whatever it holds. train/hooked.py wraps the trainer's save: it removes N's marker before the save
and writes ``checkpoints/N/specops-complete.json`` (every file of N and its size) once the save has
returned, so a checkpoint is complete when its marker is there and every file it lists has its size.
train/run.py writes ``checkpoints/specops-markers.json`` when it starts a trainer that marks its
saves: from then on a checkpoint folder without a good marker is incomplete. Before a (re)start
set_aside() renames each incomplete one ``incomplete-N-<time>`` (speculators reads only numbered
folders), so the trainer resumes from the last complete one.

resolve() is the one rule by which a checkpoint is named: `best` or a plain name (contract's name
rule: no `/`, no `..`) of a folder in the run's checkpoints/ (an alias is none: a symlink may lead
anywhere), served or fetched only when complete (states()). `inv evaluate` (serve/evaluate.py),
`--checkpoints`, `inv fetch` and `--checkpoint` all go through it; run as a module it answers the
laptop (specops/ops/checkpoints.py):

    <venv>/bin/python3 -m specops_host.ckpt --run-dir runs/R [--checkpoint NAME ...]
"""

import argparse
import json
import os
import time
from pathlib import Path

from specops_host import contract

#: written last into a checkpoint folder: {"files": {relative path: size}, "written": time}
MARKER = "specops-complete.json"
#: in checkpoints/: this run's saves carry markers (a folder without one is incomplete)
POLICY = "specops-markers.json"
#: the prefix of an incomplete checkpoint set aside
SET_ASIDE = "incomplete-"


def files_of(folder):
    """{relative path: size} of every regular file under folder (the marker aside)."""
    folder = Path(folder)
    out = {}
    for root, _, names in os.walk(folder):
        for n in names:
            p = Path(root) / n
            rel = str(p.relative_to(folder))
            if rel == MARKER or p.is_symlink():
                continue
            try:
                out[rel] = p.stat().st_size
            except OSError:
                pass
    return out


def unmark(folder):
    """Before a save rewrites folder: it is incomplete until mark() says otherwise."""
    try:
        (Path(folder) / MARKER).unlink()
    except FileNotFoundError:
        pass


def mark(folder):
    """After a save returned: the marker, written whole (a temporary file renamed over it)."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    rec = {"files": files_of(folder), "written": time.time()}
    tmp = folder / f".{MARKER}.tmp"
    with open(tmp, "w") as f:
        json.dump(rec, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / MARKER)
    return rec


def problem(folder):
    """Why the checkpoint folder is incomplete (one phrase), or None when its marker holds."""
    folder = Path(folder)
    try:
        rec = json.loads((folder / MARKER).read_text())
    except FileNotFoundError:
        return f"no {MARKER} (its save did not finish)"
    except (OSError, ValueError) as e:
        return f"{MARKER} unreadable ({e})"
    files = rec.get("files") if isinstance(rec, dict) else None
    if not isinstance(files, dict) or not files:
        return f"{MARKER} lists no files"
    for rel, size in sorted(files.items()):
        try:
            have = (folder / rel).stat().st_size
        except OSError:
            return f"{rel} is missing"
        if have != size:
            return f"{rel} is {have} bytes, {size} when saved"
    return None


def marked_run(ckpts):
    """The run's checkpoints carry markers (train/run.py wrote the policy file)."""
    return (Path(ckpts) / POLICY).is_file()


def start_marking(ckpts):
    """From now on this run's checkpoints carry markers. The checkpoints of a run started before
    (by a specops that did not mark them) are taken as they were: complete, marked now."""
    ckpts = Path(ckpts)
    ckpts.mkdir(parents=True, exist_ok=True)
    if not marked_run(ckpts):
        for p in checkpoint_dirs(ckpts):
            if not (p / MARKER).is_file():
                mark(p)
        (ckpts / POLICY).write_text(json.dumps({"marker": MARKER, "since": time.time()}) + "\n")


def checkpoint_dirs(ckpts):
    """The checkpoint folders speculators reads or writes: numbered ones and `interrupted`."""
    try:
        found = [p for p in Path(ckpts).iterdir() if p.is_dir() and not p.is_symlink()
                 and (p.name.isdigit() or p.name == "interrupted")]
    except OSError:
        return []
    return sorted(found, key=lambda p: (not p.name.isdigit(), int(p.name) if p.name.isdigit() else 0))


def incomplete(ckpts):
    """[(folder, why)] of a marked run's incomplete checkpoints (none for an unmarked run)."""
    if not marked_run(ckpts):
        return []
    return [(p, why) for p in checkpoint_dirs(ckpts) if (why := problem(p))]


def set_aside(ckpts, now=None):
    """Rename each incomplete checkpoint incomplete-N-<time> (and drop the aliases that pointed to it:
    epochN_*, checkpoint_best). Returns [(name, new name, why)]."""
    ckpts = Path(ckpts)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now or time.time()))
    out = []
    for p, why in incomplete(ckpts):
        new = ckpts / f"{SET_ASIDE}{p.name}-{stamp}"
        n = 1
        while new.exists():
            n += 1
            new = ckpts / f"{SET_ASIDE}{p.name}-{stamp}-{n}"
        os.rename(p, new)
        for link in ckpts.iterdir():
            if link.is_symlink() and os.readlink(link).rstrip("/") in (p.name, str(p)):
                link.unlink()
        out.append((p.name, new.name, why))
    return out


def latest_complete(ckpts):
    """The highest numbered checkpoint that is complete (any, for an unmarked run), or None."""
    marked = marked_run(ckpts)
    done = [p.name for p in checkpoint_dirs(ckpts) if p.name.isdigit() and (not marked or problem(p) is None)]
    return done[-1] if done else None


#: the name of the trainer's best (checkpoint_best, else the newest complete one)
BEST = "best"
#: speculators' alias of its best checkpoint (a symlink in checkpoints/)
BEST_ALIAS = "checkpoint_best"


def _order(name):
    return (not name.isdigit(), int(name) if name.isdigit() else 0, name)


def states(ckpts):
    """(complete, incomplete, aliases) of a run's checkpoints/: complete names in order (numbers
    ascending; in a run from before the markers, every folder holding config.json); {name: why} of
    the incomplete ones (a marked run's folder whose marker does not hold, one set aside); {alias: the folder it
    names} of its symlinks (checkpoint_best, epochN_end), the folder's path where it lies outside."""
    ckpts = Path(ckpts)
    marked = marked_run(ckpts)
    done, bad, aliases = [], {}, {}
    try:
        entries = sorted(ckpts.iterdir(), key=lambda p: _order(p.name))
        home = ckpts.resolve()
    except OSError:
        return [], {}, {}
    for p in entries:
        if p.is_symlink():
            target = p.resolve()
            aliases[p.name] = target.name if target.parent == home else str(target)
            continue
        saved = (p / "config.json").is_file()
        if not p.is_dir() or not (saved or p.name.startswith(SET_ASIDE)
                                  or marked and (p.name.isdigit() or p.name == "interrupted")):
            continue  # (in a run from before the markers, a checkpoint is a folder holding config.json)
        if p.name.startswith(SET_ASIDE):
            why = f"set aside: {problem(p) or 'its save did not finish'}"
        else:
            why = problem(p) if marked else None
        if why is None:
            done.append(p.name)
        else:
            bad[p.name] = why
    return done, bad, aliases


class Unusable(contract.Refused):
    """A checkpoint that cannot be served or fetched: `reason` is spelling, unknown, incomplete or
    none (the run has no complete one); `why` the incomplete one's fault."""

    def __init__(self, text, asked, reason, why=None):
        super().__init__(text)
        self.asked, self.reason, self.why = asked, reason, why


def resolve(run, which):
    """(name, path) of the checkpoint `which` of the run folder `run`: `best` (checkpoint_best when
    it names a complete one of this run, else the newest complete numbered one) or the name of a
    folder in its checkpoints/ (not an alias: a symlink may lead anywhere). Unusable (a Refused) in
    one line otherwise: a spelling that is not a plain name (`3/`, `./3`, a path), one the run does
    not have, an incomplete one."""
    ck = Path(run) / "checkpoints"
    done, bad, aliases = states(ck)
    listed = ", ".join(done) or "none"
    which = str(BEST if which is None else which)
    if which == BEST:
        numbered = [n for n in done if n.isdigit()]
        name = aliases.get(BEST_ALIAS) if aliases.get(BEST_ALIAS) in done else numbered[-1] if numbered else None
        if name is None:
            raise Unusable(f"no complete checkpoint in {ck}" + (f" (incomplete: {', '.join(bad)})" if bad else "")
                           + ": train the run first", which, "none")
        return name, (ck / name).resolve()
    why = contract.name_problem(which)
    if why:
        raise Unusable(f"checkpoint {which!r} is not a checkpoint's name ({why}): give one of the run's "
                       f"checkpoints ({listed}) or {BEST}", which, "spelling")
    if which in bad:
        raise Unusable(f"checkpoint {which} in {ck} is incomplete ({bad[which]}): give a complete one ({listed})",
                       which, "incomplete", bad[which])
    if which not in done:  # (an alias is no name: a symlink may lead anywhere, another run's checkpoint too)
        raise Unusable(f"no checkpoint {which} in {ck} (its checkpoints: {listed})", which, "unknown")
    return which, (ck / which).resolve()


def main():
    ap = argparse.ArgumentParser(prog="ckpt")
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--checkpoint", action="append", default=[], help="a name to resolve (repeatable)")
    a = ap.parse_args()
    run = Path(a.run_dir)
    if not run.is_dir():
        contract.emit({"ok": False, "error": f"no run folder {run}", "no_run": True})
        return 2
    done, bad, aliases = states(run / "checkpoints")
    out = []
    for which in a.checkpoint:
        try:
            name, path = resolve(run, which)
            out.append({"asked": which, "name": name, "path": str(path)})
        except Unusable as e:
            out.append({"asked": which, "reason": e.reason, "why": e.why, "error": str(e)})
    contract.emit({"ok": True, "complete": done, "incomplete": bad, "aliases": aliases, "resolved": out})
    return 0


if __name__ == "__main__":
    contract.main(main)
