"""The last line of a job's log worth showing in `inv status` (stdlib; used by jobs/records.py, serve/vllm_server.py).

A trainer's log is a terminal transcript: rich pads lines with spaces to the console width,
progress bars redraw themselves with carriage returns (one physical line holds every
redraw), and ANSI escapes color it. What a person wants is the last thing said, on one
short line.
"""

import re

CAP = 200
ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
# box drawing, block elements and the characters rich draws bars and rules with
NOISE = re.compile(r"^[\s\u2500-\u259f\u2800-\u28ff\u25a0-\u25ff\-=_|+:.#*•·…]*$")


def clean(line):
    """One physical line as the terminal finally showed it: the last carriage-return segment
    that says something, without ANSI escapes, runs of spaces collapsed."""
    line = ANSI.sub("", line)
    shown = ""
    for seg in line.split("\r"):
        seg = " ".join(seg.split())
        if seg:
            shown = seg
    return shown


def meaningful(line):
    return bool(line) and not NOISE.match(line)


def last_meaningful(text, cap=CAP):
    """The last line worth showing: blank lines, progress-bar redraws (what a '\\r' overwrote)
    and lines of only box drawing / rules are skipped; ANSI escapes stripped, spaces collapsed,
    at most `cap` characters ('…' marks a cut). '' when nothing is left."""
    for raw in reversed(text.splitlines()):  # (splitlines also cuts at each '\r')
        line = clean(raw)
        if meaningful(line):
            return line if len(line) <= cap else line[:cap - 1] + "…"
    return ""
