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
import warnings

from gemma4_t4.cli import Output, add_command, add_group, stopping_in_order
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.launch_record import DEFAULT_WORK_DIR, add_setting_flags, read_setting_flags
from gemma4_t4.foundation.secrets import mask

# the parser's own flags come from the serving stack (ServerConfig): its modules are loaded with it
from gemma4_t4.serving.server import (
    STOP_GRACE_S,
    VLLMServer,
    list_servers,
    start_server,
    stop_server,
)
from gemma4_t4.serving.server_config import DEFAULT_T4_MODEL, ServerConfig, plan_launch


def _config(args: argparse.Namespace) -> ServerConfig:
    """The ServerConfig the flags ask for (read back by the one flag builder's reader)."""
    given = read_setting_flags(args, ServerConfig)
    model = args.model or (DEFAULT_T4_MODEL if args.target == "t4" else None)
    if model is None:
        raise Gemma4T4Error(
            "--model is required with --target cpu",
            fix="build a tiny one (gemma4-t4 tiny models/tiny-gemma4) and pass --model models/tiny-gemma4",
        )
    return ServerConfig(**given | {"model": model, "api_key": args.api_key or os.environ.get("GEMMA4_T4_API_KEY")})


def _print_command(config: ServerConfig) -> Output:
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
    config = _config(args)
    if args.print_command:
        return _print_command(config)
    # Ctrl-C, SIGTERM or SIGHUP during the /health wait stops the vLLM this command started
    # (start_server's wait cleans up on any interruption), then the process ends as signalled.
    with stopping_in_order(lambda _: f"while vLLM was starting on port {config.port}: stopped it "
                           f"(log: {config.work_dir}/logs/vllm-{config.port}.log)"), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        server = start_server(config, force=args.force, gate=not args.no_gate, wait=not args.no_wait,
                              timeout=args.timeout)
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
    status = stop_server(args.port, args.work_dir, grace=args.grace)
    return Output(status, status.summary())


def _status(args: argparse.Namespace) -> Output:
    if args.port is None:
        statuses = list_servers(args.work_dir)
        if not statuses:
            return Output([], f"no server recorded under {args.work_dir}")
        code = 1 if any(s.state in ("dead", "unsupervised", "unreadable") for s in statuses) else 0
        return Output(statuses, "\n\n".join(s.summary() for s in statuses), code)
    status = VLLMServer.attach(args.port, args.work_dir).status()
    return Output(status, status.summary(), 1 if status.state in ("dead", "unsupervised") else 0)


def _adopt(args: argparse.Namespace) -> Output:
    # re-supervise a server whose supervisor died while vLLM kept serving
    status = VLLMServer.attach(args.port, args.work_dir).adopt().status()
    return Output(status, status.summary())


def _logs(args: argparse.Namespace) -> Output:
    server = VLLMServer.attach(args.port, args.work_dir)
    tail = server.log_tail(args.lines)
    return Output(
        {"port": server.config.port, "log_path": str(server.log_path), "lines": tail.splitlines()}, tail
    )


def _where(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, help="which server (default: the only one recorded)")
    parser.add_argument(
        "--work-dir", default=DEFAULT_WORK_DIR, help="where servers are recorded (default %(default)s)"
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    sub = add_group(subparsers, "serve", "start, stop and inspect a vLLM server (T4 or CPU)", __doc__)

    p = add_command(sub, "start", _start, "launch vLLM detached and wait until /health answers")
    # on t4 the drafter left out is the profile `gemma4-t4 tune` measured (None: ServerConfig asks it)
    add_setting_flags(p, ServerConfig, defaults={"draft": None})
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for /health (default %(default)g)")
    for flag, text in (("--print-command", "print the exact vLLM command line and environment (secrets masked); "
                        "start nothing"), ("--no-wait", "return right after launching"),
                       ("--force", "launch even if the start gate refuses (loud)"),
                       ("--no-gate", "skip the start gate entirely")):
        p.add_argument(flag, action="store_true", help=text)

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
