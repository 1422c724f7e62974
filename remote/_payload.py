"""Framing for the one structured payload a remote script prints on stdout.

Stray output before or after (warnings, library banners) is allowed: the laptop takes the
last framed block. Keep this module stdlib-only: every remote script imports it.
"""

import json
import sys

BEGIN = "@@SPECOPS-PAYLOAD-BEGIN@@"
END = "@@SPECOPS-PAYLOAD-END@@"


def emit(obj) -> None:
    sys.stdout.flush()
    sys.stdout.write("\n" + BEGIN + json.dumps(obj, default=str) + END + "\n")
    sys.stdout.flush()
