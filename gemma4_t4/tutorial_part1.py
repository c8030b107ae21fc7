"""Part 1's lesson helpers: the notebook's cells stay the calls (quotas, image, deploy, query, the MCP
server, clean-up), and this module holds what used to crowd them: the stand-in replies queued where
moto answers alone, the stock-image refusal, the MCP tour, the cost of an idle endpoint, and the part's
checks and summary built from its results in one call, each result saying what the learner's numbers mean."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gemma4_t4 import notebook as nb
from gemma4_t4 import sagemaker
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation import signals
from gemma4_t4.foundation.figures import pyplot
from gemma4_t4.foundation.jsonable import JSONValue
from gemma4_t4.foundation.table import Displayable, Table
from gemma4_t4.sagemaker import build
from gemma4_t4.sagemaker import image as images
from gemma4_t4.sagemaker.cost import CostEstimate
from gemma4_t4.sagemaker.deploy import DeployResult
from gemma4_t4.sagemaker.ops import EndpointStatus, InvokeResult, StreamResult
from gemma4_t4.sagemaker.quotas import QuotaReport
from gemma4_t4.venues.endpoint import Endpoint
from gemma4_t4.venues.parameters import is_real_number

# what moto returns where no model runs here (a stand-in reply, labelled canned by the venue)
CANNED = {
    "What is the capital of France? Answer in one sentence.": "Paris is the capital of France.",
    "What is two plus two? Answer in one sentence.": "Two plus two is four.",
}
MCP_QUESTION = "What is two plus two? Answer in one sentence."
MCP_TIMEOUT_S = 300.0  # the MCP tour's limit: starting the server, listing its tools and five calls
COST_HOURS = (0, 0.6, 1, 2, 4, 8, 24)
COST_INSTANCE_TYPES = ("ml.g4dn.xlarge", "ml.g6.xlarge")  # the T4 and the L4 endpoint Part 1 compares


@dataclass
class AwsVenue:
    """Where Part 1's AWS calls go: real AWS (billed), or local stand-ins (moto) whose replies come from the
    tiny Gemma 4 where vLLM is installed, else canned by moto."""

    target: str
    local: Any = None  # LocalAWS, on TARGET="cpu"
    tiny: Endpoint | None = None  # the tiny Gemma 4's server behind the runtime stand-in
    generated: bool = True  # replies come from a model (AWS, or the tiny one), not canned by moto

    @property
    def replies_from(self) -> str:
        if not self.local:
            return "the endpoint"
        return "tiny Gemma 4 via the runtime stand-in" if self.generated else "canned (moto)"

    def describe(self) -> str:
        if not self.local:
            return "AWS: real AWS (billed)"
        why = "" if self.generated else " (vLLM is not installed here, so moto answers with queued bodies)"
        return f"AWS: local moto + fake Service Quotas; endpoint replies: {self.replies_from}{why}"

    def canned(self, text: str) -> None:
        """Queue ``text`` as the next reply where moto answers canned bodies (nothing elsewhere)."""
        if self.local and not self.generated:
            self.local.queue_chat_replies([f"{text} (canned: no vLLM on this machine)"])

    def image_uri(self, instance_type: str, region: str) -> str:
        """The image for ``instance_type``: on a T4 the fixed one (found or built), else the DLC."""
        if not sagemaker.DeployConfig(instance_type=instance_type).needs_fixed_image:
            return sagemaker.find_vllm_image(region).image_uri
        print(
            "\n".join(build.build_plan(region)[:3]), "\n..."
        )  # all of it: gemma4-t4 sagemaker build-image --dry-run
        image = build.ensure_t4_image(
            region, on_build_succeeded=self.local.seed_fixed_image if self.local else None
        )
        print(("built: " if image.build is not None else "found: ") + image.image_uri, image.digest)
        if image.build is not None:
            print(
                "created:", ", ".join(image.build.created), "| reused:", ", ".join(image.build.reused) or "-"
            )
        return image.image_uri

    def invoke_stream(self, name: str, region: str, prompt: str, max_tokens: int = 32) -> Any:
        """A streamed reply, or ``None`` where moto answers alone (it implements no response streams)."""
        if not self.generated:
            print("streamed: not run (moto alone implements no response streams)")
            return None
        streamed = sagemaker.invoke_stream(name, region, prompt, max_tokens=max_tokens)
        print(
            f"streamed: first token after {streamed.ttft_s * 1000:.0f} ms, {streamed.chunks} chunks:",
            streamed.text,
        )
        return streamed

    def stop(self) -> None:
        """Stop the local stand-ins and the tiny model's server (nothing runs for real AWS)."""
        if self.local:
            self.local.stop()
        if self.tiny:
            self.tiny.stop()


