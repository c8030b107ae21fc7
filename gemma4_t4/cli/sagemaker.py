"""``gemma4-t4 sagemaker quotas|image|build-image|deploy|matrix|list|status|logs|invoke|delete|reap``.

Every subcommand takes ``--dry-run``: it prints the equivalent ``aws`` CLI commands and calls
nothing. Destructive commands (delete, reap) need ``--yes``.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time

from gemma4_t4.cli import Handler, Output, add_command, add_group, stopping_in_order
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.atomic import atomic_write_json
from gemma4_t4.foundation.launch_record import add_setting_flags, read_setting_flags

# the SageMaker modules import no AWS SDK (boto3 loads at the first call), and the parser's own flags
# come from them: importing them here costs a command nothing
from gemma4_t4.sagemaker.aws import undone
from gemma4_t4.sagemaker.build import BuildFailed, build_cost, build_plan, build_record, build_t4_image
from gemma4_t4.sagemaker.cli_recipe import ApiCall
from gemma4_t4.sagemaker.config import DEFAULT_INSTANCE, DeployConfig, default_region
from gemma4_t4.sagemaker.cost import usd
from gemma4_t4.sagemaker.deploy import FailoverResult, run_deploy
from gemma4_t4.sagemaker.image import (
    DEFAULT_VLLM_TAG,
    US_REGIONS,
    dlc_account,
    find_vllm_image,
    resolve_dlc_tag,
)
from gemma4_t4.sagemaker.ops import (
    chat_payload,
    delete_endpoint,
    endpoint_logs,
    endpoint_status,
    invoke,
    invoke_plan,
    invoke_stream,
    list_endpoints,
    log_group,
)
from gemma4_t4.sagemaker.quotas import check_quotas, pick_regions, quota_plan
from gemma4_t4.sagemaker.reaper import reap
from gemma4_t4.sagemaker.upload import default_bucket, upload_model_folder, upload_plan


def _owns_aws_resources(handler: Handler) -> Handler:
    """SIGTERM and SIGHUP unwind like Ctrl-C while the command owns an endpoint, a build or an upload:
    the deploy rolls back, the matrix deletes its endpoint, the build is stopped (gemma4_t4.foundation.signals).
    The last line before the process ends says what was deleted or stopped, and after how long."""

    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> Output:
        started = time.monotonic()
        with stopping_in_order(lambda exc: f"after {time.monotonic() - started:.0f} s: "
                               + ("; ".join(undone(exc)) or "nothing had been created, nothing to delete")):
            return handler(args)

    return run


def _regions(value: str | None) -> list[str]:
    return [r.strip() for r in value.split(",") if r.strip()] if value else list(US_REGIONS)


def _common(parser: argparse.ArgumentParser, region: bool = True) -> None:
    if region:
        parser.add_argument("--region", help="AWS region (default: $AWS_REGION or us-east-2)")
    parser.add_argument(
        "--dry-run", action="store_true", help="print the equivalent aws CLI commands; call nothing"
    )


def _recipe(commands: list[str]) -> str:
    return ("# dry run: nothing was created or changed (read-only lookups only). Equivalent AWS CLI:\n"
            + "\n".join(commands))


def _dry_run(plan: list[str]) -> Output:
    """A dry run's answer: the plan, as data and as the equivalent aws CLI recipe."""
    return Output({"dry_run": True, "plan": plan}, _recipe(plan))


# -- handlers ---------------------------------------------------------------------------------
def _quotas(args: argparse.Namespace) -> Output:
    regions = _regions(args.regions)
    types = args.instance_types.split(",")
    if args.dry_run:
        return _dry_run([c.cli() for c in quota_plan(types, regions)])
    report = check_quotas(types, regions)
    picks, why = pick_regions(report, types)
    lines = [f"-> {t}: deploy in {r}" if r else f"-> {t}: {why[t]}" for t, r in picks.items()]
    return Output({"rows": report.rows, "picked": picks}, "\n".join([str(report), *lines]),
                  0 if any(picks.values()) else 1)


