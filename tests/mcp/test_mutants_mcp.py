"""What an assistant sees through the MCP server, pinned in-process (issue 44): the parameters each tool offers and
their bounds, what an assistant's deploy is refused, secret masking, error answers, the local chat request, the
exit clean-up's decisions and log lines, and the shutdown. Each tool is called as the server calls it (its
adapter, its generated signature); nothing here starts a subprocess, a server or AWS."""

from __future__ import annotations

import asyncio
import inspect
import io
import json
import logging
import signal
import sys
import threading
import types
import urllib.error
import urllib.request
from typing import Any, Literal

import pytest
from mcp import Client
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field, TypeAdapter, ValidationError

from gemma4_t4 import mcp_answers, mcp_boundary, mcp_server
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation import signals
from gemma4_t4.foundation.launch_record import (
    assistant_boundary,
    assistant_sets,
    offered_default,
    user_settings,
)
from gemma4_t4.mcp_boundary import (
    Offered,
    assistant_deploy,
    offered,
    parameter_type,
    takes_settings,
)
from gemma4_t4.mcp_server import Confirm, QueryResult, _adapter
from gemma4_t4.sagemaker import image as images
from gemma4_t4.sagemaker.config import DeployConfig
from gemma4_t4.sagemaker.deploy import DeployResult
from gemma4_t4.serving.server_config import WHEN_UNSET, ServerConfig

# a pinned DLC tag other than the package's default, so "the tag in the URI" and "the default tag" differ
OTHER_TAG = "0.11.0-gpu-py312-cu128-ubuntu22.04-sagemaker-v1.0"


def _accepts(annotation: Any, value: Any) -> bool:
    try:
        TypeAdapter(annotation).validate_python(value)
    except ValidationError:
        return False
    return True


# -- the generated parameters (mcp_boundary) ---------------------------------------------------------------
def test_a_bounded_setting_refuses_values_outside_its_limits_and_null_means_unset():
    """A setting bounded by the assistant's ge/le, or by its own limits (gt), is refused outside them by the
    schema; null is accepted (its default); the assistant's bound narrows the setting's own."""
    port = parameter_type(Offered("port", int | None, None, "a port", assistant_sets(ge=1024, le=65535)))
    assert [_accepts(port, v) for v in (1023, 1024, 65535, 65536, None)] == [False, True, True, False, True]
    share = parameter_type(Offered("share", float, 0.5, "a share", assistant_sets(), limits=tuple(Field(gt=0).metadata)))
    assert [_accepts(share, v) for v in (0, 0.01, None)] == [False, True, True]
    narrowed = parameter_type(Offered("n", int, 1, "n", assistant_sets(le=8), limits=tuple(Field(ge=0, le=64).metadata)))
    assert [_accepts(narrowed, v) for v in (-1, 0, 8, 9)] == [False, True, True, False]
    schema = TypeAdapter(port).json_schema()
    assert schema["description"] == "a port"


def test_a_required_setting_refuses_null():
    """The model to serve has no default: null is refused, even where the declared type allows None."""
    model = parameter_type(Offered("model", str | None, None, "hub id", assistant_sets(), required=True))
    assert _accepts(model, "google/gemma-4-E2B-it") and not _accepts(model, None)


def test_choices_bound_a_value_and_each_item_of_a_list():
    one = parameter_type(
        Offered("target", str | None, "cpu", "t4 or cpu", assistant_sets(choices=["t4", "cpu"]))
    )
    assert _accepts(one, "t4") and _accepts(one, None) and not _accepts(one, "tpu")
    many = parameter_type(
        Offered("types", list[str] | None, None, "types", assistant_sets(choices=["a", "b"]))
    )
    assert _accepts(many, ["a", "b"]) and not _accepts(many, ["a", "c"]) and not _accepts(many, "a")


def test_a_mapping_takes_only_the_allowed_keys():
    env = parameter_type(
        Offered("extra_env", dict[str, str] | None, None, "env", assistant_sets(keys=["SM_A"]))
    )
    assert _accepts(env, {"SM_A": "1"}) and not _accepts(env, {"LD_PRELOAD": "/x.so"})


def test_takes_settings_gives_a_tool_the_offered_settings_and_null_means_the_default():
    """The tool's signature (what the SDK makes the schema from) holds each offered setting as a keyword with its
    default (none where required) and the tool's own parameters; a null from the client reaches it as the default."""
    offered = [
        Offered("size", int | None, 4, "how many", assistant_sets(ge=1)),
        Offered("name", str, None, "what", assistant_sets(), required=True),
    ]

    def tool(*, budget: float = 1.0, **settings: object) -> dict:
        return {"budget": budget, **settings}

    wrapped = takes_settings(offered)(tool)
    parameters = inspect.signature(wrapped).parameters
    assert list(parameters) == ["size", "name", "budget"]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters.values())
    assert parameters["size"].default == 4 and parameters["name"].default is inspect.Parameter.empty
    assert parameters["budget"].annotation is float  # a real type, not the string of a postponed annotation
    assert not _accepts(parameters["size"].annotation, 0) and _accepts(parameters["size"].annotation, 1)
    assert wrapped(size=None, name="x", budget=None) == {"budget": None, "size": 4, "name": "x"}
    assert wrapped(size=7, name="x") == {"budget": 1.0, "size": 7, "name": "x"}


def test_deploy_endpoint_offers_each_deploy_setting_an_assistant_sets_as_declared():
    given = {o.parameter: o for o in offered(DeployConfig, sagemaker=True)}
    declared = user_settings(DeployConfig)
    assert "instance_type" in given and "extra_env" in given
    assert "role_arn" not in given and "extra_args" not in given
    for name, o in given.items():
        field = declared[name]
        assert (o.kind, o.default, o.rule, o.required) == (
            field.annotation,
            offered_default(field),
            assistant_boundary(field),
            False,
        )
        assert o.help.startswith(field.description)
    assert given["instance_type"].default == "ml.g4dn.xlarge"
    assert given["max_model_len"].default is None and "(SageMaker default 8192)" in given["max_model_len"].help


