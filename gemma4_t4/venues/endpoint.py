"""One thing that serves Gemma 4 over the OpenAI API, owned end to end: a local vLLM server (a T4,
another GPU, or the CPU) or a SageMaker endpoint.

An :class:`Endpoint` has a URL (``http://HOST:PORT`` or ``sagemaker://REGION/NAME``), the served
model name, a tokenizer, its GPU (the hardware table's key), its hourly price and cost so far, and
``stop()``. Leaving its ``with`` block (normally, by an exception, or by SIGINT/SIGTERM/SIGHUP)
stops the server or deletes the endpoint with its config, model and scaling policy; so does the
process's exit (a notebook calls ``stop()`` in its clean-up cell).

Ownership is recorded under the cache root's ``owned/`` (the owner's pid and start time; a local
server's supervisor's too), so that after a ``kill -9`` the next :class:`Endpoint` reaps what the
dead owner left (:func:`reap_orphans`), and only that: never a server or endpoint started later
under the same port or name. Ownership is decided before anything can be stopped: a name owned by a
live process is refused, touching nothing. A :class:`Budget` caps what SageMaker endpoints spend
together: refused before deploying when the estimate does not fit, deleted once it is spent.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shlex
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel

from gemma4_t4.catalog.hardware import InstancePrice, identify_gpu, price_of_gpu, sagemaker_price
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation import signals
from gemma4_t4.foundation.atomic import UnreadableJSON, atomic_write_text, read_json_object
from gemma4_t4.foundation.cache import cache_root

if TYPE_CHECKING:
    from gemma4_t4.sagemaker.config import DeployConfig
    from gemma4_t4.serving.server import ServerConfig, VLLMServer

Venue = Literal["local", "sagemaker"]

# A T4 endpoint took 13.2 min to InService in the series, an L4 ~10 min (reference_system.md);
# what one endpoint is expected to cost is priced for this long before it is deployed.
DEPLOY_MINUTES = 15.0
MEASURE_MINUTES = 10.0


# ---------------------------------------------------------------- ownership records


class OwnershipRecord(BaseModel):
    """Who owns a running server or endpoint, so that a later command can reap it."""

    venue: Venue
    name: str  # the served name (local) or the endpoint's name (SageMaker)
    url: str
    owner_pid: int
    owner_create_time: float
    started_at: float
    region: str | None = None  # SageMaker
    work_dir: str | None = None  # local: the server's state folder
    port: int | None = None  # local
    # local: the supervisor that runs the server (its process-group leader). The reaper stops the
    # server on port/work_dir only while its state file still names this very process: a server
    # started there later by someone else is not this owner's. None: not started yet, nothing to stop.
    server_pid: int | None = None
    server_create_time: float | None = None
    # SageMaker: the endpoint's CreationTime once the deploy has created it. The reaper deletes an
    # endpoint of this name only while it is this very one: an endpoint deployed under the same name
    # after the owner died (by hand, by another tool) is not this owner's. None: the owner died before
    # the deploy finished, and then only an endpoint created after the record was written is its.
    endpoint_created_at: float | None = None


def owned_dir() -> Path:
    return cache_root() / "owned"


def _record_path(venue: Venue, name: str, port: int | None = None) -> Path:
    key = f"{venue}-{name}" + (f"-{port}" if port else "")
    return owned_dir() / (key.replace("/", "_") + ".json")


def _owner_alive(record: OwnershipRecord) -> bool:
    # lazy: the local serving stack (server, start gate, supervisor, psutil) loads only where a local server is started, adopted or checked
    from gemma4_t4.serving.server_state import pid_alive

    return pid_alive(record.owner_pid, record.owner_create_time)


def _this_process() -> tuple[int, float]:
    import psutil

    return os.getpid(), psutil.Process().create_time()


def _read_record(path: Path) -> OwnershipRecord | None:
    """The ownership record at ``path``; None where there is none, or none that can be read."""
    try:
        return OwnershipRecord.model_validate_json(path.read_text())
    except (OSError, ValueError):
        return None


def owned_records() -> list[tuple[Path, OwnershipRecord | None]]:
    """Every ownership record on this machine (``None`` for one that cannot be read)."""
    return [(path, _read_record(path)) for path in sorted(owned_dir().glob("*.json"))]


@dataclass
class Reaped:
    name: str
    venue: Venue
    action: str  # "stopped" | "deleted" | "failed: ..."


def reap_orphans(*, sagemaker_client: object = None) -> list[Reaped]:
    """Stop or delete whatever a dead owner left (its record says what), then drop the record.
    A record that cannot be read is named and kept (it is not ours to guess at)."""
    reaped = []
    for path, record in owned_records():
        if record is None:
            warnings.warn(_unreadable_record(path), stacklevel=2)
            continue
        if _owner_alive(record):
            continue
        try:
            action = _reap_local(record) if record.venue == "local" else _reap_sagemaker(record, sagemaker_client)
        except Gemma4T4Error as exc:
            action = f"failed: {exc.message}"
        except Exception as exc:  # noqa: BLE001 - named in the result; the record stays for next time
            action = f"failed: {type(exc).__name__}: {exc}"
        if not action.startswith("failed"):
            path.unlink(missing_ok=True)
        reaped.append(Reaped(record.name, record.venue, action))
    return reaped


def _unreadable_record(path: Path) -> str:
    """What the user is told of a record that cannot be read: kept, so what it names is never reaped."""
    try:
        why = f"not an ownership record: {sorted(read_json_object(path))[:5]}"
    except (OSError, UnreadableJSON) as exc:
        why = str(exc)
    return (f"kept the ownership record {path}: it cannot be read ({why}), so a server or endpoint it names is "
            "not stopped for a dead owner. Check that nothing of yours still runs or bills (gemma4-t4 serve status, "
            f"gemma4-t4 sagemaker list), then delete it: rm {shlex.quote(str(path))}")


# an endpoint created this long before its owner's record was written is not the owner's (clock skew
# between this machine and AWS is allowed for)
_CLOCK_SKEW_S = 300.0


def _reap_sagemaker(record: OwnershipRecord, sagemaker_client: object) -> str:
    """Delete the endpoint a dead owner deployed, identified by its CreationTime: the name alone may
    now belong to an endpoint someone deployed after the owner died, which is not this record's."""
    # lazy: the SageMaker modules load only for a SageMaker endpoint (a local one never needs them)
    from gemma4_t4.sagemaker.aws import client_factory
    from gemma4_t4.sagemaker.ops import delete_endpoint, same_creation

    # a client is bound to one region: the record's own region gets its own client
    client_region = getattr(getattr(sagemaker_client, "meta", None), "region_name", None)
    same_region = sagemaker_client is not None and client_region == record.region
    client = sagemaker_client if same_region else client_factory()("sagemaker", record.region or "")
    created = _endpoint_created_at(client, record.name)
    if created is not None:
        if record.endpoint_created_at is not None:
            mine = same_creation(record.endpoint_created_at, created)  # the package's one identity rule
        else:
            mine = created >= record.started_at - _CLOCK_SKEW_S
        if not mine:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(created))
            return f"left alone: endpoint {record.name!r} was created {when}, not by this owner"
    delete_endpoint(record.name, record.region or "", client=client)  # gone: what it left, if anything
    return "deleted"