def _image(args: argparse.Namespace) -> Output:
    region = default_region(args.region)
    if args.dry_run:
        call = ApiCall(
            "ecr", "list_images",
            {"RegistryId": dlc_account(region), "RepositoryName": "vllm", "Filter": {"tagStatus": "TAGGED"}},
            region,
        )
        return _dry_run([call.cli()])
    choice = find_vllm_image(region, args.tag, query_registry=args.latest, instance_type=args.instance_type)
    text = (f"{choice.image_uri}\n  source: {choice.source}; CUDA {choice.cuda}; on {args.instance_type} "
            f"needs InferenceAmiVersion={choice.inference_ami_version or '(instance default)'}")
    return Output(choice, text)


@_owns_aws_resources
def _build_image(args: argparse.Namespace) -> Output:
    region = default_region(args.region)
    cost = build_cost().line()
    base = resolve_dlc_tag(region, args.base_tag)  # read-only: the newest DLC tag in the registry
    if args.dry_run:
        plan = build_plan(region, base.tag)
        return Output({"dry_run": True, "cost": cost, "base_tag": base.label, "plan": plan},
                      f"{cost}\nbase image tag: {base.label}\n# CodeBuild builds the image; ECR stores it\n"
                      + _recipe(plan))
    print(f"{cost}\nbase image tag: {base.label}", file=sys.stderr)
    try:
        result = build_t4_image(region, base.tag, force=args.force, progress=not args.json)
    except BuildFailed as exc:
        return Output(exc.result, f"error: {exc.message}\n  fix: {exc.fix}", 1)
    record = build_record(result)
    if args.record:
        atomic_write_json(args.record, record)
    text = (
        f"{result.status}: {result.image_uri}\n  digest {result.digest}\n  pinned {result.pinned_uri}\n"
        f"  created: {', '.join(result.created) or 'nothing'}; reused: {', '.join(result.reused) or 'nothing'}\n"
        f"deploy with: gemma4-t4 sagemaker deploy --region {region} --instance-type ml.g4dn.xlarge"
        f" (finds it) or --image-uri {result.pinned_uri}"
    )
    return Output(record, text)


@_owns_aws_resources
def _matrix(args: argparse.Namespace) -> Output:
    # lazy: the SageMaker modules (boto3) load only when a sagemaker command runs, not for --help
    from gemma4_t4.bench.registry import spec_for
    from gemma4_t4.studies import matrix
    from gemma4_t4.venues.endpoint import check_budget

    check_budget(args.budget_usd)  # before the plan: a dry run refuses a budget the real run would
    # one spec per endpoint, checked here: a misspelt workload is refused before any deploy
    specs = {args.workload: spec_for(args.workload)}
    base = _config_from(args)  # each model's endpoint gets its own name (matrix_configs)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not models:
        raise Gemma4T4Error(
            "--models is empty", fix="e.g. --models google/gemma-4-E2B-it,google/gemma-4-E4B-it"
        )
    configs = matrix.matrix_configs(models, base)
    plan = matrix.configs_plan(configs)
    head = (
        f"{len(models)} endpoint(s) on {base.instance_type} at ${plan.usd_per_hour:.3f}/h, one at a time: "
        f"~{usd(plan.estimate_usd)} estimated, hard budget {usd(args.budget_usd)}"
    )
    over = matrix.over_budget_warning(plan, args.budget_usd)
    if args.dry_run:
        lines = [f"  {e.endpoint:<40} {e.model_id:<40} ~{usd(e.estimate_usd)}" for e in plan.entries]
        return Output({"dry_run": True, "plan": plan, "warning": over},
                      "\n".join([head, *lines, *([f"warning: {over}"] if over else [])]))
    if over:
        print(f"warning: {over}", file=sys.stderr)
    print(head, file=sys.stderr)
    result = matrix.run_configs(configs, specs, budget=args.budget_usd, out_dir=args.out,
                                how=matrix.EndpointHandling(progress=not args.json))
    lines = [f"  {e.endpoint:<40} {e.status:<16} {usd(e.cost_usd)}  {e.error or e.out_dir or ''}"
             for e in result.entries]
    lines.append(f"spent ~{usd(result.spent_usd)} of {usd(result.budget_usd)}; deleted: "
                 f"{', '.join(result.deleted) or 'nothing'}"
                 + (f"; stopped: {result.stopped_reason}" if result.stopped_reason else ""))
    ok = all(e.status == "measured" for e in result.entries)
    return Output(result, "\n".join([head, *lines]), 0 if ok else 1)


