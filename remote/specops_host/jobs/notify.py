"""A job's notifications, sent from the host (the laptop may be closed): jobs/watch.py posts them
to a Notifier.

The target (hosts.yaml `notify:` or `inv train --notify`; it reaches the supervisor as
SPECOPS_NOTIFY in the job's 0600 env file, never on a command line: a webhook URL is a secret):
- an http(s) URL: a POST of the JSON body {"text": "..."} (what a Slack or Teams incoming webhook takes);
  `http://user:password@host/...` is sent with basic auth (the credentials never in the request line);
- anything else: a command run on the host by /bin/sh, with SPECOPS_EVENT (end, failure, restart,
  stall), SPECOPS_TEXT (the sentence), SPECOPS_RUN_ID and SPECOPS_HOST in its environment.
Each delivery has ONE deadline (DEADLINE_S) for the whole of it, connect to answer: it runs in a
process of its own session, which ends itself at the deadline and is killed a little after it (a
server that drips its answer a byte at a time restarts a socket timeout with each byte). The
supervisor hands notifications to a Notifier's thread and goes on: a run's end (its exit code)
never waits on one. A notification that cannot be delivered is one line in the job's log, never a
failure of the job; no line shows the URL's credentials, path or query (shown()).
"""

import base64
import collections
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from specops_host.jobs.procs import DIR_VAR, LOCK_VAR, TAG_VAR

#: the events a job notifies
EVENTS = ("end", "failure", "restart", "stall")
#: the environment variable that carries the target to the supervisor
VAR = "SPECOPS_NOTIFY"
#: ... and the host's name in hosts.yaml (the laptop sets it beside VAR): what the notifications call the host
HOST_VAR = "SPECOPS_NOTIFY_HOST"
#: one delivery, whole: connect, send, the answer or the command's end
DEADLINE_S = 15.0
#: past the deadline, the delivery process is killed (it ends itself at the deadline)
KILL_AFTER_S = 2.0
#: a notification queued behind others this long is given up (a run's restarts come seconds apart at least)
QUEUED_S = 4 * DEADLINE_S
#: a target that starts with a scheme (`word://`) is a URL; only http(s) is one we can deliver
SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
HTTP = re.compile(r"^https?:", re.I)


def is_url(target):
    return isinstance(target, str) and bool(HTTP.match(target))


def shown(target):
    """The target as a line may show it (never raises): a URL's scheme, host and port only (its
    credentials, path and query are the secret); a command's program."""
    if not isinstance(target, str):
        return repr(target)
    m = SCHEME.match(target)
    if m or is_url(target):
        head = m.group(0) if m else target[:target.index(":") + 1]
        rest = target[len(head):]
        cut = min([rest.find(c) for c in "/?#" if c in rest] or [len(rest)])
        return head + rest[:cut].rpartition("@")[2] + ("/..." if rest[cut:] else "")
    words = target.split()
    return f"command {words[0] if words else target!r}"


def named(target):
    """The target in a refusal: quoted where it is a URL, its secrets left out (shown())."""
    if isinstance(target, str) and (SCHEME.match(target) or is_url(target)):
        return repr(shown(target))
    return shown(target) if isinstance(target, str) and target.strip() else repr(target)


def problem(target):
    """Why target cannot be a notification target (one phrase naming no secret), or None."""
    if not isinstance(target, str) or not target.strip():
        return "empty: give an http(s) webhook URL or a command"
    if "\n" in target or "\r" in target or "\0" in target:
        return "holds a line break: give one URL or one command line"
    m = SCHEME.match(target)
    if m and not is_url(target):
        return f"{m.group(1)}:// is not a webhook URL: give http:// or https://, or a command"
    if not is_url(target):
        return None
    if re.search(r"[\x00-\x20\x7f]", target):
        return "a URL holding a space or a control character: percent-encode it (a space is %20)"
    try:
        u = urllib.parse.urlsplit(target)
    except ValueError:
        return "an unclosed [ in the URL's host: an IPv6 address is written in brackets, e.g. http://[::1]:8080/..."
    if not u.hostname:
        return "a URL without a host"
    port = u.netloc.rpartition("@")[2].rpartition("]")[2].partition(":")[2]
    try:
        number = u.port
    except ValueError:
        number = None
    if port and not (number and 1 <= number <= 65535):
        return (f"port {port} is out of range: give 1 to 65535" if port.isdigit()
                else f"port {port!r} is not a number: give 1 to 65535")
    return None