def _endpoint_created_at(client: object, name: str) -> float | None:
    """The endpoint's CreationTime (epoch seconds), or None where no endpoint has the name."""
    from botocore.exceptions import ClientError

    try:
        created = client.describe_endpoint(EndpointName=name).get("CreationTime")  # type: ignore[attr-defined]
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "ValidationException":
            return None  # no such endpoint (SageMaker answers "Could not find endpoint")
        raise
    return created.timestamp() if created is not None else None


def _reap_local(record: OwnershipRecord) -> str:
    """Stop the server a dead owner started, identified by its supervisor's pid and start time
    (what the server's state file names): the port and work dir alone may now hold another
    server, started by hand after the owner died, which is not this record's to stop."""
    # lazy: the local serving stack (server, start gate, supervisor, psutil) loads only where a local server is started, adopted or checked
    from gemma4_t4.serving.server import VLLMServer
    from gemma4_t4.serving.server_state import state_path

    path = state_path(record.work_dir or ".", record.port or 0)
    if record.server_pid is None or not record.port or not path.exists():
        return "stopped"  # never started, or its supervisor already stopped it and cleaned up
    server = VLLMServer.from_state(path)
    same = server.pid == record.server_pid and (
        server.pid_create_time is None
        or record.server_create_time is None
        or abs(server.pid_create_time - record.server_create_time) < 1.0
    )
    if not same:
        return f"left alone: port {record.port} now runs another server (pid {server.pid}), not this owner's"
    server.stop()
    return "stopped"


