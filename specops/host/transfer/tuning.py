"""The transfer layer's tuning: window, round trips, stream counts, piece and range sizes, the
names never transferred; the helpers every part uses.
"""

from __future__ import annotations

import re
from typing import Callable


MIB = 1 << 20
#: OpenSSH's channel window (CHAN_SES_WINDOW_DEFAULT): what one stream may have in flight
WINDOW = 2 * MIB
#: below this round trip one stream is not window-bound (2 MiB / 2 ms = 1 GiB/s)
LAN_RTT = 0.002
#: the aggregate rate worth opening streams for (more streams than this needs are not opened)
AIM = 320 * MIB
MAX_STREAMS = 8
#: a forced streams=N is capped here
STREAMS_LIMIT = 32
#: files at least this big move as pieces; smaller ones in rsync groups
RANGE_MIN = 8 * MIB
PIECE = 16 * MIB
#: up to this many small files (and bytes) ride the piece streams instead of an rsync group
FEW_SMALL = 64
FEW_SMALL_BYTES = 64 * MIB
#: an upload range (fixed, so that a killed upload resumes whatever the stream count)
UP_RANGE = 32 * MIB
#: one stream's throughput probe
PROBE_BYTES = 8 * MIB
#: one stream under this share of what its window allows: the link, not the window, is the limit
LINK_BOUND = 0.2
#: less work than this: no probe (the round trip decides), and no more streams than work / this
MIN_STREAM_BYTES = 8 * MIB
SKIP_PREFIX = ".specops-"
PART_PREFIX = ".specops-part."
UP_PREFIX = ".specops-up."
#: what OpenSSH says when the host closes a connection before it starts (MaxStartups, limits)
_REFUSED = re.compile(r"kex_exchange_identification|ssh_exchange_identification|Connection closed by|"
                      r"Connection reset by|Session open refused|open failed|banner exchange|"
                      r"Connection refused|0 bytes received so far", re.I)

Progress = Callable[[int, int], None]


def _mib(n: float) -> str:
    return f"{n / MIB:.0f} MiB/s" if n >= 10 * MIB else f"{n / MIB:.1f} MiB/s"


def _skipped(rel: str) -> bool:
    return any(part.startswith(SKIP_PREFIX) for part in rel.split("/"))