def scrub(text, target):
    """text with the target's secrets (credentials, path, query) replaced by '...'."""
    if not is_url(target) or not text:
        return text
    try:
        u = urllib.parse.urlsplit(target)
        secrets = [target, u.netloc, u.password, u.username, u.path + ("?" + u.query if u.query else ""),
                   u.path, u.query, u.fragment]
    except ValueError:
        secrets = [target]
    for s in sorted({s for s in secrets if s and len(s) > 1 and s != "/"}, key=len, reverse=True):
        text = text.replace(s, "...")
    return text


def without_credentials(target):
    """(the URL without user:password@, the Authorization header's value or None)."""
    u = urllib.parse.urlsplit(target)
    if "@" not in u.netloc:
        return target, None
    user = urllib.parse.unquote(u.username or "")
    password = urllib.parse.unquote(u.password or "")
    bare = u._replace(netloc=u.netloc.rpartition("@")[2])
    return urllib.parse.urlunsplit(bare), "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


# -- one delivery: a process of its own ------------------------------------------------------------
#: the delivery process's program (argv[1]: the folder holding specops_host), the job on its stdin
CHILD = ("import sys; sys.path.insert(0, sys.argv[1]); from specops_host.jobs.notify import child; child()")
ROOT = str(Path(__file__).resolve().parents[2])


#: held while a delivery process is forked and exec'd: until its exec, /proc shows it with the job's tag, in the
#: supervisor's group, and the supervisor's end of the command's leftovers (jobs/job.py cleanup) took it for one
SPAWNING = threading.Lock()


def send(target, event, text, run_id="", timeout=DEADLINE_S, host=""):
    """Deliver one notification within `timeout` seconds, whole. Returns None when delivered, else
    why not (one line naming no secret: the caller logs it; nothing is raised)."""
    if not target:
        return None
    job = {"target": target, "event": event, "text": text, "run_id": run_id, "host": host, "deadline": timeout}
    # (not the job's: untagged, in a session of its own, so that the end of the job's processes spares the end's
    # notification; it ends itself at the deadline, even when the supervisor is gone)
    env = {k: v for k, v in os.environ.items() if k not in (VAR, HOST_VAR, TAG_VAR, DIR_VAR, LOCK_VAR)}
    try:
        with tempfile.TemporaryFile() as out:
            with SPAWNING:
                p = subprocess.Popen([sys.executable, "-I", "-c", CHILD, ROOT], stdin=subprocess.PIPE,
                                     stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                     cwd="/")
            try:
                p.stdin.write(json.dumps(job).encode())
                p.stdin.close()
            except OSError:
                pass
            try:
                p.wait(timeout=timeout + KILL_AFTER_S)
            except subprocess.TimeoutExpired:
                kill_group(p.pid)
                p.wait()
                return f"no answer in {timeout:g}s (given up)"
            out.seek(0)
            lines = out.read().decode(errors="replace").strip().splitlines()
    except Exception as e:  # noqa: BLE001 - a notification never ends the supervisor
        return scrub(f"{type(e).__name__}: {e}", target)
    if p.returncode != 0:
        return scrub(f"the delivery process ended with exit {p.returncode}" + (f": {lines[-1][:160]}" if lines else ""),
                     target)
    return scrub(lines[-1][:300], target) if lines else None