# ---------------------------------------------------------------- budget


MAX_BUDGET_USD = 100_000.0  # a typo's guard: 1e308 is no budget at all (and prints a 300-digit dollar figure)


def check_budget(usd: float) -> float:
    """A hard budget is a positive number of USD up to :data:`MAX_BUDGET_USD` (NaN and inf are refused too)."""
    if not 0 < usd <= MAX_BUDGET_USD:
        raise Gemma4T4Error(f"budget {usd:.4g} must be a positive number of USD, at most {MAX_BUDGET_USD:,.0f}",
                            fix="e.g. BUDGET_USD = 5 in a notebook, --budget-usd 5 on the command line")
    return usd


class BudgetRefused(Gemma4T4Error):
    """An endpoint's estimate does not fit what is left of the budget: refused before deploying."""


class Budget:
    """A hard USD cap shared by the SageMaker endpoints it is given to. A live endpoint holds its
    estimate (or what it has cost, if more) until it stops; then what it really cost is spent."""

    def __init__(self, usd: float):
        self.usd = check_budget(usd)
        self._closed = 0.0
        self._live: dict[Endpoint, float] = {}  # endpoint -> its estimate
        self._lock = threading.Lock()

    @property
    def spent_usd(self) -> float:
        """What the endpoints have cost so far (stopped ones in full, live ones up to now)."""
        with self._lock:
            return round(self._closed + sum(e.cost_usd() for e in self._live), 4)

    @property
    def left_usd(self) -> float:
        """What a new endpoint may still be estimated at."""
        with self._lock:
            held = sum(max(e.cost_usd(), estimate) for e, estimate in self._live.items())
            return round(self.usd - self._closed - held, 4)

    def admit(self, endpoint: Endpoint, estimate_usd: float) -> None:
        from gemma4_t4.sagemaker.cost import usd  # the one money format (a small budget keeps its digits)

        left = self.left_usd
        if estimate_usd > left:
            raise BudgetRefused(
                f"{endpoint.name} would cost ~{usd(estimate_usd)}; {usd(left)} of the {usd(self.usd)} budget is left",
                fix="raise the budget (BUDGET_USD / --budget-usd) or deploy fewer endpoints",
            )
        with self._lock:
            self._live[endpoint] = estimate_usd

    def close(self, endpoint: Endpoint) -> None:
        with self._lock:
            if self._live.pop(endpoint, None) is not None:
                self._closed += endpoint.cost_usd()


# ---------------------------------------------------------------- the endpoint


# Endpoints of this process holding an ownership record (by its path): a second Endpoint of the same
# name is refused while the first is live, so its failure or refusal can never drop the first's record.
_HELD: weakref.WeakValueDictionary[Path, Endpoint] = weakref.WeakValueDictionary()


