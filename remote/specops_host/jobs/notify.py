"""A job's notifications, sent from the host (the laptop may be closed): jobs/watch.py calls send().

The target (hosts.yaml `notify:` or `inv train --notify`; it reaches the supervisor as
SPECOPS_NOTIFY in the job's 0600 env file, never on a command line: a webhook URL is a secret):
- an http(s) URL: a POST of the JSON body {"text": "..."} (what a Slack or Teams incoming webhook takes);
- anything else: a command run on the host by /bin/sh, with SPECOPS_EVENT (end, failure, restart,
  stall), SPECOPS_TEXT (the sentence), SPECOPS_RUN_ID in its environment.
A notification that cannot be delivered is one line in the job's log, never a failure of the job.
"""

import json
import os
import subprocess
import urllib.error
import urllib.parse
import urllib.request

#: the events a job notifies
EVENTS = ("end", "failure", "restart", "stall")
#: the environment variable that carries the target to the supervisor
VAR = "SPECOPS_NOTIFY"
TIMEOUT_S = 15


def is_url(target):
    return urllib.parse.urlsplit(str(target)).scheme in ("http", "https")


def shown(target):
    """The target as a log line may show it: a URL's scheme and host only (its path is the secret)."""
    if is_url(target):
        u = urllib.parse.urlsplit(target)
        return f"{u.scheme}://{u.hostname or '?'}{f':{u.port}' if u.port else ''}/..."
    return f"command {target.split()[0] if target.split() else target!r}"


def problem(target):
    """Why target cannot be a notification target (one phrase), or None."""
    if not isinstance(target, str) or not target.strip():
        return "empty: give an http(s) webhook URL or a command"
    if "\n" in target or "\0" in target:
        return "holds a line break: give one URL or one command line"
    if "://" in target and not is_url(target):
        return f"{target.split('://')[0]}:// is not a webhook URL: give http:// or https://, or a command"
    if is_url(target) and not urllib.parse.urlsplit(target).hostname:
        return "a URL without a host"
    return None


def send(target, event, text, run_id="", timeout=TIMEOUT_S):
    """Deliver one notification. Returns None when delivered, else why not (one line: the caller
    logs it; nothing is raised)."""
    if not target:
        return None
    try:
        if is_url(target):
            body = json.dumps({"text": text}).encode()  # (all a Slack or Teams webhook needs)
            req = urllib.request.Request(target, data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=timeout) as r:
                r.read(1024)
            return None
        env = {**os.environ, "SPECOPS_EVENT": event, "SPECOPS_TEXT": text, "SPECOPS_RUN_ID": run_id}
        env.pop(VAR, None)
        p = subprocess.run(["/bin/sh", "-c", target], env=env, stdin=subprocess.DEVNULL, capture_output=True,
                           timeout=timeout)
        if p.returncode != 0:
            err = (p.stderr or p.stdout).decode(errors="replace").strip().splitlines()
            return f"exit {p.returncode}" + (f": {err[-1][:160]}" if err else "")
        return None
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code} {e.reason}"
    except urllib.error.URLError as e:
        return f"{e.reason}"
    except subprocess.TimeoutExpired:
        return f"no answer in {timeout}s"
    except Exception as e:  # (a notification never ends the supervisor)
        return f"{type(e).__name__}: {e}"
