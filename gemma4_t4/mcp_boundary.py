"""The assistant's boundary: what the MCP tools let an assistant set, generated from each setting's declaration.

The vLLM settings (``foundation.launch_record.VLLMSettings``), the deploy settings (``sagemaker.config.DeployConfig``)
and the launch settings (``foundation.launch_record.ServerSettings``) each declare an
:class:`~gemma4_t4.foundation.launch_record.Assistant` beside their help: offered or withheld, and within which
bounds (limits, choices, allowed keys). The tools' parameters are generated from that (:func:`offered`), so the SDK
refuses a value outside them before a tool runs, and a withheld setting is not a parameter at all (an unknown
argument is refused, named: :func:`strict_arguments`). Every other tool parameter is typed here with its limits
(``tests/mcp/test_mcp_boundary.py`` holds why an assistant may pass each), and a tool that bills or
deletes is registered (:func:`tool`) only with a strict ``confirm``; ``tests/mcp/test_mcp_boundary.py`` checks every
parameter of every tool against these.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.launch_record import (
    Assistant,
    assistant_boundary,
    help_for,
    offered_default,
    user_settings,
    value_type,
)
from gemma4_t4.sagemaker import image as images
from gemma4_t4.sagemaker.config import DeployConfig, check_assistant_env
from gemma4_t4.sagemaker.cost import MAX_ASSISTANT_BUDGET_USD, BilledBound, billed_bound

if TYPE_CHECKING:
    from mcp.server.mcpserver.tools import Tool
    from mcp.types import ToolAnnotations


ToolFunction = Callable[..., Any]  # a tool's function as written, and as the decorators hand it on

@dataclass(frozen=True)
class Offered:
    """One setting as an MCP parameter: its name, the declared type, the tool's default, help, boundary, and the
    setting's own limits (pydantic's constraints, which the boundary's may only narrow)."""

    parameter: str
    kind: Any
    default: Any
    help: str
    rule: Assistant
    required: bool = False
    limits: tuple[Any, ...] = ()


def offered(model: type[BaseModel], sagemaker: bool) -> list[Offered]:
    """The one MCP-signature source: the settings of ``model`` an assistant sets (their declared boundary), with
    the help and default its flags have; ``sagemaker``: the deploy tools (else a local server's start tool, which
    withholds the settings declared ``sagemaker_only``). A setting without a boundary is refused, named."""
    found = []
    for name, field in user_settings(model).items():
        rule = assistant_boundary(field)
        if rule is None:
            raise TypeError(f"{model.__name__}.{name} declares no assistant boundary (setting(..., assistant=...))")
        if rule["sets"] and (sagemaker or "sagemaker_only" not in rule):
            default = rule.get("default", offered_default(field))
            text = field.description if field.is_required() else help_for(model, name, default)
            found.append(Offered(name, field.annotation, default, str(text), rule, field.is_required(),
                                 tuple(field.metadata)))
    return found


def parameter_type(offered: Offered) -> Any:
    """The parameter's type with its boundary in the schema: the setting's limits narrowed by the boundary's, a
    Literal of the choices, the allowed keys. Null is accepted where the setting is optional and means the default
    (:func:`takes_settings`)."""
    rule, kind = offered.rule, offered.kind
    base = value_type(kind)
    if "choices" in rule:
        choice = Literal[tuple(rule["choices"])]
        base = list[choice] if typing.get_origin(base) is list else choice
    if "keys" in rule:
        base = dict[Literal[tuple(rule["keys"])], str]
    bounds = {k: rule[k] for k in ("ge", "le") if k in rule}  # type: ignore[literal-required]
    return Annotated[base if offered.required else base | None, *offered.limits,
                     Field(description=offered.help, **bounds)]


def takes_settings(offered: Iterable[Offered]) -> Callable[[ToolFunction], ToolFunction]:
    """``fn(..., **settings)`` takes each offered setting as a keyword parameter, typed within its boundary; a
    null or missing one reaches ``fn`` as its default (null means the default, as the schema says)."""
    offered = list(offered)
    defaults = {o.parameter: o.default for o in offered}

    def wrap(fn: ToolFunction) -> ToolFunction:
        own = inspect.signature(fn, eval_str=True)
        declared = [inspect.Parameter(o.parameter, inspect.Parameter.KEYWORD_ONLY, annotation=parameter_type(o),
                                      default=inspect.Parameter.empty if o.required else o.default)
                    for o in offered]
        kept = [p for p in own.parameters.values() if p.kind is not p.VAR_KEYWORD]

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            filled = {k: (defaults[k] if v is None and k in defaults else v) for k, v in kwargs.items()}
            return fn(*args, **filled)

        call.__signature__ = own.replace(parameters=declared + kept)  # type: ignore[attr-defined]
        return call

    return wrap