class Endpoint:
    """A running server or endpoint this process owns. Build one with :meth:`local` or
    :meth:`sagemaker` (or ``gemma4_t4.notebook.endpoint``); use it as a context manager or call
    :meth:`stop`. Any ``bench.specs`` workload runs on it: ``bench.run(endpoint, spec, out_dir)``."""

    def __init__(
        self,
        venue: Venue,
        name: str,
        url: str,
        served_name: str,
        *,
        tokenizer: str | None = None,
        gpu: str | None = None,
        usd_per_hour: float = 0.0,
        price: InstancePrice | None = None,
        max_num_seqs: int | None = None,
        api_key: str | None = None,
        exposes_metrics: bool = False,
    ):
        self.venue = venue
        self.name = name
        self.url = url
        self.served_name = served_name
        self.tokenizer = tokenizer
        self.gpu = gpu  # the hardware table's key (roofline, cost); None: no GPU, or one the table lacks
        self.usd_per_hour = usd_per_hour  # what this package bills for it (nothing for a local machine)
        # the hourly price its throughput is priced at: the SageMaker instance's, else what a cloud charges
        # for one of its GPU (catalog.hardware.price_of_gpu); None on a CPU or a GPU the table prices
        # nowhere: its throughput is then not priced as another GPU's
        self.price = price if price is not None else price_of_gpu(gpu)
        self.max_num_seqs = max_num_seqs
        self.api_key = api_key
        self.exposes_metrics = exposes_metrics  # /metrics (the prefix cache's hit rate): a local vLLM only
        self.started = time.monotonic()
        self.stopped_reason: str | None = None  # why it stopped early (e.g. the budget ran out)
        self.deleted: list[str] = []  # SageMaker: what stop() deleted ("endpoint:NAME", "model:NAME", ...)
        self._stop: Callable[[], None] | None = None
        self._stopped_at: float | None = None
        self._record: Path | None = None
        self._owned: OwnershipRecord | None = None
        self._budget: Budget | None = None
        self._signals: contextlib.AbstractContextManager[None] | None = None
        self._lock = threading.Lock()
        self.server: VLLMServer | None = None  # the local VLLMServer (its config for restarts with other options)

    def __repr__(self) -> str:
        state = "stopped" if self.stopped else "running"
        return f"Endpoint({self.venue}, {self.url}, serving {self.served_name!r}, {state})"

    @property
    def can_restart(self) -> bool:
        """A server this process started here: its config can be started again with other options
        (a drafter on and off, the prefill route); a SageMaker endpoint would be another billed deploy."""
        return self.server is not None

    def cost_usd(self) -> float:
        """What this endpoint has cost so far: its price per hour times its time up (0 on a CPU).
        Not rounded: a fraction of a cent is still a cost, and displays round it themselves."""
        end = self._stopped_at if self._stopped_at is not None else time.monotonic()
        return self.usd_per_hour * (end - self.started) / 3600.0

    @property
    def stopped(self) -> bool:
        return self._stopped_at is not None

    def stop(self) -> None:
        """Stop the server or delete the endpoint (config, model and scaling policy too). Safe to
        repeat, and from any thread: a second caller waits until the first is done. The ownership
        record goes once it is done; a failed stop keeps it (and a later stop() tries again)."""
        with self._lock:  # held throughout: `stopped` means gone, not "going"
            if self._stopped_at is not None:
                return
            atexit.unregister(self._stop_at_exit)
            stopping_at = time.monotonic()
            if self._stop is not None:
                try:
                    self._stop()
                except BaseException:
                    atexit.register(self._stop_at_exit)  # still ours: try again at exit
                    raise
            self._stopped_at = stopping_at
            if self._budget is not None:
                self._budget.close(self)
            if self._record is not None:
                self._record.unlink(missing_ok=True)
                _HELD.pop(self._record, None)

    def _stop_at_exit(self) -> None:
        # the interpreter is exiting: one line, never a traceback (the record stays for the next command)
        try:
            self.stop()
        except Exception as exc:  # noqa: BLE001 - reported; reap_orphans retries from the record
            message = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
            print(f"gemma4-t4: could not stop {self.url} at exit: {message}", file=sys.stderr)

    def __enter__(self) -> Endpoint:
        # SIGTERM and SIGHUP unwind through __exit__ like Ctrl-C (the one signal rule)
        self._signals = signals.orderly_stop()
        self._signals.__enter__()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.stop()
        finally:
            guard, self._signals = self._signals, None
            if guard is not None:
                guard.__exit__(exc_type, exc, tb)

    # -- ownership ------------------------------------------------------------------------------

    def _own(self, region: str | None = None, work_dir: str | None = None, port: int | None = None) -> None:
        """Record this process as the owner, or refuse (raising, having changed nothing) when a live
        process or another live Endpoint of this one owns the name."""
        path = _record_path(self.venue, self.name, port)
        other = _HELD.get(path)
        if other is not None and other is not self and not other.stopped:
            raise Gemma4T4Error(
                f"{self.venue} endpoint {self.name!r} is owned by another Endpoint of this process ({other.url})",
                fix="stop() that one first (its endpoint goes with it), or use another name",
            )
        held = _read_record(path)
        if held is not None and _owner_alive(held) and held.owner_pid != os.getpid():
            raise Gemma4T4Error(
                f"{self.venue} endpoint {self.name!r} is owned by process {held.owner_pid} (started "
                f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(held.started_at))})",
                fix="use another name, or stop that process first (its endpoint goes with it)",
            )
        pid, created = _this_process()
        record = OwnershipRecord(
            venue=self.venue, name=self.name, url=self.url, owner_pid=pid, owner_create_time=created,
            started_at=time.time(), region=region, work_dir=work_dir, port=port,
        )
        atomic_write_text(path, record.model_dump_json(indent=1))  # first: a refusal to write changes nothing
        self._record, self._owned = path, record
        _HELD[path] = self
        atexit.register(self._stop_at_exit)

    def _update_record(self, **update: object) -> None:
        if self._record is not None and self._owned is not None:
            self._owned = self._owned.model_copy(update=update)
            atomic_write_text(self._record, self._owned.model_dump_json(indent=1))

    # -- builders -------------------------------------------------------------------------------

    @classmethod
    def local(
        cls, config: ServerConfig, *, tokenizer: str | None = None, gpu_name: str | None = None,
        quiet: bool = False,
    ) -> Endpoint:
        """Start vLLM for ``config`` through the start gate, owned by this process: stopped when the
        block ends, when the process exits, and by the server's supervisor when the process is killed.
        An interrupted start stops what it started. ``gpu_name``: the GPU it serves on as nvidia-smi
        names it (``runtime.gpu_name``); none for the CPU target."""
        # lazy: the local serving stack (server, start gate, supervisor, psutil) loads only where a local server is started, adopted or checked
        from gemma4_t4.serving.server import VLLMServer

        reap_orphans()
        started = time.monotonic()
        name = config.resolved_name()
        gpu = None if config.target == "cpu" else identify_gpu(gpu_name)
        endpoint = cls(
            "local", name, VLLMServer(config).base_url, name,  # (only its address: nothing is started here)
            tokenizer=tokenizer,  # None: the server's own /tokenize gives exact prompt lengths
            gpu=gpu.key if gpu else None,
            # usd_per_hour stays 0: what this package bills for a machine you already run is nothing
            max_num_seqs=config.max_num_seqs,
            api_key=config.api_key,
            exposes_metrics=True,
        )
        # owned before anything starts: a refusal raises here, with nothing started or stopped
        endpoint._own(work_dir=str(config.work_dir), port=config.port)
        try:
            server = start_owned_server(config)  # an interrupted start stops what it started
        except BaseException:
            endpoint.stop()  # nothing to stop yet: drops the record
            raise
        endpoint.server = server
        endpoint._stop = server.stop
        # the supervisor (pid, start time) the reaper stops for a dead owner, and only that one
        endpoint._update_record(server_pid=server.pid, server_create_time=server.pid_create_time)
        if not quiet:
            print(
                f"vLLM serving {endpoint.served_name} at {endpoint.url} "
                f"(ready in {time.monotonic() - started:.0f} s, log: {server.log_path})"
            )
        return endpoint

    @classmethod
    def sagemaker(
        cls,
        config: DeployConfig,
        *,
        budget: Budget | None = None,
        tokenizer: str | None = None,
        client: object = None,
        poll_s: float = 15.0,
        progress: bool = True,
        watch_s: float = 5.0,
    ) -> Endpoint:
        """Deploy ``config`` and wait until it is InService. A failed deploy rolls back what it
        created; an interrupted one (Ctrl-C, SIGTERM, SIGHUP) deletes it. With ``budget`` the
        endpoint is refused before deploying when its estimate does not fit, and deleted the moment
        the budget is spent."""
        # lazy: the SageMaker modules load only for a SageMaker endpoint (a local one never needs them)
        from gemma4_t4.sagemaker.aws import client_factory
        from gemma4_t4.sagemaker.deploy import deploy
        from gemma4_t4.sagemaker.ops import delete_endpoint

        config.check_role()
        rate = hourly_rate(config)
        served = config.container_env()["SM_VLLM_SERVED_MODEL_NAME"]
        price = sagemaker_price(config.instance_type)
        endpoint = cls(
            "sagemaker", config.name, f"sagemaker://{config.region}/{config.name}", served,
            tokenizer=tokenizer or (None if config.model_data_s3_uri else config.model_id),
            gpu=price.gpu if price else None, usd_per_hour=rate, price=price,
            max_num_seqs=config.max_num_seqs,
        )
        reap_orphans(sagemaker_client=client)
        # owned before anything can be stopped: a name another live process owns is refused here,
        # and the refusal deletes nothing (the endpoint, config and model are that owner's)
        endpoint._own(region=config.region)
        sm = _CreateWatch(client or client_factory()("sagemaker", config.region))

        def delete() -> None:
            # only what this deploy may have created: a deploy refused before creating anything
            # (the name already exists, the image is missing) leaves whatever holds the name alone
            if sm.may_have_created:  # once InService, by its recorded CreationTime (another's re-creation stays)
                recorded = endpoint._owned.endpoint_created_at if endpoint._owned is not None else None
                endpoint.deleted += delete_endpoint(config.name, config.region, client=sm.client,
                                                    created_at=recorded).deleted

        endpoint._stop = delete
        try:
            if budget is not None:
                budget.admit(endpoint, rate * (DEPLOY_MINUTES + MEASURE_MINUTES) / 60.0)
                endpoint._budget = budget
            with signals.orderly_stop():
                deploy(config, client=sm, progress=progress, poll_s=poll_s)
                # the CreationTime is what the reaper matches
                endpoint._update_record(endpoint_created_at=_endpoint_created_at(sm.client, config.name))
        except BaseException:
            endpoint.stop()  # rolled back by deploy already where it failed; this catches the rest
            raise
        if budget is not None:
            _budget_watch(endpoint, budget, watch_s).start()
        return endpoint


