"""specops' host side: the scripts specops runs on a host, in packages named for their jobs.

`inv push` copies this package (every subfolder) into the host's workdir; specops runs a script
there with the host venv's interpreter, from the workdir, as a module:

    cd <workdir> && <venv>/bin/python3 -m specops_host.<package>.<module> ARGS

and reads the one framed JSON payload it prints (contract.py). The packages pair with the
laptop's specops/ops modules of the same job. Floors, from the ground up: the four base modules
import no package, jobs/ install/ fetch/ fixtures/ only the base, each later package only what is
listed before it (lazy imports too: tests/test_shape.py holds it so, as for specops/):

    contract   the laptop-host contract: payload frames, Refused, JobState, the name rule (both sides)
    hostenv    the caches and environment of the heavy programs (vLLM, torch) a script starts
    datafmt    the data layouts and the verifier's config, cheap readers (data, train, serve share it)
    ckpt       complete checkpoints: the marker, incomplete ones set aside (train writes; serve, the laptop read)
    jobs/      detached job supervision (ops/jobs.py): start, status, stop, the supervisor, /proc
    install/   the profile's install into the venv (ops/bootstrap.py, ops/wheelhouse.py)
    fetch/     the sha256 manifest of a run folder (ops/fetch.py)
    fixtures/  test and demo verifiers, the synthetic language
    serve/     the vLLM server's life (a job), its warm-up, evaluation (ops/evaluate.py)
    data/      datasets and extraction (ops/data.py, ops/inspect_data.py, ops/regenerate.py): serves the verifier
    train/     the trainer's launch, offline and online (ops/train.py), the train spec's reader
    check/     preflights (ops/check.py): the venv, deep, serve, distributed

Modules import each other by package (`from specops_host.serve import vllm_server`). The laptop
imports the stdlib-only ones (contract, fetch.manifest, fixtures.synthlang, jobs.errlines,
jobs.loglines, ...) from the installed package: never torch at import time in those.
"""

from specops_host import hostenv as _hostenv

_hostenv.quiet_threads()  # (before any script imports torch: OpenMP reads it once, when it loads)
