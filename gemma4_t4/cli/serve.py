"""``gemma4-t4 serve start|stop|status|logs|adopt``: one vLLM server, managed across processes.

``serve start`` launches vLLM detached (it keeps running after the command returns), waits for
``/health`` and records the server under ``--work-dir``; ``stop``, ``status`` and ``logs`` find
it there from any later shell. On ``--target t4`` the start gate runs first and refuses, with
every reason and its fix, when the machine cannot succeed (``--force`` overrides, loudly).
``serve start --print-command`` prints the exact vLLM command line and environment (secrets
masked) and starts nothing. ``status`` names a dead engine's reason and any surviving process;
``stop`` reaps survivors; ``adopt`` re-supervises a vLLM whose supervisor died.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

from gemma4_t4.cli import Output, add_command, add_group
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation import signals

DEFAULT_T4_MODEL = "google/gemma-4-E2B-it-qat-w4a16-ct"


def _env_pairs(pairs: list[str] | None) -> dict[str, str]:
    env = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise Gemma4T4Error(f"--env expects KEY=VALUE, got {pair.split('=')[0]!r}",
                                fix="e.g. --env VLLM_LOGGING_LEVEL=DEBUG")
        env[key.strip()] = value
    return env


def _config(args: argparse.Namespace):
    # lazy: the serving stack loads only when a serve command runs, not for --help
    from gemma4_t4.serving.server_config import ServerConfig

    eager = True if args.eager else (False if args.compile else None)
    model = args.model or (DEFAULT_T4_MODEL if args.target == "t4" else None)
    if model is None:
        raise Gemma4T4Error(
            "--model is required with --target cpu",
            fix="build a tiny one (gemma4-t4 tiny models/tiny-gemma4) and pass --model models/tiny-gemma4",
        )
    return ServerConfig(
        model=model, target=args.target, served_model_name=args.served_model_name, host=args.host,
        port=args.port, dtype=args.dtype, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
        enable_prefix_caching=not args.no_prefix_caching, enforce_eager=eager,
        max_num_batched_tokens=args.max_num_batched_tokens,
        gpu_memory_utilization=args.gpu_memory_utilization, tensor_parallel_size=args.tensor_parallel_size,
        language_model_only=True if args.language_model_only else (False if args.multimodal else None),
        kv_cache_space_gib=args.kv_cache_space, block_size=args.block_size,
        api_key=args.api_key or os.environ.get("GEMMA4_T4_API_KEY"), extra_args=list(args.vllm_arg or []),
        extra_env=_env_pairs(args.env), work_dir=args.work_dir, python=args.python,
        restart_on_crash=args.restart_on_crash, draft=args.draft, num_draft_tokens=args.num_draft_tokens,
        draft_method=args.draft_method,
    )


def _print_command(args: argparse.Namespace, config) -> Output:
    # lazy: the serving stack loads only when a serve command runs, not for --help
    from gemma4_t4.foundation.secrets import mask
    from gemma4_t4.serving.server_config import plan_launch

    plan = plan_launch(config)
    gate = ("the start gate was not run (it needs the real machine and runs at a real start)"
            if config.target != "cpu"
            else "cpu target: no start gate")
    lines = [f"# nothing started; {gate}", plan.shell(), "", "# defaults chosen:"]
    lines += [f"#   {name}: {reason}" for name, reason in plan.chosen_by.items()]
    if plan.cpu_attention:
        lines.append(f"# cpu attention: {plan.cpu_attention.reason}")
    draft = config.draft_plan()
    if draft.enabled:  # its reason is among the defaults chosen, above
        lines.append(f"# speculative decoding: --speculative-config {draft.config_json()}")
    data = {"command": mask(plan.command), "env": plan.launch_env(), "shell": plan.shell(),
            "chosen_by": plan.chosen_by, "cpu_attention": plan.cpu_attention,
            "speculative_config": draft.speculative_config(), "started": False, "gate_run": False}
    return Output(data, "\n".join(lines))


def _start(args: argparse.Namespace) -> Output:
    # lazy: the serving stack loads only when a serve command runs, not for --help
    from gemma4_t4.serving.server import start_server

    config = _config(args)
    if args.print_command:
        return _print_command(args, config)
    # Ctrl-C, SIGTERM or SIGHUP during the /health wait stops the vLLM this command started
    # (start_server's wait cleans up on any interruption), then the process ends as signalled.
    with signals.orderly_stop():
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                server = start_server(config, force=args.force, gate=not args.no_gate, wait=not args.no_wait,
                                      timeout=args.timeout)
        except KeyboardInterrupt as exc:  # said before orderly_stop ends the process as signalled
            print(f"{signals.interrupt_label(exc)} while vLLM was starting on port {config.port}: stopped it "
                  f"(log: {config.work_dir}/logs/vllm-{config.port}.log)", file=sys.stderr)
            raise
    overrides = [str(w.message) for w in caught if "START GATE OVERRIDDEN" in str(w.message)]
    status = server.status()
    data = {"status": status, "launch_record": server.launch_record, "gate_overridden": overrides}
    text = "\n".join(
        overrides
        + [status.summary().split("\n--- log tail")[0],
           f"stop it with: gemma4-t4 serve stop --port {config.port} --work-dir {config.work_dir}"]
    )
    return Output(data, text)


def _stop(args: argparse.Namespace) -> Output:
    # lazy: the serving stack loads only when a serve command runs, not for --help
    from gemma4_t4.serving.server import stop_server

    status = stop_server(args.port, args.work_dir, grace=args.grace)
    return Output(status, status.summary())


def _status(args: argparse.Namespace) -> Output:
    # lazy: the serving stack loads only when a serve command runs, not for --help
    from gemma4_t4.serving.server import VLLMServer, list_servers

    if args.port is None:
        statuses = list_servers(args.work_dir)
        if not statuses:
            return Output([], f"no server recorded under {args.work_dir}")
        code = 1 if any(s.state in ("dead", "unsupervised") for s in statuses) else 0
        return Output(statuses, "\n\n".join(s.summary() for s in statuses), code)
    status = VLLMServer.attach(args.port, args.work_dir).status()
    return Output(status, status.summary(), 1 if status.state in ("dead", "unsupervised") else 0)


def _adopt(args: argparse.Namespace) -> Output:
    # lazy: the serving stack loads only when a serve command runs, not for --help
    from gemma4_t4.serving.server import adopt_server

    status = adopt_server(args.port, args.work_dir)
    return Output(status, status.summary())


def _logs(args: argparse.Namespace) -> Output:
    # lazy: the serving stack loads only when a serve command runs, not for --help
    from gemma4_t4.serving.server import VLLMServer

    server = VLLMServer.attach(args.port, args.work_dir)
    tail = server.log_tail(args.lines)
    return Output(
        {"port": server.config.port, "log_path": str(server.log_path), "lines": tail.splitlines()}, tail
    )


def _where(parser: argparse.ArgumentParser, port_default: int | None = None) -> None:
    # lazy: the serving stack loads only when a serve command runs, not for --help
    from gemma4_t4.foundation.launch_record import DEFAULT_WORK_DIR

    parser.add_argument(
        "--port", type=int, default=port_default,
        help="which server (default: the only one recorded)" if port_default is None else None,
    )
    parser.add_argument(
        "--work-dir", default=DEFAULT_WORK_DIR, help="where servers are recorded (default %(default)s)"
    )


def _start_options() -> list[tuple[str, dict]]:
    """``serve start``'s options after --target/--model/--host/--port, each with its argparse keywords.
    The help states the defaults the launch really uses (gemma4_t4.serving.server_config's T4/CPU constants)."""
    # lazy: the serving stack loads only when a serve command runs, not for --help
    from gemma4_t4.serving.server_config import (
        CPU_CONTEXT,
        CPU_MAX_NUM_SEQS,
        T4_CONTEXT,
        T4_GPU_MEMORY_UTILIZATION,
        T4_MAX_NUM_BATCHED_TOKENS,
        T4_MAX_NUM_SEQS,
    )

    # lazy: the serving stack loads only when a serve command runs, not for --help
    from gemma4_t4.serving.speculative import DEFAULT_NUM_DRAFT_TOKENS

    flag = {"action": "store_true"}
    return [
        ("--dtype", {"default": None, "help": "default float16 on t4 (no bf16 on Turing); on cpu a probe "
                     "of vLLM's attention picks bf16 or float32"}),
        ("--max-model-len", {"type": int, "default": None, "help": f"t4 default: {T4_CONTEXT} where the fit "
                             f"calculator says it fits; cpu: {CPU_CONTEXT}"}),
        ("--max-num-seqs", {"type": int, "default": None,
                            "help": f"t4 default {T4_MAX_NUM_SEQS}; cpu: {CPU_MAX_NUM_SEQS}"}),
        ("--max-num-batched-tokens", {"type": int, "default": None,
                                      "help": f"prefill chunk (t4 default {T4_MAX_NUM_BATCHED_TOKENS})"}),
        ("--gpu-memory-utilization", {"type": float, "default": None,
                                      "help": f"t4 default {T4_GPU_MEMORY_UTILIZATION:.2f}"}),
        ("--tensor-parallel-size", {"type": int, "default": 1, "help": "multi-T4 hosts, e.g. 4 on g4dn.12xlarge"}),
        ("--language-model-only", flag | {"help": "skip the vision/audio towers (the t4 default)"}),
        ("--multimodal", flag | {"help": "t4: keep the vision/audio towers"}), ("--no-prefix-caching", flag),
        ("--compile", flag | {"help": "use torch.compile/CUDA graphs (the t4 default; on cpu: slower start)"}),
        ("--eager", flag | {"help": "no CUDA graphs (--enforce-eager; the cpu default)"}),
        ("--kv-cache-space", {"type": int, "default": 1, "help": "cpu: KV cache GiB (default %(default)s)"}),
        ("--block-size", {"type": int, "default": None}),
        ("--api-key", {"default": None, "help": "required when binding beyond localhost (or set GEMMA4_T4_API_KEY)"}),
        ("--python", {"default": None, "help": "interpreter with vLLM installed (default: this one)"}),
        ("--vllm-arg", {"action": "append", "metavar": "ARG",
                        "help": "extra vLLM argument (repeatable; use --vllm-arg=--flag)"}),
        ("--env", {"action": "append", "metavar": "KEY=VALUE", "help": "extra environment for vLLM (repeatable)"}),
        ("--restart-on-crash", {"type": int, "default": 0, "metavar": "N", "help": "restart a crashed vLLM up to "
                                "N times, backoff 2, 4, 8 ... 60 s (default %(default)s: off)"}),
        ("--draft", {"default": None, "metavar": "auto|off|self|MODEL", "help": "speculative decoding: auto = "
                     "Google's assistant for the target's size and build where one is known and memory allows; "
                     "self = the target as its own draft model (a check); MODEL = an assistant id or folder "
                     "(default: on t4 the choice `gemma4-t4 tune` measured on this GPU, else off)"}),
        ("--num-draft-tokens", {"type": int, "default": None, "metavar": "N", "help": "tokens drafted per step, "
                                "1..16 (default: the tune profile's N, else the assistant's size recipe, 2 for E2B "
                                "and 26B-A4B and 4 for E4B, 12B and 31B; "
                                f"{DEFAULT_NUM_DRAFT_TOKENS} for a whole-model drafter)"}),
        ("--draft-method", {"choices": ["mtp", "draft_model"], "default": None,
                            "help": "draft_model: draft with a whole (smaller) Gemma 4 instead of an assistant"}),
        ("--print-command", flag | {"help": "print the exact vLLM command line and environment (secrets masked); "
                                    "start nothing"}),
        ("--timeout", {"type": float, "default": 1800.0, "help": "seconds to wait for /health (default %(default)g)"}),
        ("--no-wait", flag | {"help": "return right after launching"}),
        ("--force", flag | {"help": "launch even if the start gate refuses (loud)"}),
        ("--no-gate", flag | {"help": "skip the start gate entirely"}),
    ]


def register(subparsers: argparse._SubParsersAction) -> None:
    # lazy: the serving stack loads only when a serve command runs, not for --help
    from gemma4_t4.foundation.launch_record import DEFAULT_PORT
    from gemma4_t4.serving.server import STOP_GRACE_S

    sub = add_group(subparsers, "serve", "start, stop and inspect a vLLM server (T4 or CPU)", __doc__)

    p = add_command(sub, "start", _start, "launch vLLM detached and wait until /health answers")
    p.add_argument("--target", type=str.lower, choices=["t4", "cpu"], default="t4",
                   help="t4 (this GPU) or cpu, any case (default %(default)s)")
    p.add_argument("--model", default=None, help=f"hub id or local folder (t4 default: {DEFAULT_T4_MODEL})")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--host", default="127.0.0.1", help="other than localhost needs --api-key")
    _where(p, DEFAULT_PORT)
    for name, options in _start_options():
        p.add_argument(name, **options)

    p = add_command(sub, "stop", _stop, "SIGTERM the server's process group, SIGKILL after a grace period")
    _where(p)
    p.add_argument("--grace", type=float, default=STOP_GRACE_S, help="seconds before SIGKILL (default %(default)g)")
    status_help = "running / starting / restarting / dead (why, exit code, log tail, survivors) / unsupervised / stopped"
    for name, handler, help_text in (("status", _status, status_help),
                                     ("adopt", _adopt, "re-supervise a vLLM whose supervisor died while it still serves"),
                                     ("logs", _logs, "the end of the server's log")):
        p = add_command(sub, name, handler, help_text)
        _where(p)
    p.add_argument("--lines", type=int, default=80, help="default %(default)s")