# Tool parameter types with their limits: the SDK validates them before a tool runs, so a bad value
# never reaches AWS or a vLLM launch. Only a real JSON true confirms ("yes" and 1 do not).
Confirm = Annotated[StrictBool, Field(description="true (a JSON boolean) to act; anything else only describes")]
UserPort = Annotated[int, Field(ge=1024, le=65535, description="an unprivileged TCP port (1024..65535)")]
Seconds = Annotated[float, Field(gt=0)]
Region = Annotated[str | None, Field(description="AWS region (default: $AWS_REGION, else us-east-2)")]
Tokens = Annotated[int, Field(ge=1, le=32_768, description="tokens to generate")]
Temperature = Annotated[float, Field(ge=0, le=2, description="sampling temperature")]

@dataclass(frozen=True)
class ToolSpec:
    """One tool: its function, its MCP annotations, and whether it acts only with confirm=True."""

    fn: ToolFunction
    annotations: ToolAnnotations
    confirm: bool = False
    interruptible: bool = False  # a shutdown cancels it instead of waiting for it


REGISTRY: dict[str, ToolSpec] = {}


def tool(annotations: ToolAnnotations, confirm: bool = False,
         interruptible: bool = False) -> Callable[[ToolFunction], ToolFunction]:
    """Register a tool under its function's name. ``confirm=True``: it must take ``confirm: bool = False``."""

    def register(fn: ToolFunction) -> ToolFunction:
        parameter = inspect.signature(fn).parameters.get("confirm")
        if confirm and (parameter is None or parameter.default is not False):
            raise TypeError(f"{fn.__name__} needs confirmation but has no `confirm: Confirm = False` parameter")
        if confirm and parameter.annotation not in ("Confirm", Confirm):  # "yes" or 1 must not confirm
            raise TypeError(f"{fn.__name__}'s confirm must be typed Confirm (a strict boolean)")
        REGISTRY[fn.__name__] = ToolSpec(fn, annotations, confirm, interruptible)
        return fn

    return register


DEFAULT_BUDGET_USD = 10.0  # four hours of one T4 is ~$2.94; 20 of the largest for a week is refused
BudgetUSD = Annotated[float, Field(gt=0, le=MAX_ASSISTANT_BUDGET_USD, description=(
    f"the most this deployment may bill, USD: instances x ttl_hours x $/hour must fit (default "
    f"{DEFAULT_BUDGET_USD:g}, at most {MAX_ASSISTANT_BUDGET_USD:g}; a person deploys past it with the CLI)"))]


def assistant_deploy(config: DeployConfig, budget_usd: float) -> BilledBound:
    """What an assistant's deploy must also pass, before anything is billed: container variables from the
    allow-list only, and the worst case (every instance for its whole lifetime) within the budget."""
    check_assistant_env(config.extra_env)
    image = config.image_uri
    if image is not None and (image != images.vllm_image_uri(config.region, images.image_tag(image))
                              or images.parse_tag(images.image_tag(image)) is None):
        raise Gemma4T4Error(
            f"image {image} is not AWS's vLLM DLC at a pinned tag: an assistant deploys no other image",
            fix="leave image_uri out (on a T4: the newest fixed image in your ECR); a person deploys another image "
            "with gemma4-t4 sagemaker deploy --image-uri")
    if config.extra_args or config.role_arn or config.allow_unfixed_image:
        raise Gemma4T4Error("an assistant sets no raw vLLM argument, role or unfixed image",
                            fix="a person deploys those with gemma4-t4 sagemaker deploy")
    return billed_bound(config.instance_types, config.billed_instances_at_most, config.ttl_hours, budget_usd)


def strict_arguments(tool: Tool) -> Tool:
    """An argument the tool does not declare is refused, naming it (the SDK's argument model drops
    unknown names silently: a misspelt ``confirm`` or a workload option outside ``spec`` would run
    the tool with its defaults). The schema says so too (``additionalProperties: false``)."""
    loose = tool.fn_metadata.arg_model
    known = {field.alias or name for name, field in loose.model_fields.items()}

    def refuse_unknown(cls: type, arguments: object) -> object:
        unknown = sorted(set(arguments) - known) if isinstance(arguments, dict) else []
        if unknown:
            raise ValueError(f"{tool.name} takes no argument {', '.join(map(repr, unknown))}; it takes: "
                             f"{', '.join(sorted(known)) or 'no arguments'}" + ("; workload options go inside spec"
                                                              if "spec" in known else ""))
        return arguments

    strict = type(loose.__name__, (loose,), {
        "model_config": ConfigDict(**loose.model_config, extra="forbid"), "__module__": loose.__module__,
        "_refuse_unknown": model_validator(mode="before")(classmethod(refuse_unknown)),
    })
    tool.fn_metadata.arg_model = strict
    tool.parameters = strict.model_json_schema(by_alias=True)
    return tool