def hourly_rate(config: DeployConfig) -> float:
    """What ``config``'s endpoint bills per hour at its most instances; refused without a price."""
    # lazy: the SageMaker modules load only for a SageMaker endpoint (a local one never needs them)
    from gemma4_t4.sagemaker.deploy import deploy_cost

    rate = deploy_cost(config).usd_per_hour
    if rate is None:
        raise Gemma4T4Error(f"no price for {config.instance_type}: a budget cannot be enforced",
                            fix="use an instance type listed in gemma4_t4.catalog.hardware.PRICES")
    return rate


class _CreateWatch:
    """The SageMaker client as :func:`gemma4_t4.sagemaker.deploy.deploy` uses it, noting whether a
    ``create_*`` call may have created something. Until one has, nothing under the endpoint's name
    is this deploy's to delete. A call the service refused (a ClientError answer) created nothing;
    one that was interrupted or lost its connection may have."""

    def __init__(self, client: object):
        self.client = client
        self.may_have_created = False

    def __getattr__(self, name: str) -> object:
        attr = getattr(self.client, name)
        if not name.startswith("create_") or not callable(attr):
            return attr

        def create(*args: object, **kwargs: object) -> object:
            from botocore.exceptions import ClientError

            try:
                answer = attr(*args, **kwargs)
            except ClientError:
                raise
            except BaseException:
                self.may_have_created = True
                raise
            self.may_have_created = True
            return answer

        return create