def _config_from(args: argparse.Namespace):
    """The typed config from the deploy flags; without --image-uri or --image-tag the stock DLC tag is looked up
    in the region's registry (its ``image_label`` says which tag and whether it is the recorded fallback)."""
    return DeployConfig.from_settings(look_up_image_tag=True, **read_setting_flags(args, DeployConfig))


@_owns_aws_resources
def _deploy(args: argparse.Namespace) -> Output:
    config = _config_from(args)
    if args.model_dir and args.model_data_s3_uri:
        raise Gemma4T4Error("--model-dir and --model-data both name the model", fix="pass one of them")
    upload_lines: list[str] = []
    if args.model_dir:
        config, upload_lines = _with_model_dir(config, args)
    run = run_deploy(config, act=not args.dry_run, failover=_regions(args.failover) if args.failover else (),
                     announce=lambda cost: print(cost, file=sys.stderr), wait=not args.no_wait,
                     timeout_s=args.timeout, progress=not args.json)
    if args.dry_run:
        return Output(
            {"dry_run": True, "config": config.summary(), "cost": run.cost, "image_tag": config.image_label,
             "upload": upload_lines, "plan": run.plan},
            f"{run.cost}\nimage tag: {config.image_label}\n" + _recipe(upload_lines + run.plan),
        )
    result = run.result
    if isinstance(result, FailoverResult):
        lines = [f"{a.region}: {a.outcome} after {a.elapsed_s:.0f} s" + (f" ({a.reason})" if a.reason else "")
                 for a in result.attempts]
        return Output(result, "\n".join(lines), 0 if result.success else 1)
    failed = [f"error: {run.failed}"] if run.failed else []
    return Output(result, "\n".join([*failed, str(result)]), 1 if run.failed else 0)


def _with_model_dir(config, args: argparse.Namespace):
    """Upload --model-dir (real run) or plan its upload (dry run); the config serves it from S3."""
    if args.dry_run:
        uri, lines = upload_plan(
            args.model_dir, args.model_bucket or default_bucket("<account>", config.region),
            region=config.region,
        )
    else:
        result = upload_model_folder(
            args.model_dir, config.region, bucket=args.model_bucket, progress=not args.json
        )
        print(result.table(), file=sys.stderr)
        uri, lines = result.s3_uri, []
    return config.replaced(model_data_s3_uri=uri), lines


def _list(args: argparse.Namespace) -> Output:
    regions = _regions(args.regions)
    if args.dry_run:
        return _dry_run([ApiCall("sagemaker", "list_endpoints", {}, r).cli() for r in regions])
    endpoints = list_endpoints(regions, project_only=not args.all)
    text = (
        "\n".join(
            f"{e.region:<10} {e.name:<40} {e.status:<12} expires {e.expires_at or '-'}" for e in endpoints
        )
        or "no endpoints"
    )
    return Output(endpoints, text)


def _status(args: argparse.Namespace) -> Output:
    region = default_region(args.region)
    if args.dry_run:
        return _dry_run([ApiCall("sagemaker", "describe_endpoint", {"EndpointName": args.name}, region).cli()])
    status = endpoint_status(args.name, region)
    return Output(status, str(status), 0 if status.exists else 1)