def aws_venue(target: str, work_dir: str | Path) -> AwsVenue:
    """Part 1's venue: "sagemaker" is real AWS; "cpu" starts the local stand-ins (and the tiny Gemma 4)."""
    if target != "cpu":
        venue = AwsVenue(target)
    else:
        # lazy: the local moto server and the runtime stand-in load only on Part 1's cpu venue
        from gemma4_t4.standins.local import LocalAWS

        tiny = (
            nb.endpoint("cpu", nb.model_for("cpu", work_dir=work_dir), work_dir, name="tiny-gemma4")
            if importlib.util.find_spec("vllm") is not None
            else None
        )
        # seed_fixed_image=False: the image step builds the T4 image itself (against moto here)
        local = LocalAWS(seed_fixed_image=False, runtime_backend=tiny.url if tiny else None).start()
        venue = AwsVenue(target, local, tiny, generated=local.runtime is not None)
    print(venue.describe())
    return venue


@dataclass
class MCPCall:
    """One tool call made through a real MCP client."""

    tool: str
    arguments: dict[str, JSONValue]  # sent over JSON-RPC
    is_error: bool
    result: Any  # the structured content, else the text content


@dataclass
class MCPSession(Displayable):
    """The tools a real MCP client listed and the calls it made, shown one row per call."""

    tools: list[str]
    calls: list[MCPCall]

    def caption(self) -> str:
        return f"Tool calls through a real MCP client (stdio); {len(self.tools)} tools listed"

    def table_rows(self) -> list[dict[str, object]]:
        return [{"tool": c.tool, "error": c.is_error, "result": str(c.result)[:160]} for c in self.calls]


def mcp_session(calls: Sequence[tuple[str, Mapping[str, JSONValue]]]) -> tuple[list[str], list[MCPCall]]:
    """Start the MCP server as a stdio subprocess (this environment, so ``LocalAWS`` reaches it): the tools
    it lists and the ``calls`` it answered, within MCP_TIMEOUT_S; its stderr goes to a temporary file (a
    notebook's stderr has no descriptor)."""
    import tempfile

    import anyio
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(
        command=sys.executable, args=["-m", "gemma4_t4.mcp_server"], env=dict(os.environ)
    )

    async def session() -> tuple[list[str], list[MCPCall]]:
        made: list[MCPCall] = []
        with anyio.fail_after(MCP_TIMEOUT_S), tempfile.TemporaryFile("w+") as errlog:
            async with Client(stdio_client(params, errlog=errlog)) as client:
                tools = sorted(t.name for t in (await client.list_tools()).tools)
                for name, arguments in calls:
                    reply = await client.call_tool(name, dict(arguments))
                    text = "\n".join(getattr(c, "text", "") for c in reply.content)
                    made.append(
                        MCPCall(
                            name,
                            dict(arguments),
                            bool(reply.is_error),
                            reply.structured_content if reply.structured_content is not None else text,
                        )
                    )
        return tools, made

    return signals.run_to_completion(session)


@dataclass(repr=False)  # IPython shows the table (Displayable), not the fields
class StockRefusal(Displayable):
    """AWS's stock vLLM image offered for a T4: refused before any AWS call, naming the fix."""

    message: str | None
    fix: str | None

    def caption(self) -> str:
        return "The stock vLLM image on a T4 (ml.g4dn.xlarge)"

    def table_rows(self) -> list[dict[str, object]]:
        return [{"refused": self.message is not None, "why": self.message or "-", "fix": self.fix or "-"}]

    def notes(self) -> list[str]:
        if self.message is None:
            return [
                "Not refused: a T4 deploy would start the stock image, which crashes at the first prefill."
            ]
        return [
            "Refused before anything was created or billed: the check reads the image's name, so a deploy "
            "that would crash on Turing never starts."
        ]


def stock_image_on_a_t4(region: str) -> StockRefusal:
    """Validate a T4 deploy of AWS's stock vLLM image (the rule every T4 deploy enforces)."""
    try:
        sagemaker.DeployConfig(
            instance_type="ml.g4dn.xlarge", region=region, image_uri=sagemaker.vllm_image_uri(region)
        )
    except Gemma4T4Error as refusal:
        return StockRefusal(refusal.message, refusal.fix)
    return StockRefusal(None, None)


