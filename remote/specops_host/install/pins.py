"""A profile's exact pins (name==version) against what this interpreter has installed."""

import re
from importlib import metadata

PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==([^\s#;]+)")


def pins(lines):
    """(name, version) for every `name==version` requirement line."""
    for line in lines:
        m = PIN.match(line.strip())
        if m:
            yield m.group(1), m.group(2)


def mismatches(lines):
    """[{"package", "want", "have"}] for pins this environment does not satisfy (have None: missing)."""
    out = []
    for name, want in pins(lines):
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            have = None
        if have != want:
            out.append({"package": name, "want": want, "have": have})
    return out


def versions(names):
    """{name: installed version or None}."""
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out