def _logs(args: argparse.Namespace) -> Output:
    region = default_region(args.region)
    if args.dry_run:
        call = ApiCall("logs", "tail", {"LogGroupName": log_group(args.name), "Since": "1h"}, region)
        return _dry_run([call.cli().replace("--log-group-name ", "")])
    result = endpoint_logs(args.name, region, lines=args.lines)
    if not result.found:
        return Output(result, f"{result.log_group}: {result.explanation}", 1)
    return Output(result, "\n".join(result.lines) or result.explanation or "")


def _invoke(args: argparse.Namespace) -> Output:
    region = default_region(args.region)
    if args.dry_run:
        return _dry_run([invoke_plan(args.name, region, chat_payload(args.prompt, max_tokens=args.max_tokens)).cli()])
    if args.stream:
        result = invoke_stream(args.name, region, args.prompt, max_tokens=args.max_tokens,
                               on_text=None if args.json else lambda t: print(t, end="", flush=True))
        ttft = f"{result.ttft_s:.2f} s" if result.ttft_s is not None else "-"
        return Output(result, f"\n[time to first token {ttft}, total {result.total_s:.2f} s]")
    result = invoke(args.name, region, args.prompt, max_tokens=args.max_tokens)
    return Output(result, result.text)


def _delete(args: argparse.Namespace) -> Output:
    region = default_region(args.region)
    if args.dry_run:  # reads the endpoint's chain (read-only) so it lists exactly what --yes deletes
        result = delete_endpoint(args.name, region, dry_run=True, not_ours=args.not_ours)
        kept = "".join(f"\n# kept: {k}" for k in result.kept)
        return Output(
            result, "# dry run: nothing was deleted. Equivalent AWS CLI:\n" + "\n".join(result.plan) + kept
        )
    if not args.yes:
        raise Gemma4T4Error(
            f"refusing to delete {args.name} in {region} without --yes",
            fix="re-run with --yes, or --dry-run to see what would be deleted",
        )
    result = delete_endpoint(args.name, region, not_ours=args.not_ours)
    text = "deleted: " + (", ".join(result.deleted) or "nothing")
    if result.already_absent:
        text += "\nalready absent: " + ", ".join(result.already_absent)
    if result.kept:
        text += "\nkept: " + ", ".join(result.kept)
    return Output(result, text)


def _reap(args: argparse.Namespace) -> Output:
    dry = args.dry_run or not args.yes
    result = reap(_regions(args.regions), dry_run=dry)
    lines = [f"{d.region:<10} {d.name:<40} {d.action:<8} {d.reason}" for d in result.decisions]
    if dry and not args.dry_run and result.expired:
        lines.append("(nothing deleted: re-run with --yes to delete the expired endpoints)")
    return Output(result, "\n".join(lines) or "no project endpoints found")


# -- registration -------------------------------------------------------------------------------
def register(subparsers: argparse._SubParsersAction) -> None:
    sub = add_group(subparsers, "sagemaker", "deploy to and manage SageMaker endpoints (boto3)", __doc__)
    _register_image_commands(sub)
    _register_deploy_commands(sub)
    _register_endpoint_commands(sub)


def _register_image_commands(sub: argparse._SubParsersAction) -> None:
    """quotas, image, build-image: what a deploy needs before it starts."""
    p = add_command(sub, "quotas", _quotas, "endpoint quotas by name across regions; picks a region")
    p.add_argument("--instance-types", default=DEFAULT_INSTANCE, help="comma-separated")
    p.add_argument("--regions", help="comma-separated (default: the US regions)")
    _common(p, region=False)

    p = add_command(sub, "image", _image, "the AWS vLLM container image and the driver it needs")
    p.add_argument("--tag", help=f"pin a tag (default {DEFAULT_VLLM_TAG})")
    p.add_argument("--latest", action="store_true", help="look up the newest pinned tag in the registry")
    p.add_argument("--instance-type", default=DEFAULT_INSTANCE)
    _common(p)

    p = add_command(sub, "build-image", _build_image,
                    "build the fixed T4 image in AWS CodeBuild and push it to your ECR (no local docker)")
    p.add_argument(
        "--base-tag",
        help="the AWS vLLM DLC tag to build FROM (default: the newest in the region's registry, "
        f"else {DEFAULT_VLLM_TAG} labelled as a fallback)",
    )
    p.add_argument("--force", action="store_true", help="build again even if the tag is already in ECR")
    p.add_argument("--record", metavar="FILE", help="write the image URI and digest as JSON")
    _common(p)