@dataclass(repr=False)  # IPython shows the table (Displayable), not the fields
class Query(Displayable):
    """One question asked of the endpoint, and the same question streamed where a model answers."""

    question: str
    reply: InvokeResult
    streamed: StreamResult | None
    replies_from: str
    generated: bool  # from a model (AWS, or the tiny one), not canned by moto

    @property
    def tokens(self) -> int | None:
        return (self.reply.usage or {}).get("completion_tokens")

    def caption(self) -> str:
        return f"Q: {self.question}"

    def table_rows(self) -> list[dict[str, object]]:
        ttft = self.streamed.ttft_s * 1000 if self.streamed and self.streamed.ttft_s is not None else None
        return [
            {
                "reply": self.reply.text,
                "latency ms": self.reply.latency_s * 1000,
                "tokens": self.tokens,
                "finish": self.reply.finish_reason,
                "streamed: first token ms": ttft,
                "from": self.replies_from,
            }
        ]

    def notes(self) -> list[str]:
        took = f"{self.reply.latency_s * 1000:.0f} ms"
        if not self.generated:
            return [
                f"A canned stand-in reply ({took}): moto returned a queued text, so this shows the request "
                "and response format of /invocations, nothing about a model or its speed."
            ]
        if "tiny" in self.replies_from:
            return [
                f"{self.tokens} tokens in {took} from the tiny random Gemma 4 on this CPU: real generated "
                "tokens through the same SageMaker-runtime calls, but no sense and no GPU speed."
            ]
        return [
            f"{self.tokens} tokens in {took} from Gemma 4 on the endpoint: the round trip includes the "
            "network and SageMaker's front end as well as the decode."
        ]


def query(aws: AwsVenue, name: str, region: str, question: str) -> Query:
    """Ask ``question`` (a canned stand-in reply is queued where moto answers alone), then stream it: 32 tokens
    each way."""
    aws.canned(CANNED.get(question, "No canned reply for this question."))
    reply = sagemaker.invoke(name, region, question, max_tokens=32)
    streamed = aws.invoke_stream(name, region, question)
    return Query(question, reply, streamed, aws.replies_from, aws.generated)


class MCPTour(MCPSession):
    """Five tool calls through a real MCP client, with what each answer shows."""

    def notes(self) -> list[str]:
        config, delete = self.calls[-2].result, self.calls[-1].result
        return [
            f"{len(self.tools)} tools listed; {sum(not c.is_error for c in self.calls)} of {len(self.calls)} "
            "calls answered without an error.",
            f"get_deployment_config judged the stock image on a T4 valid={config.get('valid')}: "
            f"{str(config.get('problem'))[:120]}",
            f"delete_endpoint without confirm=True: refused={delete.get('refused')}, "
            f"deleted={delete.get('deleted')} (an assistant must ask before anything is destroyed).",
        ]


def mcp_tour(name: str, region: str, aws: AwsVenue) -> MCPTour:
    """Start `gemma4-t4 mcp` under a real MCP client and call five tools, as an assistant would."""
    aws.canned(CANNED[MCP_QUESTION])
    stock = sagemaker.vllm_image_uri(region)
    calls: list[tuple[str, dict[str, Any]]] = [
        ("get_endpoint_status", {"name": name, "region": region}),
        ("query_model", {"prompt": MCP_QUESTION, "endpoint_name": name, "region": region, "max_tokens": 32}),
        ("list_endpoints", {"regions": [region]}),
        ("get_deployment_config", {"instance_type": "ml.g4dn.xlarge", "region": region, "image_uri": stock}),
        ("delete_endpoint", {"name": name, "region": region}),  # no confirm=True: must refuse
    ]
    return MCPTour(*mcp_session(calls))


class IdleCost(Table):
    """What an endpoint left running costs, per instance type, against the expiry tag."""

    def __init__(self, ttl_hours: float):
        self.estimates = [sagemaker.estimate(t) for t in COST_INSTANCE_TYPES]
        self.ttl_hours = ttl_hours
        super().__init__(
            [row for e in self.estimates for row in e.table_rows()],
            "Published on-demand prices (AWS Price List API, 2026-09-30)",
        )

    def notes(self) -> list[str]:
        return [
            f"{e.instance_type}: ${e.usd_per_hour * self.ttl_hours:.2f} if it lives to its {self.ttl_hours:g} h "
            f"expiry tag, ${e.usd_per_hour * 24:.2f} if forgotten for a day."
            for e in self.estimates
            if e.usd_per_hour
        ] + ["An endpoint bills per hour it exists, serving or idle."]

    def figure(self) -> Any:
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(7, 4))
        for e in self.estimates:
            ax.plot(
                COST_HOURS, [h * (e.usd_per_hour or 0) for h in COST_HOURS], marker="o", label=e.instance_type
            )
        ax.axvline(self.ttl_hours, color="C3", linestyle="--", label=f"expiry tag ({self.ttl_hours:g} h)")
        ax.set(
            xlabel="hours the endpoint stays up",
            ylabel="USD (on-demand, us-east-2)",
            title="An idle endpoint still bills",
        )
        ax.legend()
        return fig


