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
folders), so the trainer resumes from the last complete one; `inv fetch --checkpoint`, `inv
evaluate` and `inv clean` skip incomplete ones (specops/ops/fetch.py: complete_names).
"""

import json
import os
import time
from pathlib import Path

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