def _register_deploy_commands(sub: argparse._SubParsersAction) -> None:
    """deploy and matrix: the commands that create endpoints (and bill)."""
    p = add_command(
        sub, "deploy", _deploy, "create model, endpoint config and endpoint; roll back on failure"
    )
    add_setting_flags(p, DeployConfig)
    p.add_argument(
        "--model-dir", metavar="DIR",
        help="a local model folder: uploaded to S3 (resumable, checksummed) and served from there",
    )
    p.add_argument(
        "--model-bucket",
        help="S3 bucket for --model-dir (default gemma4-t4-models-ACCOUNT-REGION)",
    )
    p.add_argument("--timeout", type=float, help="how long to wait for InService, s")
    p.add_argument("--no-wait", action="store_true", help="return once the endpoint is Creating")
    p.add_argument(
        "--failover", metavar="REGIONS",
        help="comma-separated regions to try in order (skips those without quota)",
    )
    _common(p, region=False)  # --region is a deploy setting

    p = add_command(
        sub, "matrix", _matrix, "deploy, measure and delete one endpoint per model, under a hard budget"
    )
    p.add_argument("--models", required=True, help="comma-separated model ids")
    p.add_argument(
        "--budget-usd", type=float, required=True, help="hard stop: endpoints are deleted when spent"
    )
    p.add_argument(
        "--workload", default="decode",
        help="benchmark workload per endpoint (decode, ttft, prefix, answers, load, series_decode)",
    )
    p.add_argument(
        "--out", default="results/sagemaker-matrix",
        help="results folder (OUT/ENDPOINT/WORKLOAD: one subfolder per model, one per workload inside)",
    )
    # matrix names its endpoints and takes its models from --models: these settings are deploy's alone
    add_setting_flags(p, DeployConfig, skip=("name", "model_id", "model_data_s3_uri"))
    _common(p, region=False)


def _register_endpoint_commands(sub: argparse._SubParsersAction) -> None:
    """list, status, logs, invoke, delete, reap: day-2 operations on existing endpoints."""
    p = add_command(sub, "list", _list, "this project's endpoints across regions")
    p.add_argument("--regions")
    p.add_argument("--all", action="store_true", help="include endpoints without the project tag")
    _common(p, region=False)

    for name, handler, help_text in (
        ("status", _status, "endpoint status, instance, AMI, age and cost so far"),
        ("logs", _logs, "the endpoint's CloudWatch log tail"),
        ("invoke", _invoke, "send an OpenAI-style chat request"),
        ("delete", _delete, "delete endpoint, config and model (idempotent)"),
    ):
        p = add_command(sub, name, handler, help_text)
        p.add_argument("name", help="endpoint name")
        _common(p)
        if name == "logs":
            p.add_argument("--lines", type=int, default=50)
        if name == "invoke":
            p.add_argument("--prompt", required=True)
            p.add_argument("--max-tokens", type=int, default=256)
            p.add_argument("--stream", action="store_true", help="stream tokens; reports time to first token")
        if name == "delete":
            p.add_argument("--yes", action="store_true", help="really delete")
            p.add_argument(
                "--not-ours", action="store_true",
                help="also delete an endpoint, config or model without this project's tag (not created here)",
            )

    p = add_command(sub, "reap", _reap, "delete project endpoints past their lifetime tag")
    p.add_argument("--regions")
    p.add_argument("--yes", action="store_true", help="really delete (otherwise only report)")
    _common(p, region=False)
