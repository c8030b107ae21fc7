"""Plant realistic bugs one at a time and check that the tests named for each one catch it.

Issue 44 planted by hand a set of user-visible bugs (an off-by-one, a flipped or dropped condition, a
swapped operand, a unit slip, a wrong default), each leaving the package importable, and found that the
fast tests missed most of them. This script keeps that experiment repeatable: every bug below is a
record (the behaviour in a user's words, the file, the exact original text, its bugged replacement, the
test nodes expected to catch it). For each bug the script copies the repository into a temporary
folder, applies that one edit there, and runs the named tests against the bugged copy; the tests must
fail. The same tests first run on the unbugged copy, where they must pass.

    .venv/bin/python scripts/planted_bugs.py            # every bug (a few minutes on a 2-core machine)
    .venv/bin/python scripts/planted_bugs.py --only 3   # one bug (its number in --list)
    .venv/bin/python scripts/planted_bugs.py --list     # the records, nothing run

It exits non-zero where a bug is not caught, where a named test fails on the unbugged copy, or where
the copy is not what the tests import. ``tests/test_planted_bugs.py`` checks (fast, nothing run) that
each original text still occurs exactly once and each named test still exists, so the list cannot rot.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYTHON = REPO / ".venv" / "bin" / "python"
# What the named tests import or read: the package, the tests and their data, and the files some tests
# check against the code (notebooks, docs, the Makefile, pyproject's pins).
COPIED = (
    "gemma4_t4",
    "tests",
    "notebooks",
    "docs",
    "scripts",
    "pyproject.toml",
    "README.md",
    "environment.yml",
    "Makefile",
    "mcp.example.json",
)
PYTEST = ("-m", "pytest", "-x", "-q", "-p", "no:randomly", "-p", "no:cacheprovider")
# --against runs whole files: only their fast tier (`make test-fast`'s selection), never a vLLM start
FAST_TIER = ("-m", "not vllm and not compile and not notebooks and not slow and not gpu and not more_hosts")
TIMEOUT_S = 600  # one bug's tests; far above what they take, so a hang reads as a hang, not a catch


@dataclass(frozen=True)
class Bug:
    """One planted bug: ``original`` (exactly once in ``file``) becomes ``bugged``."""

    behaviour: str  # what the user sees when the bug is in, in their words
    file: str  # relative to the repository
    original: str
    bugged: str
    tests: tuple[str, ...]  # pytest node ids, relative to the repository, expected to fail on the bug
    issue: bool = False  # one of the behaviours issue 44 lists

    def line(self, root: Path = REPO) -> int:
        text = (root / self.file).read_text()
        return text[: text.index(self.original)].count("\n") + 1


BUGS: tuple[Bug, ...] = (
    # ---------------------------------------------------------------- the behaviours issue 44 lists
    Bug(
        "An MCP client that sends {kind: decode, input_len: null} gets the workload default, not None "
        "(the run crashed)",
        "gemma4_t4/bench/registry.py",
        "given = {k: v for k, v in data.items() if v is not None}\n        return cls.derived",
        "given = dict(data)\n        return cls.derived",
        ("tests/bench/test_bench_bounds.py::test_a_null_field_from_an_mcp_client_takes_the_workloads_default",),
        issue=True,
    ),
    Bug(
        "A prefix-cache spec with one prompt per prefix group is refused (no prefix would be reused)",
        "gemma4_t4/bench/specs.py",
        "if self.num_prompts < 2 * self.groups:",
        "if self.num_prompts < self.groups:",
        ("tests/bench/test_bench_bounds.py::test_a_prefix_spec_without_a_reused_prefix_is_refused",),
        issue=True,
    ),
    Bug(
        "Comparing a streamed run with a flushed one names the flush where the per-stream ratio would be",
        "gemma4_t4/bench/compare.py",
        'for side, s in (("A", sa), ("B", sb)) if s.buffered',
        'for side, s in (("A", sa), ("B", sa)) if s.buffered',
        (
            "tests/bench/test_bench_flush_compare.py::test_a_streamed_run_compared_with_a_flushed_one_names_the_flush",
        ),
        issue=True,
    ),
    Bug(
        "A run whose c=1 streamed but c=8 flushed names its c=8 cell as the decode problem",
        "gemma4_t4/bench/results.py",
        "buffered = next((c for c in self.cells if c.buffered), None)",
        "buffered = self.cells[0] if self.cells else None",
        (
            "tests/bench/test_bench_flush_compare.py::test_a_run_whose_c8_flushed_names_its_c8_cell_although_c1_streamed",
        ),
        issue=True,
    ),
    Bug(
        "On a host with a P100 and an L4, setup, the doctor and the gate plan for the L4",
        "gemma4_t4/host/hostfacts.py",
        "able = next((g for g in gpus if (parse_capability(g.compute_capability) or (0, 0)) >= (7, 5)), None)",
        "able = next((g for g in gpus if (parse_capability(g.compute_capability) or (0, 0)) < (7, 5)), None)",
        ("tests/host/test_setup_host_verdicts.py::test_a_p100_beside_an_l4_plans_serves_and_judges_the_l4",),
        issue=True,
    ),
    Bug(
        "CUDA_VISIBLE_DEVICES=1,0 plans for GPU 1, the one vLLM runs on",
        "gemma4_t4/host/hostfacts.py",
        'first = cuda_visible_devices.split(",")[0].strip()',
        'first = cuda_visible_devices.split(",")[-1].strip()',
        (
            "tests/host/test_setup_host_verdicts.py::test_cuda_visible_devices_1_0_plans_for_gpu_1_the_one_vllm_runs_on",
        ),
        issue=True,
    ),
    Bug(
        "On Python 3.13 (Colab's published image) the doctor reports no error and the gate starts vLLM",
        "gemma4_t4/host/env.py",
        "if not ((3, 11) <= py[:2] <= (3, 13)):",
        "if not ((3, 11) <= py[:2] < (3, 13)):",
        (
            "tests/host/test_setup_host_verdicts.py::test_colab_published_image_python_3_13_gets_one_plan_from_every_voice",
        ),
        issue=True,
    ),
    Bug(
        "A 6-character secret (HF_TOKEN=abc123) is masked in MCP answers",
        "gemma4_t4/mcp_server.py",
        "scrubbed = secrets.mask(plain, secrets.known_values())",
        "scrubbed = secrets.mask(plain, [v for v in secrets.known_values() if len(v) > 6])",
        (
            "tests/foundation/test_secrets_rule.py::test_a_six_character_token_is_masked_in_an_mcp_answer",
            "tests/foundation/test_secrets_rule.py::test_a_four_character_secret_is_masked_in_an_mcp_answer_as_everywhere_else",
        ),
        issue=True,
    ),
    Bug(
        "Part 2's QAT/bf16 ratio is QAT over bf16 (1.79 on the published T4 figures), never inverted (0.56)",
        "gemma4_t4/bench/published.py",
        "self.flushed or self.qat.per_stream[1] / self.bf16.per_stream[1]",
        "self.flushed or self.bf16.per_stream[1] / self.qat.per_stream[1]",
        (
            "tests/notebooks/test_notebook_params.py::test_qat_twice_as_fast_reads_as_two_not_a_half",
            "tests/studies/test_part2_reading.py::test_the_t4_reading_puts_the_learners_numbers_against_this_gpus_ceiling",
        ),
        issue=True,
    ),
    Bug(
        "When only the bf16 run flushed, Part 2 prints the reason (it crashed with a TypeError)",
        "gemma4_t4/bench/published.py",
        "return self.bf16.not_measured or self.qat.not_measured",
        "return self.qat.not_measured",
        ("tests/notebooks/test_notebook_params.py::test_a_flushed_run_names_the_flush",),
        issue=True,
    ),
    Bug(
        "clean_up(keep_local=True) still deletes the SageMaker endpoints (they bill)",
        "gemma4_t4/notebook.py",
        'if served.venue == "sagemaker" or not keep_local:',
        "if not keep_local:",
        (
            "tests/notebooks/test_notebook_params.py::test_clean_up_keeping_local_servers_still_deletes_sagemaker_endpoints",
        ),
        issue=True,
    ),
    Bug(
        "A local T4 server gets the GPU context (8,192 tokens), not the CPU default's 2,048",
        "gemma4_t4/venues/parts.py",
        'wanted = max(CPU_CONTEXT if check_target(target) == "cpu" else GPU_CONTEXT, needed)',
        'wanted = max(CPU_CONTEXT if check_target(target) != "sagemaker" else GPU_CONTEXT, needed)',
        ("tests/notebooks/test_notebook_params.py::test_part4_on_a_local_t4_serves_a_context_its_ttft_prompts_fit",),
        issue=True,
    ),
    # ---------------------------------------------------------------- more of the same kinds, same modules
    Bug(
        "Part 4's longest TTFT prompts raise the server's context to fit them (a 12,000-token prompt is "
        "not refused against the default 8,192)",
        "gemma4_t4/venues/parts.py",
        'wanted = max(CPU_CONTEXT if check_target(target) == "cpu" else GPU_CONTEXT, needed)',
        'wanted = CPU_CONTEXT if check_target(target) == "cpu" else GPU_CONTEXT',
        ("tests/notebooks/test_notebook_params.py::test_part4_on_a_local_t4_serves_a_context_its_ttft_prompts_fit",),
    ),
    Bug(
        "An endpoint's lifetime is hours: `reap` deletes a 4-hour endpoint after 4 hours, not 4 minutes",
        "gemma4_t4/sagemaker/config.py",
        "dt.timedelta(hours=self.ttl_hours)",
        "dt.timedelta(minutes=self.ttl_hours)",
        ("tests/sagemaker/test_sagemaker_moto.py::test_reap_deletes_only_expired_project_endpoints",),
    ),
    Bug(
        "A bucket outside us-east-1 is created in the deploy's region (S3 needs its LocationConstraint)",
        "gemma4_t4/sagemaker/config.py",
        'if region != "us-east-1":\n        params["CreateBucketConfiguration"]',
        'if region == "us-east-1":\n        params["CreateBucketConfiguration"]',
        ("tests/sagemaker/test_sagemaker_checks.py::test_an_interrupted_multipart_upload_says_how_to_resume_or_abort",),
    ),
    Bug(
        "A 64-character endpoint name is refused before any AWS call (SageMaker allows 63)",
        "gemma4_t4/sagemaker/config.py",
        '_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")',
        '_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,63}$")',
        (
            "tests/test_user_expectations.py::test_an_endpoint_name_of_64_characters_is_refused_before_aws_sees_it",
        ),
    ),
    Bug(
        "A lifetime of 0 hours is refused (the reaper would delete the endpoint as soon as it is up)",
        "gemma4_t4/sagemaker/config.py",
        "gt=0, le=168,",
        "ge=0, le=168,",
        ("tests/sagemaker/test_sagemaker_config.py::test_bad_config_is_refused_before_any_call",),
    ),
    Bug(
        "An MCP tool's error text is scrubbed of the environment's secrets too, not only its answers",
        "gemma4_t4/mcp_server.py",
        "raise ToolError(secrets.mask(tool_error_text(exc), secrets.known_values())) from None",
        "raise ToolError(tool_error_text(exc)) from None",
        ("tests/mcp/test_reliability_mcp.py::test_errors_are_scrubbed_of_secrets",),
    ),
    Bug(
        "A tiny CPU model's figure is never divided by the published T4 figure (no measured/published ratio)",
        "gemma4_t4/bench/published.py",
        "measured_on.known and measured_on == published_on",
        "measured_on.known",
        ("tests/bench/test_bench_trust.py::test_a_tiny_cpu_run_gets_no_ratio_against_the_published_t4_row",),
    ),
    Bug(
        "A published GCE T4 row is looked up at the series' 512-token prompts unless another length is named",
        "gemma4_t4/bench/published.py",
        "def gce_t4(build: str, input_len: int = 512, concurrency: int = 1)",
        "def gce_t4(build: str, input_len: int = 4096, concurrency: int = 1)",
        ("tests/bench/test_bench_trust.py::test_a_t4_e2b_run_gets_its_ratio_and_an_unrecorded_kind_gets_none",),
    ),
    Bug(
        "A CUDA_VISIBLE_DEVICES that names a missing GPU is refused, never read as GPU 0",
        "gemma4_t4/host/hostfacts.py",
        "gpu = next((g for g in gpus if g.index == int(first)), None)",
        "gpu = next((g for g in gpus if g.index == int(first)), gpus[0])",
        ("tests/host/test_setup_mixed_gpus.py::test_choose_gpu_prefers_the_t4_and_follows_cuda_visible_devices",),
    ),
    Bug(
        "A decode spec with an empty concurrency list is refused naming the field",
        "gemma4_t4/bench/registry.py",
        'None, min_length=1, description="closed-loop streams per cell',
        'None, min_length=0, description="closed-loop streams per cell',
        ("tests/notebooks/test_notebook_params.py::test_each_parameter_runs_the_part_or_is_refused_in_one_sentence",),
    ),
    Bug(
        "Negative warm-up requests are refused",
        "gemma4_t4/bench/registry.py",
        "2, ge=0, le=MAX_PROMPTS,",
        "2, ge=-1, le=MAX_PROMPTS,",
        ("tests/bench/test_bench_args.py::test_defaults_follow_the_workload_and_bad_values_name_the_fix",),
    ),
    Bug(
        "A prefix spec shares 3/4 of its prompt unless prefix_len is given",
        "gemma4_t4/bench/specs.py",
        'data["prefix_len"] = data["input_len"] * 3 // 4',
        'data["prefix_len"] = data["input_len"] * 4 // 3',
        ("tests/bench/test_bench_bounds.py::test_a_null_field_from_an_mcp_client_takes_the_workloads_default",),
    ),
    Bug(
        "A secret named on the command line as `--api-key K` is masked (its value is the next word)",
        "gemma4_t4/foundation/secrets.py",
        "values.append(argv[i + 1])",
        "values.append(argv[i])",
        ("tests/foundation/test_secrets_rule.py",),
    ),
    Bug(
        "An explicit --region wins over $AWS_REGION",
        "gemma4_t4/sagemaker/config.py",
        'return region or os.environ.get("AWS_REGION") or',
        'return os.environ.get("AWS_REGION") or region or',
        ("tests/sagemaker/test_sagemaker_moto.py::test_cli_lifecycle_and_confirmation",),
    ),
    Bug(
        "Autoscaling with only --min-instances 2 (or min = max) is accepted",
        "gemma4_t4/sagemaker/config.py",
        "if low > high:",
        "if low >= high:",
        ("tests/test_user_expectations.py::test_an_autoscaling_floor_alone_or_a_fixed_fleet_is_accepted",),
    ),
    Bug(
        "A notebook parameter left None takes the venue's value (the CPU's short prompts on a CPU)",
        "gemma4_t4/bench/registry.py",
        "| {k: v for k, v in given.items() if v is not None})",
        "| given)",
        ("tests/bench/test_bench_args.py::test_papermill_parameters_are_read_as_they_plainly_mean",),
    ),
    Bug(
        "An open loop is refused when its arrivals alone take over 24 hours, not over 24 minutes",
        "gemma4_t4/bench/specs.py",
        "MAX_RUN_S = 24 * 3600",
        "MAX_RUN_S = 24 * 60",
        ("tests/bench/test_bench_bounds.py::test_a_bounded_spec_still_runs_at_its_limits",),
    ),
    Bug(
        "A decode cell without --num-prompts measures max(32, 4 x c) prompts, as docs/benchmarks.md says",
        "gemma4_t4/bench/specs.py",
        "n or max(32, 4 * c)",
        "n or max(8, 4 * c)",
        (
            "tests/test_user_expectations.py::test_a_decode_cell_measures_32_prompts_or_4_per_stream_unless_told",
        ),
    ),
    Bug(
        "`bench compare A B` shows output tok/s as B/A, like its other ratios",
        "gemma4_t4/bench/compare.py",
        "(tb / ta) if ta and tb else None",
        "(ta / tb) if ta and tb else None",
        ("tests/test_user_expectations.py::test_bench_compare_reads_every_ratio_as_b_over_a",),
    ),
    Bug(
        "A host of one GPU model is not called mixed (no CUDA_DEVICE_ORDER advice)",
        "gemma4_t4/host/hostfacts.py",
        "mixed = len({_model(g) for g in gpus}) > 1",
        "mixed = len({_model(g) for g in gpus}) >= 1",
        ("tests/host/test_setup_mixed_gpus.py::test_choose_gpu_prefers_the_t4_and_follows_cuda_visible_devices",),
    ),
    Bug(
        "The doctor names a host setup refuses in setup's words (the message without the fix folded in)",
        "gemma4_t4/host/env.py",
        'yield Problem("error", refusal[0], refusal[1].message, refusal[1].fix)',
        'yield Problem("error", refusal[0], str(refusal[1]), refusal[1].fix)',
        ("tests/host/test_verdicts_agree.py::test_doctor_setup_fix_torch_and_the_gate_agree[t4-driver-470]",),
    ),
    # a check that the bugged copy is what runs: every secret is shown masked as ***
    Bug(
        "Secrets are shown as *** (the copy under test is the one imported)",
        "gemma4_t4/foundation/secrets.py",
        'MASK = "***"',
        'MASK = "###"',
        ("tests/foundation/test_secrets_rule.py::test_a_six_character_token_is_masked_in_an_mcp_answer",),
    ),
)


@dataclass
class Outcome:
    bug: Bug
    number: int
    line: int
    caught: bool
    seconds: float
    tail: str
    tests: tuple[str, ...]  # what ran against it


def copy_repo(dest: Path) -> None:
    """The working tree's files under COPIED (tracked, or new and not ignored): a notebook's work folder
    (models, sockets) stays behind, an edit not yet committed comes along."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *COPIED],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for name in filter(None, listed.split("\0")):
        src = REPO / name
        if src.is_file() and not src.is_symlink():  # a file deleted but not yet committed is skipped
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def env_for(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def imported_from(root: Path) -> Path:
    """Where the package imports from in the copy: the venv's editable install points at the
    repository, so the copy must come first on the path."""
    done = subprocess.run(
        [str(PYTHON), "-c", "import gemma4_t4; print(gemma4_t4.__file__)"],
        cwd=root,
        env=env_for(root),
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(done.stdout.strip()).resolve()


def run_tests(root: Path, nodes: tuple[str, ...]) -> tuple[int, float, str]:
    """(pytest's exit status, seconds, the output's tail). 0: passed; 1: a test failed, the only
    status that counts as a catch (2 to 5: collection error, usage error, no such test; 124: hung)."""
    started = time.monotonic()
    try:
        done = subprocess.run(
            [str(PYTHON), *PYTEST, *nodes],
            cwd=root,
            env=env_for(root),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        rc, out = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out = 124, f"timed out after {TIMEOUT_S} s\n{exc.stdout or ''}"
    return rc, time.monotonic() - started, "\n".join(str(out).strip().splitlines()[-6:])


def plant(root: Path, bug: Bug) -> str:
    """Apply ``bug`` in the copy; return the original file text to restore."""
    path = root / bug.file
    text = path.read_text()
    if text.count(bug.original) != 1:
        raise SystemExit(
            f"{bug.file}: the original text of {bug.behaviour!r} occurs {text.count(bug.original)} "
            "times, not once: update its record"
        )
    path.write_text(text.replace(bug.original, bug.bugged))
    return text


def table(outcomes: list[Outcome]) -> str:
    rows = [("#", "behaviour", "file:line", "test", "caught", "s")]
    for o in outcomes:
        tests = ", ".join(t.split("::")[-1] if "::" in t else t for t in o.tests if t.startswith("tests/"))
        rows.append(
            (
                str(o.number),
                o.bug.behaviour,
                f"{o.bug.file}:{o.line}",
                tests,
                "yes" if o.caught else "NO",
                f"{o.seconds:.1f}",
            )
        )
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "|".join("---" for _ in rows[0]) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows[1:]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--only", type=int, nargs="+", metavar="N", help="run only these bugs (numbers from --list)"
    )
    parser.add_argument("--list", action="store_true", help="list the bugs and their tests; run nothing")
    parser.add_argument(
        "--against",
        nargs="+",
        metavar="NODE",
        help="run these test files or nodes against every bug instead of each bug's own (e.g. which bugs a "
        "module's test files catch without a given file)",
    )
    args = parser.parse_args(argv)
    numbered = list(enumerate(BUGS, 1))
    if args.only:
        unknown = [n for n in args.only if not 1 <= n <= len(BUGS)]
        if unknown:
            parser.error(f"no bug numbered {unknown}: 1 to {len(BUGS)} (see --list)")
        numbered = [(n, b) for n, b in numbered if n in args.only]
    if args.list:
        for n, bug in numbered:
            mark = " [issue 44]" if bug.issue else ""
            print(
                f"{n:2}. {bug.behaviour}{mark}\n    {bug.file}:{bug.line()}\n    - {bug.original!r}\n"
                f"    + {bug.bugged!r}\n    tests: {' '.join(bug.tests)}"
            )
        return 0

    with tempfile.TemporaryDirectory(prefix="planted-bugs-") as tmp:
        root = Path(tmp)
        copy_repo(root)
        where = imported_from(root)
        if not where.is_relative_to(root.resolve()):
            print(f"the copy is not what the tests import: gemma4_t4 comes from {where}", file=sys.stderr)
            return 1
        against = (*FAST_TIER, *args.against) if args.against else ()
        nodes = against or tuple(dict.fromkeys(t for _, b in numbered for t in b.tests))
        rc, seconds, tail = run_tests(root, nodes)
        print(
            f"unbugged copy: {len(nodes)} test nodes {'pass' if rc == 0 else 'FAIL'} ({seconds:.1f} s)",
            flush=True,
        )
        if rc != 0:
            print(tail, file=sys.stderr)
            return 1
        outcomes = []
        for n, bug in numbered:
            original = plant(root, bug)
            try:
                rc, seconds, tail = run_tests(root, against or bug.tests)
            finally:
                (root / bug.file).write_text(original)
            outcome = Outcome(bug, n, bug.line(root), rc == 1, seconds, tail, against or bug.tests)
            outcomes.append(outcome)
            verdict = (
                "caught" if rc == 1 else "NOT CAUGHT" if rc == 0 else f"NOT CAUGHT (pytest exit status {rc})"
            )
            print(f"{n:2}. {verdict} in {seconds:.1f} s: {bug.behaviour}", flush=True)
            if not outcome.caught:
                print("    " + tail.replace("\n", "\n    "), flush=True)
    print()
    print(table(outcomes))
    missed = [o for o in outcomes if not o.caught]
    print(f"\n{len(outcomes) - len(missed)} of {len(outcomes)} planted bugs caught")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