def test_start_vllm_server_offers_the_launch_settings_with_the_mcp_defaults():
    """model is required; port defaults to none (a free one) where serve start's is 8000; max_model_len and
    max_num_seqs to none (the target's default, as serve start's); target cpu, as serve start's; each has its
    help and its boundary; the environment, offered for SageMaker, is withheld from a local server."""
    given = {o.parameter: o for o in offered(ServerConfig, sagemaker=False)}
    assert given["model"].required and given["model"].default is None
    assert given["port"].default is None and given["port"].help == "TCP port, 1024..65535"
    # a setting left unset says what it gets then
    assert given["max_num_batched_tokens"].help == "prefill chunk (t4 default 4096)"
    assert given["max_model_len"].help == f"tokens per sequence, prompt + output ({WHEN_UNSET['max_model_len']})"
    assert given["max_model_len"].default is None and given["max_num_seqs"].default is None
    assert given["target"].default == "cpu" and given["target"].kind == Literal["t4", "cpu"]
    assert any(getattr(limit, "ge", None) == 1024 for limit in given["port"].limits) and given["port"].kind is int
    assert not given["target"].required and given["target"].help.startswith("t4 (this GPU) or cpu")
    assert {"host", "api_key", "extra_args", "extra_env", "python", "work_dir"}.isdisjoint(given)


def test_a_launch_setting_without_a_boundary_decision_stops_the_server_naming_it():
    from pydantic import Field

    class Sneaky(ServerConfig):
        sneaky: int = Field(1, description="x")

    with pytest.raises(TypeError, match=r"Sneaky\.sneaky declares no assistant boundary"):
        offered(Sneaky, sagemaker=False)


def _config(**changes: Any) -> DeployConfig:
    return DeployConfig(instance_type="ml.g6.xlarge").replaced(**changes)


def test_an_assistant_deploy_is_bounded_by_its_budget():
    bound = assistant_deploy(_config(max_instances=2, min_instances=1, ttl_hours=3.0), 50.0)
    assert bound.instances == 2 and bound.hours == 3.0 and bound.budget_usd == 50.0
    assert bound.instance_type == "ml.g6.xlarge" and bound.usd == pytest.approx(2 * 3.0 * bound.usd_per_hour)
    with pytest.raises(Gemma4T4Error, match="over the budget of"):
        assistant_deploy(_config(max_instances=2, min_instances=1, ttl_hours=3.0), 1.0)


def test_an_assistant_deploys_the_dlc_at_a_pinned_tag_only():
    dlc = images.vllm_image_uri("us-east-2", OTHER_TAG)
    assert assistant_deploy(_config(image_uri=dlc), 10.0).instances == 1
    for image in (
        images.vllm_image_uri("us-east-2", "latest"),
        f"123456789012.dkr.ecr.us-east-2.amazonaws.com/vllm:{OTHER_TAG}",
    ):
        with pytest.raises(Gemma4T4Error) as refused:
            assistant_deploy(_config(image_uri=image), 10.0)
        assert refused.value.message == (
            f"image {image} is not AWS's vLLM DLC at a pinned tag: an assistant deploys no other image"
        )
        assert refused.value.fix == (
            "leave image_uri out (on a T4: the newest fixed image in your ECR); a person "
            "deploys another image with gemma4-t4 sagemaker deploy --image-uri"
        )
    with pytest.raises(Gemma4T4Error, match="is in us-west-2 but the endpoint is in us-east-2"):
        _config(image_uri=images.vllm_image_uri("us-west-2", OTHER_TAG))  # never built, so never deployed


@pytest.mark.parametrize(
    "changes",
    [
        {"extra_args": ["--trust-remote-code"]},
        {"role_arn": "arn:aws:iam::123456789012:role/x"},
        {"allow_unfixed_image": True},
    ],
)
def test_an_assistant_sets_no_raw_argument_role_or_unfixed_image(changes):
    with pytest.raises(Gemma4T4Error) as refused:
        assistant_deploy(_config(**changes), 10.0)
    assert refused.value.message == "an assistant sets no raw vLLM argument, role or unfixed image"
    assert refused.value.fix == "a person deploys those with gemma4-t4 sagemaker deploy"


@pytest.mark.parametrize("key", ["LD_PRELOAD", "HF_ENDPOINT", "SM_VLLM_TRUST_REMOTE_CODE"])
def test_an_assistant_may_not_set_another_variable(key):
    """LD_PRELOAD, HF_ENDPOINT or another SM_VLLM_* from an MCP client is refused by the deploy tools' schema:
    their extra_env takes the allow-listed keys only."""
    extra_env = next(o for o in offered(DeployConfig, sagemaker=True) if o.parameter == "extra_env")
    adapter = TypeAdapter(parameter_type(extra_env))
    adapter.validate_python({"SM_VLLM_ENFORCE_EAGER": "true"})
    with pytest.raises(ValidationError):
        adapter.validate_python({"SM_VLLM_ENFORCE_EAGER": "true", key: "1"})


def test_an_assistant_deploy_refuses_an_allow_listed_variable_with_another_value():
    """Its keys are the schema's (test_mcp_boundary); the values are checked here, the whole value."""
    with pytest.raises(Gemma4T4Error, match="SM_VLLM_ENFORCE_EAGER='true; rm' is not a value it takes"):
        assistant_deploy(_config(extra_env={"SM_VLLM_ENFORCE_EAGER": "true; rm"}), 10.0)