def start_owned_server(config: ServerConfig) -> VLLMServer:
    """Start ``config`` through the start gate, owned by this process: its supervisor stops it when
    this process dies, even by ``kill -9``, and an interrupted wait stops what it started. Returns
    the :class:`gemma4_t4.serving.server.VLLMServer`."""
    # lazy: the local serving stack (server, start gate, supervisor, psutil) loads only where a local server is started, adopted or checked
    from gemma4_t4.serving.server import start_server

    pid, created = _this_process()
    owner = {
        "kind": "endpoint owner", "pid": pid, "create_time": created,
        "on_exit": "stopped when this process exits, even if it is killed", "stop_with_owner": True,
    }
    server = start_server(config, owner=owner)
    atexit.register(server.stop)
    return server


def _budget_watch(endpoint: Endpoint, budget: Budget, every_s: float) -> threading.Thread:
    """The thread that deletes the endpoint the moment the shared budget is spent (daemon: never outlives it)."""

    def watch() -> None:
        while not endpoint.stopped:
            if budget.spent_usd >= budget.usd:
                # lazy: the SageMaker modules load only for a SageMaker endpoint (a local one never needs them)
                from gemma4_t4.sagemaker.cost import usd

                endpoint.stopped_reason = f"budget {usd(budget.usd)} spent while {endpoint.name} was up; deleted it"
                endpoint.stop()
                return
            time.sleep(every_s)

    return threading.Thread(target=watch, name=f"budget-{endpoint.name}", daemon=True)

