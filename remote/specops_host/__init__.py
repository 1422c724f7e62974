"""specops' host side: the scripts specops runs on a host, in packages named for their jobs.

`inv push` copies this package (every subfolder) into the host's workdir; specops runs a script
there with the host venv's interpreter, from the workdir, as a module:

    cd <workdir> && <venv>/bin/python3 -m specops_host.<package>.<module> ARGS

and reads the one framed JSON payload it prints (contract.py). The packages pair with the
laptop's specops/ops modules of the same job:

    contract   the laptop-host contract: payload frames, Refused, JobState, the name rule (both sides)
    hostenv    the caches and environment of the heavy programs (vLLM, torch) a script starts
    jobs/      detached job supervision (ops/jobs.py): start, status, stop, the supervisor, /proc
    data/      datasets and extraction (ops/data.py, ops/inspect_data.py, ops/regenerate.py)
    serve/     the vLLM server's life, its warm-up, evaluation (ops/evaluate.py)
    train/     the trainer's launch, offline and online (ops/train.py), the train spec's reader
    check/     preflights (ops/check.py): the venv, deep, serve, distributed
    install/   the profile's install into the venv (ops/bootstrap.py, ops/wheelhouse.py)
    fetch/     the sha256 manifest of a run folder (ops/fetch.py)
    fixtures/  test and demo verifiers, the synthetic language

Modules import each other by package (`from specops_host.serve import vllm_server`). The laptop
imports the stdlib-only ones (contract, fetch.manifest, fixtures.synthlang, jobs.errlines,
jobs.loglines, ...) from the installed package: never torch at import time in those.
"""