# -- answers, errors and secrets (mcp_server) --------------------------------------------------------------
def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_a_six_character_secret_is_masked_and_a_plain_setting_is_not(monkeypatch):
    """HF_TOKEN=abc123 and a 5-character secret are masked in an answer (the package's rule keeps values
    of 3 characters and more); a 2-character secret value (a stray "1"-like value) and the value of a
    variable whose name is not a secret's stay as they are."""
    monkeypatch.setenv("HF_TOKEN", "abc123")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "abcde")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "q7")
    monkeypatch.setenv("GEMMA4_T4_PLAIN_SETTING", "visible-value")

    def answer() -> QueryResult:
        return QueryResult(target="x", text="token abc123, key abcde, short q7, setting visible-value", latency_s=0.0)

    result = _run(_adapter(answer)())
    assert result.text == "token ***, key ***, short q7, setting visible-value"
    assert isinstance(result, QueryResult)


def test_an_answer_without_a_secret_is_returned_as_it_is(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefgh")
    original = QueryResult(target="x", text="nothing secret", latency_s=0.5)
    result = _run(_adapter(lambda: original)())
    assert result is original


def test_the_adapter_passes_positional_and_keyword_arguments_and_keeps_the_signature():
    def echo(prompt: str, *, max_tokens: int = 1) -> QueryResult:
        return QueryResult(target="x", text=f"{prompt}:{max_tokens}", latency_s=0.0)

    wrapped = _adapter(echo)
    assert _run(wrapped("hi", max_tokens=3)).text == "hi:3"
    signature = inspect.signature(wrapped)
    assert signature.return_annotation is QueryResult and signature.parameters["max_tokens"].annotation is int


def test_a_failed_tool_answers_type_message_and_fix_with_secrets_masked(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secretvalue")

    def fails() -> QueryResult:
        raise Gemma4T4Error("cannot reach hf_secretvalue", fix="check the token")

    with pytest.raises(ToolError) as error:
        _run(_adapter(fails)())
    assert str(error.value) == "Gemma4T4Error: cannot reach ***\n  fix: check the token"


def test_a_tool_cancelled_by_the_shutdown_says_so():
    def cancelled() -> QueryResult:
        raise signals.Terminated(signal.SIGTERM)

    with pytest.raises(
        ToolError,
        match=r"^cancelled: the MCP server is shutting down \(.*\); what this call had "
        "created was rolled back$",
    ):
        _run(_adapter(cancelled)())


def test_tool_error_text_names_the_type_except_for_an_unexpected_error():
    assert mcp_server.tool_error_text(Gemma4T4Error("msg", fix="do it")) == "Gemma4T4Error: msg\n  fix: do it"
    assert mcp_server.tool_error_text(Gemma4T4Error("msg")) == "Gemma4T4Error: msg"
    text = mcp_server.tool_error_text(ValueError("boom"))
    assert text.startswith("ValueError: boom\n  fix: ") and not text.startswith("UnexpectedError")


def test_a_shutdown_waits_for_a_billing_tool_but_not_for_a_benchmark():
    """A deploy in flight holds the shutdown (it may have to roll back); a benchmark (interruptible) does not."""
    seen = {}

    def deploy_like() -> QueryResult:
        seen["deploy"] = mcp_server._IN_FLIGHT.wait_idle(0)
        return QueryResult(target="x", text="", latency_s=0.0)

    def bench_like() -> QueryResult:
        seen["bench"] = mcp_server._IN_FLIGHT.wait_idle(0)
        return QueryResult(target="x", text="", latency_s=0.0)

    _run(_adapter(deploy_like)())
    _run(_adapter(bench_like, interruptible=True)())
    assert seen == {"deploy": False, "bench": True}
    assert mcp_server._IN_FLIGHT.wait_idle(0)


def test_in_flight_counts_each_call_until_it_ends():
    flight = mcp_server._InFlight()
    assert flight.wait_idle(0)
    with flight:
        with flight:
            assert not flight.wait_idle(0)
        assert not flight.wait_idle(0)
    assert flight.wait_idle(0)
    uncounted = mcp_server._InFlight(counted=False)
    with uncounted:
        assert uncounted.wait_idle(0)


@pytest.fixture
def shutting_down():
    """The server's shutdown flag set (as SIGHUP sets it), cleared again after the test."""
    mcp_server._SHUTDOWN.set()
    mcp_server._STOP_SIGNAL[0] = signal.SIGHUP
    yield
    mcp_server._SHUTDOWN.clear()
    mcp_server._STOP_SIGNAL[0] = signal.SIGTERM


def test_no_tool_starts_once_the_server_is_shutting_down(shutting_down):
    with pytest.raises(Gemma4T4Error) as refused, mcp_server._InFlight():
        pass
    assert refused.value.message == "the MCP server is shutting down"
    assert refused.value.fix == "start it again and repeat the call"


def test_a_billing_wait_ends_with_the_signal_that_stopped_the_server(shutting_down):
    with pytest.raises(signals.Terminated) as stopped:
        mcp_server._cancellable_sleep(30)
    assert stopped.value.signum == signal.SIGHUP


def test_a_billing_wait_sleeps_its_time_when_nothing_stops_it():
    """The wait between polls lasts its seconds: a shutdown later than that does not end it (it returns)."""
    later = threading.Timer(2.0, mcp_server._SHUTDOWN.set)
    later.start()
    try:
        assert mcp_server._cancellable_sleep(0.01) is None
    finally:
        later.cancel()
        mcp_server._SHUTDOWN.clear()


def test_a_billing_wait_of_none_is_refused_not_endless():
    """None is no number of seconds: Event.wait(None) would block the tool's thread until a shutdown."""
    outcome: list[BaseException | None] = []

    def wait() -> None:
        try:
            mcp_server._cancellable_sleep(None)  # type: ignore[arg-type]
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion below
            outcome.append(exc)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    waiter.join(timeout=5)
    try:
        assert not waiter.is_alive(), "a wait of None never returned"
        assert isinstance(outcome[0], TypeError)
    finally:
        mcp_server._SHUTDOWN.set()  # ends the wait of the code before the fix, should it still be waiting
        waiter.join(timeout=5)
        mcp_server._SHUTDOWN.clear()


def test_a_confirming_tool_must_take_a_strict_confirm_that_defaults_to_false():
    def no_confirm() -> None: ...

    def true_default(confirm: Confirm = True) -> None: ...

    def loose(confirm: bool = False) -> None: ...

    with pytest.raises(
        TypeError, match=r"^no_confirm needs confirmation but has no `confirm: Confirm = False` "
    ):
        mcp_server.tool(mcp_server.DESTRUCTIVE, confirm=True)(no_confirm)
    with pytest.raises(TypeError, match="^true_default needs confirmation"):
        mcp_server.tool(mcp_server.DESTRUCTIVE, confirm=True)(true_default)
    with pytest.raises(TypeError, match=r"^loose's confirm must be typed Confirm \(a strict boolean\)$"):
        mcp_server.tool(mcp_server.DESTRUCTIVE, confirm=True)(loose)
    assert not {"no_confirm", "true_default", "loose"} & set(mcp_server.REGISTRY)


def test_a_registered_tool_keeps_its_annotations_confirmation_and_interruptibility():
    def strict(confirm: Confirm = False) -> None: ...

    def plain() -> None: ...

    def bench() -> None: ...

    try:
        assert mcp_server.tool(mcp_server.DESTRUCTIVE, confirm=True)(strict) is strict
        mcp_server.tool(mcp_server.READ_ONLY)(plain)
        mcp_server.tool(mcp_server.CREATES, interruptible=True)(bench)
        assert mcp_server.REGISTRY["bench"] == mcp_boundary.ToolSpec(bench, mcp_server.CREATES, False, True)
        assert mcp_server.REGISTRY["strict"] == mcp_boundary.ToolSpec(
            strict, mcp_server.DESTRUCTIVE, True, False
        )
        assert mcp_server.REGISTRY["plain"] == mcp_boundary.ToolSpec(plain, mcp_server.READ_ONLY, False, False)
    finally:
        mcp_server.REGISTRY.pop("strict", None)
        mcp_server.REGISTRY.pop("plain", None)
        mcp_server.REGISTRY.pop("bench", None)
    assert (
        mcp_server.REGISTRY["run_benchmark"].interruptible
        and not mcp_server.REGISTRY["deploy_endpoint"].interruptible
    )


def test_the_work_dir_is_the_environments_else_the_default(monkeypatch):
    monkeypatch.setenv("GEMMA4_T4_WORK_DIR", "/tmp/elsewhere")
    assert mcp_server._work_dir() == "/tmp/elsewhere"
    monkeypatch.delenv("GEMMA4_T4_WORK_DIR")
    assert mcp_server._work_dir() == mcp_server.DEFAULT_WORK_DIR


# -- the exit clean-up of unwatched deploys ----------------------------------------------------------------
class FakeSageMaker:
    """What the exit clean-up calls: an endpoint's status, its CreationTime and the deletes (recorded)."""

    def __init__(
        self,
        status: str | Exception = "Creating",
        created: float | None = None,
        delete_fails: Exception | None = None,
    ) -> None:
        import datetime as dt

        self.status, self.deleted, self.delete_fails = status, [], delete_fails
        self.names: set[str] = set()  # the endpoints it knows (each watch adds its own)
        self.created = dt.datetime.fromtimestamp(created, dt.UTC) if created is not None else None

    def describe_endpoint(self, EndpointName: str) -> dict:
        if EndpointName not in self.names:  # as SageMaker answers for a name it does not know
            raise LookupError(f"Could not find endpoint {EndpointName}")
        if isinstance(self.status, Exception):
            raise self.status
        return {"EndpointStatus": self.status, "CreationTime": self.created}

    def _delete(self, what: str) -> None:
        if self.delete_fails is not None:
            raise self.delete_fails
        self.deleted.append(what)

    def delete_endpoint(self, EndpointName: str) -> None:
        self._delete(f"endpoint:{EndpointName}")

    def delete_endpoint_config(self, EndpointConfigName: str) -> None:
        self._delete(f"endpoint-config:{EndpointConfigName}")

    def delete_model(self, ModelName: str) -> None:
        self._delete(f"model:{ModelName}")


def _watch(name: str, sm: FakeSageMaker, done: bool = False, created_at: dict | None = None) -> Any:
    result = DeployResult(
        name=name,
        region="us-east-2",
        status="Creating",
        success=True,
        created=[f"model:{name}", f"endpoint-config:{name}", f"endpoint:{name}"],
        created_at=created_at or {},
    )
    event = threading.Event()
    if done:
        event.set()
    sm.names.add(name)
    watcher = types.SimpleNamespace(sm=sm, result=result, done=event)
    mcp_server._WATCHES.by_key[("us-east-2", name)] = watcher
    return watcher


@pytest.fixture
def watches():
    saved = dict(mcp_server._WATCHES.by_key)
    mcp_server._WATCHES.by_key.clear()
    yield mcp_server._WATCHES.by_key
    mcp_server._WATCHES.by_key.clear()
    mcp_server._WATCHES.by_key.update(saved)


def _log(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "gemma4_t4.mcp"]


def test_at_exit_an_endpoint_not_yet_in_service_is_deleted_and_the_log_says_so(watches, caplog):
    caplog.set_level(logging.WARNING, logger="gemma4_t4.mcp")
    sm = FakeSageMaker("Creating")
    watcher = _watch("g4-a", sm)
    mcp_server._settle_watches()
    assert sm.deleted == ["endpoint:g4-a", "endpoint-config:g4-a", "model:g4-a"]
    assert (watcher.result.status, watcher.result.success) == ("Deleted at exit", False)
    assert watcher.result.rolled_back == sm.deleted and watches == {}
    assert _log(caplog) == [
        (
            "WARNING",
            "exiting: deleted endpoint g4-a in us-east-2 (Creating, not yet InService: "
            "nothing would watch it after this exit): endpoint:g4-a, "
            "endpoint-config:g4-a, model:g4-a",
        )
    ]


def test_at_exit_an_in_service_endpoint_stays_and_a_settled_one_is_left_alone(watches, caplog):
    caplog.set_level(logging.WARNING, logger="gemma4_t4.mcp")
    serving, settled = FakeSageMaker("InService"), FakeSageMaker("Creating")
    kept = _watch("g4-kept", serving)
    _watch("g4-settled", settled, done=True)
    later = FakeSageMaker("Creating")
    _watch("g4-later", later)
    mcp_server._settle_watches()
    assert serving.deleted == [] and settled.deleted == [] and kept.result.status == "Creating"
    assert later.deleted  # the loop goes on after an endpoint that stays
    assert _log(caplog)[0] == (
        "WARNING",
        "exiting: endpoint g4-kept in us-east-2 is InService and stays (it bills "
        "until deleted or its expiry tag's reap; delete_endpoint deletes it)",
    )
    assert list(watches) == [("us-east-2", "g4-settled")]


def test_at_exit_an_endpoint_whose_status_cannot_be_read_is_deleted(watches, caplog):
    caplog.set_level(logging.WARNING, logger="gemma4_t4.mcp")
    sm = FakeSageMaker(ConnectionError("no route"))
    watcher = _watch("g4-b", sm)
    mcp_server._settle_watches()
    assert sm.deleted == ["endpoint:g4-b", "endpoint-config:g4-b", "model:g4-b"]
    assert watcher.result.status == "Deleted at exit"
    assert "(unknown (ConnectionError), not yet InService" in _log(caplog)[0][1]


def test_at_exit_an_endpoint_without_a_status_in_the_answer_is_deleted_as_unknown(watches, caplog):
    caplog.set_level(logging.WARNING, logger="gemma4_t4.mcp")
    sm = FakeSageMaker("Creating")
    sm.describe_endpoint = lambda EndpointName: {}  # noqa: N803 - boto3's keyword
    _watch("g4-q", sm)
    mcp_server._settle_watches()
    assert sm.deleted and "g4-q in us-east-2 (?, not yet InService" in _log(caplog)[0][1]


def test_at_exit_a_watch_that_had_created_nothing_says_nothing_was_left(watches, caplog):
    caplog.set_level(logging.WARNING, logger="gemma4_t4.mcp")
    watcher = _watch("g4-n", FakeSageMaker("Creating"))
    watcher.result.created = []
    mcp_server._settle_watches()
    assert _log(caplog)[0][1].endswith(
        "(Creating, not yet InService: nothing would watch it after this exit): nothing left"
    )


def test_at_exit_a_failed_delete_is_logged_with_the_command_that_finishes_it(watches, caplog, monkeypatch):
    caplog.set_level(logging.WARNING, logger="gemma4_t4.mcp")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "SuperSecret123")
    first = FakeSageMaker("Failed", delete_fails=RuntimeError("denied with SuperSecret123"))
    _watch("g4-c", first)
    second = FakeSageMaker("Creating")
    _watch("g4-d", second)
    mcp_server._settle_watches()
    assert _log(caplog)[0] == (
        "ERROR",
        "exiting: could not delete endpoint g4-c in us-east-2 (Failed): denied "
        "with ***; run gemma4-t4 sagemaker delete g4-c --region us-east-2 --yes",
    )
    assert second.deleted  # one failure does not stop the others' clean-up


def test_at_exit_an_endpoint_another_owner_re_created_is_left_alone(watches, caplog):
    caplog.set_level(logging.WARNING, logger="gemma4_t4.mcp")
    sm = FakeSageMaker("Creating", created=2_000_000_000.0)
    watcher = _watch("g4-e", sm, created_at={"endpoint:g4-e": 1_000_000_000.0})
    later = FakeSageMaker("Creating")
    _watch("g4-f", later)
    mcp_server._settle_watches()
    assert "endpoint:g4-e" not in sm.deleted and watcher.result.status == "Creating"
    level, message = _log(caplog)[0]
    assert level == "WARNING" and message.startswith(
        "exiting: endpoint g4-e in us-east-2 was deleted and re-created by another owner since this deploy: left "
        "alone ("
    )
    assert message.endswith(
        "(endpoint-config:g4-e, model:g4-e, left alone: endpoint:g4-e (re-created by another owner since this deploy))"
    )
    assert watcher.result.rolled_back and later.deleted


# -- the local chat request --------------------------------------------------------------------------------
class FakeClock:
    def __init__(self, *times: float) -> None:
        self.times = list(times)

    def perf_counter(self) -> float:
        return self.times.pop(0)


def _chat_reply(text: str = "Paris") -> bytes:
    return json.dumps(
        {
            "choices": [{"message": {"content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1},
        }
    ).encode()


@pytest.fixture
def sent(monkeypatch):
    """urllib's urlopen answering a chat reply; what it was sent is recorded."""
    requests: list[dict] = []

    class Response(io.BytesIO):
        def __enter__(self) -> Response:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

    def urlopen(request: urllib.request.Request, timeout: float) -> Response:
        requests.append(
            {
                "url": request.full_url,
                "body": json.loads(request.data),
                "timeout": timeout,
                "content_type": request.get_header("Content-type"),
            }
        )
        answer = requests_answer[0]
        if isinstance(answer, Exception):
            raise answer
        return Response(answer)

    requests_answer: list[Any] = [_chat_reply()]
    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    monkeypatch.setattr(mcp_answers, "time", FakeClock(100.0, 100.12345))
    return types.SimpleNamespace(requests=requests, answer=requests_answer)


def test_a_local_chat_sends_one_openai_request_and_times_it(sent):
    result = mcp_answers.local_chat("http://127.0.0.1:8000/", "Capital of France?", 16, 0.5, model="gemma")
    assert sent.requests == [
        {
            "url": "http://127.0.0.1:8000/v1/chat/completions",
            "timeout": 300,
            "content_type": "application/json",
            "body": {
                "model": "gemma",
                "messages": [{"role": "user", "content": "Capital of France?"}],
                "max_tokens": 16,
                "temperature": 0.5,
            },
        }
    ]
    assert result == QueryResult(
        target="http://127.0.0.1:8000/",
        text="Paris",
        latency_s=0.123,
        finish_reason="stop",
        usage={"prompt_tokens": 5, "completion_tokens": 1},
    )


def test_a_local_chat_without_a_model_asks_the_server_which_it_serves(sent, monkeypatch):
    from gemma4_t4.bench import telemetry

    asked = []
    monkeypatch.setattr(
        telemetry,
        "check_reachable",
        lambda url: asked.append(url) or types.SimpleNamespace(models=["first", "second"]),
    )
    mcp_answers.local_chat("http://127.0.0.1:8000", "hi", 4, 0.0)
    assert asked == ["http://127.0.0.1:8000"] and sent.requests[0]["body"]["model"] == "first"


def test_a_local_chat_refused_by_the_server_keeps_its_reason(sent):
    body = json.dumps({"error": {"message": "This model's maximum context length is 2048 tokens"}}).encode()
    sent.answer[0] = urllib.error.HTTPError(
        "http://GPUBOX/v1/chat/completions", 400, "Bad Request", {}, io.BytesIO(body)
    )
    with pytest.raises(Gemma4T4Error) as refused:  # a LAN host name, as /etc/hosts spells it
        mcp_answers.local_chat("http://GPUBOX", "hi", 4, 0.0, model="m")
    assert sent.requests[0]["url"] == "http://GPUBOX/v1/chat/completions"
    assert (
        refused.value.message
        == "http://GPUBOX answered HTTP 400: This model's maximum context length is 2048 tokens"
    )
    assert refused.value.fix.startswith("shorten the prompt or lower max_tokens")


def test_a_local_chat_to_no_server_says_how_to_start_one(sent):
    sent.answer[0] = urllib.error.URLError("Connection refused")
    with pytest.raises(Gemma4T4Error) as refused:
        mcp_answers.local_chat("http://127.0.0.1:9", "hi", 4, 0.0, model="m")
    assert refused.value.message == "no answer from http://127.0.0.1:9: <urlopen error Connection refused>"
    assert refused.value.fix == "check server_status; start one with start_vllm_server"


def test_a_sagemaker_url_cannot_be_asked_its_model():
    with pytest.raises(Gemma4T4Error) as refused:
        mcp_answers.served_model("sagemaker://us-east-2/g4")
    assert refused.value.message == "a SageMaker endpoint cannot be asked which model it serves"
    assert refused.value.fix == "pass model=<the endpoint's served model name>"


@pytest.mark.parametrize(
    "body, reason",
    [
        (b'{"error": {"message": "bad temperature"}}', "bad temperature"),
        (b'{"detail": "not found"}', "not found"),
        (b'{"error": "plain"}', "plain"),
        (b'{"error": {"code": 3}}', "{'code': 3}"),
        (b'["a"]', "['a']"),
        (b"  upstream\n  timed   out ", "upstream timed out"),
        (b"", "(empty body)"),
        (b"\xff\xfebad bytes", "\ufffd\ufffdbad bytes"),
    ],
)
def test_the_servers_reason_is_read_from_either_error_shape_or_its_text(body, reason):
    assert mcp_answers.server_reason(body) == reason


def test_a_long_reason_is_cut_at_500_characters():
    for body in (
        b"x" * 600,
        json.dumps({"error": {"message": "y" * 600}}).encode(),
        json.dumps({"error": "z" * 600}).encode(),
    ):
        assert len(mcp_answers.server_reason(body)) == 500


@pytest.mark.parametrize(
    "status, reason, fix",
    [
        (
            400,
            "prompt is too long",
            "shorten the prompt or lower max_tokens: prompt + max_tokens must fit the server's max_model_len",
        ),
        (400, "exceeds max_model_len", "shorten the prompt"),
        (400, "MAX_TOKENS must be at most 10", "shorten the prompt"),
        (400, "the Maximum Context is 4096", "shorten the prompt"),
        (400, "Context Length exceeded", "shorten the prompt"),
        (
            400,
            "temperature must be >= 0",
            "change the request as the server's reason says (prompt, max_tokens, temperature)",
        ),
        (422, "too long", "change the request as the server's reason says"),
        (
            404,
            "no such model",
            "the server does not serve that model or path: check base_url (http://HOST:PORT) with "
            "server_status",
        ),
        (
            401,
            "unauthorized",
            "the server needs an API key: start it without one for local use, or query it through the CLI",
        ),
        (
            500,
            "too long",
            "the server failed while answering: read its log tail with server_status, restart it if it died",
        ),
        (423, "locked", "the server failed while answering"),
        (402, "pay", "the server failed while answering"),
        (405, "method", "the server failed while answering"),
    ],
)
def test_a_failed_request_gets_the_fix_that_matches_its_status_and_reason(status, reason, fix):
    error = mcp_answers.http_error("http://h:1", status, json.dumps({"error": {"message": reason}}).encode())
    assert error.message == f"http://h:1 answered HTTP {status}: {reason}"
    assert error.fix.startswith(fix)


@pytest.mark.parametrize("endpoint_name, base_url", [(None, None), ("g4", "http://h")])
def test_a_query_names_exactly_one_target(endpoint_name, base_url):
    with pytest.raises(Gemma4T4Error) as refused:
        mcp_server._target(endpoint_name, base_url)
    assert refused.value.message == "say where to send the request"
    assert refused.value.fix == "pass endpoint_name (SageMaker) or base_url (local vLLM), not both"
    assert mcp_server._target("g4", None) is None and mcp_server._target(None, "http://h") is None


def test_the_arch_flags_are_torchs_and_none_without_torch_or_flags(monkeypatch):
    with_flags = types.SimpleNamespace(_C=types.SimpleNamespace(_cuda_getArchFlags=lambda: "sm_75 sm_80"))
    monkeypatch.setitem(sys.modules, "torch", with_flags)
    assert mcp_server._torch_arch_flags() == "sm_75 sm_80"
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(_C=types.SimpleNamespace()))
    assert mcp_server._torch_arch_flags() is None  # a CPU build has no CUDA arch list
    monkeypatch.setitem(sys.modules, "torch", None)  # not installed
    assert mcp_server._torch_arch_flags() is None


# -- servers this MCP server started -----------------------------------------------------------------------
class FakeServer:
    def __init__(self, port: int) -> None:
        self.config = types.SimpleNamespace(port=port)
        self.stopped_with: float | None = None

    def stop(self, grace: float) -> None:
        self.stopped_with = grace


@pytest.fixture
def owned():
    saved = list(mcp_server._OWNED)
    mcp_server._OWNED.clear()
    yield mcp_server._OWNED
    mcp_server._OWNED[:] = saved


def test_stop_picks_the_only_server_started_here_or_the_port_named(owned):
    owned.append(FakeServer(8123))
    assert mcp_server._owned_server(None) == 8123 and mcp_server._owned_server(8123) == 8123
    with pytest.raises(Gemma4T4Error) as refused:
        mcp_server._owned_server(8124)
    assert refused.value.message == "the server on port 8124 was not started by this MCP server: not stopped"
    assert refused.value.fix == (
        "stop servers started otherwise with gemma4-t4 serve stop --port PORT; pass port= of one started here"
    )
    owned.append(FakeServer(8200))
    assert mcp_server._owned_server(8200) == 8200
    with pytest.raises(Gemma4T4Error) as unclear:
        mcp_server._owned_server(None)
    assert unclear.value.message == "say which server to stop: this MCP server started 2 (8123, 8200)"


def test_stop_with_no_server_started_here_says_none(owned):
    with pytest.raises(Gemma4T4Error) as refused:
        mcp_server._owned_server(None)
    assert refused.value.message == "say which server to stop: this MCP server started 0 (none)"


def test_every_server_started_here_is_stopped_at_exit_even_when_one_fails(owned):
    class Failing(FakeServer):
        def stop(self, grace: float) -> None:
            raise RuntimeError("already gone")

    first, second = FakeServer(8001), FakeServer(8002)
    owned.extend([first, Failing(8003), second])
    mcp_server._stop_owned()
    assert owned == [] and first.stopped_with == 10.0 and second.stopped_with == 10.0


# -- the server itself -------------------------------------------------------------------------------------
def test_the_server_names_itself_titles_its_tools_and_logs_warnings_only():
    server = mcp_server.build_server()
    assert server.name == "gemma4-t4" and server.settings.log_level == "WARNING"
    assert server.instructions == (
        "Deploy and serve Gemma 4 on NVIDIA T4 GPUs (SageMaker and local vLLM). Start "
        "with get_help. Tools that bill or delete need confirm=True."
    )
    tools = {t.name: t for t in server._tool_manager.list_tools()}
    assert set(tools) == set(mcp_server.REGISTRY)
    deploy = tools["deploy_endpoint"]
    assert deploy.title == "Deploy endpoint" and deploy.annotations.title == "Deploy endpoint"
    assert deploy.annotations.read_only_hint is False and deploy.annotations.destructive_hint is False
    assert tools["delete_endpoint"].annotations.destructive_hint is True
    assert tools["get_help"].annotations.read_only_hint is True and tools["get_help"].title == "Get help"


def test_a_tool_answers_through_the_adapter_and_refuses_unknown_arguments_naming_them(monkeypatch, tmp_path):
    monkeypatch.setenv("GEMMA4_T4_WORK_DIR", str(tmp_path))

    async def calls() -> tuple:
        async with Client(mcp_server.build_server()) as client:
            status = await client.call_tool("server_status", {})
            stray = await client.call_tool("server_status", {"port": 1})
            typo = await client.call_tool(
                "run_benchmark", {"base_url": "http://h", "concurency": [1], "a": 1}
            )
            bad = await client.call_tool("query_model", {"prompt": "hi"})
            schema = {t.name: t.input_schema for t in (await client.list_tools()).tools}
        return status, stray, typo, bad, schema

    status, stray, typo, bad, schema = _run(calls())
    assert status.structured_content["summary"] == "no servers recorded"
    assert (
        stray.is_error
        and "server_status takes no argument 'port'; it takes: no arguments [" in stray.content[0].text
    )
    assert "inside spec" not in stray.content[0].text
    text = typo.content[0].text
    assert (
        "run_benchmark takes no argument 'a', 'concurency'; it takes: base_url, model, out_dir, "
        "request_timeout_s, spec; workload options go inside spec ["
    ) in text
    assert bad.is_error and bad.content[0].text.endswith(
        "Gemma4T4Error: say where to send the request\n  fix: pass "
        "endpoint_name (SageMaker) or base_url (local vLLM), not both"
    )
    assert schema["server_status"]["additionalProperties"] is False
    assert set(schema["run_benchmark"]["properties"]) == {
        "base_url",
        "spec",
        "model",
        "out_dir",
        "request_timeout_s",
    }


def test_a_served_interruptible_tool_does_not_hold_the_shutdown(monkeypatch):
    """A benchmark, once served, runs without holding a shutdown; a deploy holds it while it runs."""
    seen = {}

    def bench_like() -> QueryResult:
        seen["bench"] = mcp_server._IN_FLIGHT.wait_idle(0)
        return QueryResult(target="x", text="", latency_s=0.0)

    def deploy_like() -> QueryResult:
        seen["deploy"] = mcp_server._IN_FLIGHT.wait_idle(0)
        return QueryResult(target="x", text="", latency_s=0.0)

    monkeypatch.setitem(
        mcp_server.REGISTRY,
        "bench_like",
        mcp_boundary.ToolSpec(bench_like, mcp_server.CREATES, interruptible=True),
    )
    monkeypatch.setitem(
        mcp_server.REGISTRY, "deploy_like", mcp_boundary.ToolSpec(deploy_like, mcp_server.CREATES)
    )

    async def calls() -> None:
        async with Client(mcp_server.build_server()) as client:
            for name in ("bench_like", "deploy_like"):
                answer = await client.call_tool(name, {})
                assert not answer.is_error, answer.content[0].text

    _run(calls())
    assert seen == {"bench": True, "deploy": False}


def test_a_stop_signal_ignores_further_signals_and_shuts_down_in_its_own_thread(monkeypatch):
    """SIGHUP: the next SIGTERM or SIGHUP must not cut the clean-up short; the shutdown runs in a non-daemon
    thread called mcp-shutdown (the process waits for it), with the signal recorded for the waits it ends."""
    ran: list[tuple[str, bool, int]] = []
    monkeypatch.setattr(
        mcp_server,
        "_shut_down",
        lambda: ran.append(
            (threading.current_thread().name, threading.current_thread().daemon, mcp_server._STOP_SIGNAL[0])
        ),
    )
    before = {sig: signal.getsignal(sig) for sig in signals.STOP_SIGNALS}
    try:
        mcp_server._on_stop_signal(signal.SIGHUP, None)
        for thread in threading.enumerate():
            if thread.name == "mcp-shutdown":
                thread.join(5)
        assert {sig: signal.getsignal(sig) for sig in signals.STOP_SIGNALS} == {
            sig: signal.SIG_IGN for sig in signals.STOP_SIGNALS
        }
        assert mcp_server._SHUTDOWN.is_set()
        assert ran == [("mcp-shutdown", False, signal.SIGHUP)]
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        mcp_server._SHUTDOWN.clear()
        mcp_server._STOP_SIGNAL[0] = signal.SIGTERM


class Exited(Exception):
    pass


def _exit(code: int) -> None:
    raise Exited(code)


def test_the_shutdown_stops_owned_servers_settles_watches_and_exits_cleanly(
    monkeypatch, owned, watches, caplog
):
    caplog.set_level(logging.WARNING, logger="gemma4_t4.mcp")
    monkeypatch.setattr(mcp_server.os, "_exit", _exit)
    server = FakeServer(8300)
    owned.append(server)
    sm = FakeSageMaker("Creating")
    _watch("g4-z", sm)
    mcp_server._STOP_SIGNAL[0] = signal.SIGHUP
    try:
        with pytest.raises(Exited) as exited:
            mcp_server._shut_down()
    finally:
        mcp_server._STOP_SIGNAL[0] = signal.SIGTERM
    assert exited.value.args == (0,)
    assert server.stopped_with == 10.0 and sm.deleted
    assert _log(caplog)[0] == ("WARNING", "SIGHUP: cancelling in-flight tools and stopping owned servers")
    assert not any(level == "ERROR" for level, _ in _log(caplog))


def test_the_shutdown_gives_up_on_a_tool_still_running_after_the_grace(monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="gemma4_t4.mcp")
    monkeypatch.setattr(mcp_server.os, "_exit", _exit)
    monkeypatch.setattr(mcp_server, "SHUTDOWN_GRACE_S", 0.05)
    busy = threading.Event()
    flight = mcp_server._IN_FLIGHT

    def tool() -> None:
        with flight:
            busy.set()
            release.wait(5)

    release = threading.Event()
    worker = threading.Thread(target=tool)
    worker.start()
    busy.wait(5)
    later = threading.Timer(1.0, release.set)  # a shutdown that waited without a limit would see it end
    later.start()
    try:
        with pytest.raises(Exited):
            mcp_server._shut_down()
    finally:
        release.set()
        later.cancel()
        worker.join(5)
    assert ("ERROR", "tools still running after 0 s; exiting anyway") in _log(caplog)


def test_main_installs_the_stop_signals_quiets_library_logs_and_cleans_up_after_the_server(
    monkeypatch, owned
):
    seen = {}

    class Server:
        def run(self) -> None:
            seen["handlers"] = {sig: signal.getsignal(sig) for sig in signals.STOP_SIGNALS}

    monkeypatch.setattr(mcp_server, "build_server", Server)
    cleaned = []
    monkeypatch.setattr(mcp_server, "_settle_watches", lambda: cleaned.append("watches"))
    server = FakeServer(8400)
    owned.append(server)
    before = {sig: signal.getsignal(sig) for sig in signals.STOP_SIGNALS}
    levels = {name: logging.getLogger(name).level for name in ("botocore", "boto3", "urllib3")}
    root = logging.getLogger()
    root_handlers, root_level = root.handlers[:], root.level
    try:
        for name in levels:
            logging.getLogger(name).setLevel(logging.DEBUG)
        root.handlers.clear()  # a fresh process: nothing has configured logging yet
        root.setLevel(logging.NOTSET)
        mcp_server.main()
        assert (
            root.level == logging.WARNING
        )  # an INFO line from any library never reaches the server's stderr
        assert seen["handlers"] == {sig: mcp_server._on_stop_signal for sig in signals.STOP_SIGNALS}
        assert {name: logging.getLogger(name).level for name in levels} == dict.fromkeys(
            levels, logging.WARNING
        )
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        root.handlers[:] = root_handlers
        root.setLevel(root_level)
    assert server.stopped_with == 10.0 and cleaned == ["watches"]
