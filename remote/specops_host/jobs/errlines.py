"""The one line a failed program died of, found in its log (shared by jobs/records.py and check/deep.py)."""

import re

WRAPPERS = ("ChildFailedError", "CalledProcessError", "SystemExit")
OWN = "[specops] error: "
RANK = re.compile(r"^\[(?:rank|default)\d+\]:\s?")  # torchrun's prefix on worker lines


def first_error(text):
    """The error a failed run died of: the last `XError: message` line outside tracebacks' code
    boxes that is not a launcher wrapper (torchrun's ChildFailedError); a chained
    'A: B: msg' is cut to its innermost 'B: msg'. A line specops wrote as `[specops] error: ...`
    (a job step's verdict, e.g. the draft-serves preflight's) is the error, as it stands."""
    found = None
    for line in text.splitlines():
        s = RANK.sub("", line).strip()  # torchrun prefixes each worker line with [rankN]:
        if s.startswith(OWN):
            found = s[len(OWN):][:600]
            continue
        if not s or s[0] in "│┃|╭╰❱┏┗║" or s.startswith(("File ", "raise ", "During handling", "The above")):
            continue
        m = re.match(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt))(?::\s*(.*))?$", s)
        if not m or m.group(1).split(".")[-1] in WRAPPERS:
            continue
        msg = s
        inner = re.findall(r"([A-Za-z_]\w*(?:Error|Exception)): ", msg)
        if len(inner) > 1:
            msg = msg[msg.rfind(inner[-1] + ": "):]
        msg = re.sub(r"^[\w.]*\.(\w+(?:Error|Exception))", r"\1", msg)
        cut = msg.find(". ", 40)  # the first sentence is the one-line error
        found = (msg[:cut] if cut > 0 else msg)[:300]
    return found
