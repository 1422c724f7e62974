"""Bulk transfers to and from a host over SSH: several streams at once, split by files and by
byte ranges, resumable, verified. Behind ``SSHTransport.sync_down``/``_sync_up``/``put`` (upload
and wheelhouse pushes, shard and checkpoint moves) and ``fetch``.

Why: one SSH channel may have at most its window (2 MiB in OpenSSH) in flight, so one stream
moves at most window / round trip (40 MiB/s at 50 ms) whatever the link. Several at once
multiply that.

- The link (LinkCheck): the round trip is measured on the open connection (SSH keepalive
  requests: no session); when one stream could be window-bound (a round trip over LAN_RTT), one
  stream's throughput is probed in the background (up to 8 MiB over a connection of its own,
  while the push check and the listing go on). One stream on a LAN, or when one stream moves
  well under what its window allows (the link is the limit); otherwise enough streams for AIM,
  at most MAX_STREAMS (8: under sshd's default MaxStartups of 10 unauthenticated connections).
  ``streams=N`` forces N.
- The work: files of RANGE_MIN and more move as pieces (PIECE bytes, aligned to 1 MiB) striped
  over the streams; a few small files ride the same streams, one piece each; many small files
  (or symlinks) go in rsync groups (``--files-from``: rsync's quick check, delta and --partial).
  A piece stream is one ``ssh HOST sh -s`` started while the link is judged (its connection is
  up when the work starts); it runs ``dd`` per piece (every argument quoted) and prints a marker
  after each piece, which the laptop checks: a file that shrinks or grows under the transfer
  cannot shift the bytes of the next piece. Every stream carries the host's SSH options
  (``SSHTransport.ssh_command()``: strict known_hosts, key, port, ProxyCommand for a jump host),
  its own connection (never a ControlMaster), and prefers AES-GCM (hardware AES).
- Arrival: pieces are written at their offsets into DIR/.specops-part.NAME, with the list of the
  pieces done next to it (.json): a killed transfer resumes its pieces (a re-run skips files whose
  size and mtime match, like rsync). The file's sha256 follows its contiguous prefix as it fills
  (done when the last piece lands); then the file gets the host's mtime and mode and is renamed
  into place. fetch checks every file against the host's sha256 manifest (remote/specops_host/fetch/manifest.py);
  the digests computed on arrival spare it reading the files again.
- Uploads (Upload, upload_file): the same the other way; ranges (UP_RANGE) go to
  DIR/.specops-up.KEY.I on the host (``head -c N >>``: a killed upload resumes each range), are
  joined there, and the joined file's sha256 (sha256sum on the host) must equal the laptop's
  before it is moved into place.
- A host that closes extra connections before they start (sshd MaxStartups, a connection
  limit): the refused streams' work goes to the streams that did connect (the last one retries
  with a backoff); one note says how many went on.

Names starting with ``.specops-`` (hash caches, partial files) are never transferred.
``on_progress(done_bytes, total_bytes)`` is called from worker threads, at most about ten times
a second, and once at the end.

The package, by job: tuning (the sizes and limits above; set them there, e.g. tuning.PIECE),
listings (what is where), link (round trip, probe, how many streams), streams (the pool of
streams and a transfer session), download, upload.
"""

from __future__ import annotations

from specops.host.transfer import streams, tuning  # noqa: F401 (module settings: tuning.PIECE, ...)
from specops.host.transfer.listings import Entry, NoDirectory, local_listing, remote_has_rsync, remote_listing
from specops.host.transfer.link import Link, choose_streams, measure_rtt
from specops.host.transfer.streams import Batch, LinkCheck, stream_ssh
from specops.host.transfer.download import Download, Piece, download
from specops.host.transfer.upload import Range, Upload, upload, upload_file
from specops.host.transfer.tuning import (MAX_STREAMS, MIB, PART_PREFIX, PIECE, RANGE_MIN, SKIP_PREFIX,
                                        UP_PREFIX, UP_RANGE, Progress)

__all__ = ["streams", "tuning", "Entry", "NoDirectory", "local_listing", "remote_has_rsync", "remote_listing",
           "Link", "choose_streams", "measure_rtt", "Batch", "LinkCheck", "stream_ssh", "Download", "Piece", "download",
           "Range", "Upload", "upload", "upload_file", "MAX_STREAMS", "MIB", "PART_PREFIX", "PIECE", "RANGE_MIN",
           "SKIP_PREFIX", "UP_PREFIX", "UP_RANGE", "Progress"]