def _checks(instance_type: str, region: str, quotas: QuotaReport, image_uri: str, deployment: DeployResult,
            status: EndpointStatus, stock: StockRefusal, query: Query,
            estimate: CostEstimate) -> list[tuple[str, bool, str]]:
    reply, streamed, generated = query.reply, query.streamed, query.generated
    needs_fix = sagemaker.DeployConfig(instance_type=instance_type).needs_fixed_image
    real_stream = bool(
        streamed
        and streamed.text.strip()
        and is_real_number(streamed.ttft_s)
        and streamed.ttft_s <= streamed.total_s
    )
    return [
        (
            "the quota",
            bool(quotas.rows) and region in quotas.regions_with_capacity(instance_type),
            f"{region} has no {instance_type} endpoint quota",
        ),
        (
            "the deploy",
            deployment.success and deployment.status == "InService",
            str(deployment.failure_reason),
        ),
        ("the endpoint status", status.exists and status.status == "InService", f"status {status.status}"),
        (
            "the stock image refusal",
            bool(stock.message and "Turing" in stock.message),
            "the stock image was not refused for Turing",
        ),
        (
            "the image",
            not needs_fix or images.carries_turing_fix(image_uri),
            f"{image_uri} lacks the Turing fix",
        ),
        (
            "the reply",
            bool(reply.text.strip()) and is_real_number(reply.latency_s),
            f"empty reply or latency {reply.latency_s!r}",
        ),
        (
            "the generated tokens",
            not generated or bool(query.tokens and "canned" not in reply.text),
            f"{query.tokens} tokens counted by the server",
        ),
        ("the streamed reply", not generated or real_stream, "no streamed text or first-token time"),
        ("the estimated $/hour", is_real_number(estimate.usd_per_hour), f"no price for {instance_type}"),
    ]


def _mcp_checks(mcp: MCPTour) -> list[tuple[str, bool, str]]:
    config, delete = mcp.calls[-2].result, mcp.calls[-1].result
    return [
        (
            "the MCP tools",
            len(mcp.tools) >= 20 and "build_t4_image" in mcp.tools,
            f"{len(mcp.tools)} tools",
        ),
        ("the MCP calls", not any(c.is_error for c in mcp.calls), "a tool call answered an error"),
        (
            "the MCP stock-image verdict",
            config.get("valid") is False and "Turing" in str(config.get("problem")),
            "the stock image was judged valid on a T4",
        ),
        (
            "the MCP delete without confirm",
            bool(delete.get("refused")) and not delete.get("deleted"),
            "an unconfirmed delete was not refused",
        ),
    ]


def compare(
    target: str,
    instance_type: str,
    region: str,
    quotas: QuotaReport,
    image_uri: str,
    deployment: DeployResult,
    status: EndpointStatus,
    stock: StockRefusal,
    query: Query,
    mcp: MCPTour,
    costs: IdleCost,
) -> nb.PartResults:
    """Check every figure of the part (a missing or impossible one is refused with its name and why)."""
    estimate = sagemaker.estimate(instance_type)
    checks = _checks(instance_type, region, quotas, image_uri, deployment, status, stock, query, estimate)
    nb.refuse_failed_check(1, checks + _mcp_checks(mcp))
    results: dict[str, nb.SummaryValue] = {
        "target": target,
        "region": region,
        "instance type": instance_type,
        "regions with quota": len(quotas.regions_with_capacity(instance_type)),
        "deploy seconds": deployment.elapsed_s,
        "endpoint status": status.status,
        "query latency ms": query.reply.latency_s * 1000,
        "reply tokens": query.tokens,
        "reply from": query.replies_from,
        "stock image on a T4 refused": stock.message is not None,
        "estimated $/hour": estimate.usd_per_hour,
        "MCP tools": len(mcp.tools),
        "MCP delete without confirm refused": bool(mcp.calls[-1].result.get("refused")),
    }
    return nb.PartResults(1, results, [costs])