def kill_group(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass


class Expired(Exception):
    pass


def post(target, text, deadline):
    url, auth = without_credentials(target)
    body = json.dumps({"text": text}).encode()  # (all a Slack or Teams webhook needs)
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    if auth:
        req.add_unredirected_header("Authorization", auth)  # (never sent on to where a redirect points)
    with urllib.request.urlopen(req, timeout=deadline) as r:
        r.read(1024)


def command(job):
    env = {**os.environ, "SPECOPS_EVENT": job["event"], "SPECOPS_TEXT": job["text"],
           "SPECOPS_RUN_ID": job["run_id"], "SPECOPS_HOST": job["host"]}
    with tempfile.TemporaryFile() as out:
        p = subprocess.Popen(["/bin/sh", "-c", job["target"]], env=env, stdin=subprocess.DEVNULL, stdout=out,
                             stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = p.wait()
        except Expired:
            kill_group(p.pid)
            p.wait()
            raise
        if rc != 0:
            out.seek(0)
            err = out.read().decode(errors="replace").strip().splitlines()
            return f"exit {rc}" + (f": {err[-1][:160]}" if err else "")
    return None


def deliver(job):
    """One delivery, ended at its deadline (SIGALRM); None when delivered, else why not."""
    deadline = float(job["deadline"])

    def expire(*_):
        raise Expired()

    signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, deadline)
    try:
        return post(job["target"], job["text"], deadline) if is_url(job["target"]) else command(job)
    except Expired:
        return f"no answer in {deadline:g}s (given up)"
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code} {e.reason}"
    except urllib.error.URLError as e:
        return f"{e.reason}"
    except Exception as e:  # noqa: BLE001 - whatever it is, one line in the job's log
        return f"{type(e).__name__}: {e}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


# -- a job's notifications, off the supervisor's loop --------------------------------------------
class Notifier:
    """Where a job's notifications go and what they call the host. post() queues one and returns
    at once; one thread delivers them in order, each within `deadline` (one queued behind others
    for over QUEUED_S is given up). The thread is not a daemon: the supervisor's process outlives
    its job's end (the exit code written) until the last notification is delivered or given up."""

    def __init__(self, target, host=None, deadline=DEADLINE_S):
        self.target, self.host, self.deadline = target, host or socket.gethostname(), deadline
        self.queue, self.lock, self.worker = collections.deque(), threading.Lock(), None

    @classmethod
    def of(cls, env):
        """The job's Notifier (None without a target), its variables taken out of env (the command's)."""
        target, host = env.pop(VAR, None), env.pop(HOST_VAR, None)
        return cls(target, host) if target else None

    def post(self, event, what, text, run_id="", say=print):
        """Queue 'specops: <what> on <host>: <text>'; a delivery that fails is said through say()."""
        item = (event, f"specops: {what} on {self.host}: {text}", run_id, say, time.monotonic())
        with self.lock:
            self.queue.append(item)
            if self.worker is None:
                self.worker = threading.Thread(target=self.work, name="notify", daemon=False)
                self.worker.start()

    def work(self):
        while True:
            with self.lock:
                if not self.queue:
                    self.worker = None
                    return
                event, text, run_id, say, at = self.queue.popleft()
            late = time.monotonic() - at
            if late > QUEUED_S:
                why = f"not sent: {late:.0f}s behind earlier notifications (given up)"
            else:
                why = send(self.target, event, text, run_id, self.deadline, self.host)
            if why:
                say(f"notify ({event}): could not deliver to {shown(self.target)}: {why}")

    def wait(self, timeout=None):
        """Until every queued notification is delivered or given up (or timeout); True when so."""
        worker = self.worker
        if worker is not None:
            worker.join(timeout)
        return self.worker is None


def child():
    """The delivery process: the job from stdin, one line out (empty: delivered)."""
    print(deliver(json.load(sys.stdin)) or "", flush=True)
