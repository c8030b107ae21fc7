"""boto3 client construction in one place: adaptive retries, optional session, and a
factory type so multi-region functions can be handed stubbed or moto-backed clients."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from gemma4_t4.errors import Gemma4T4Error

ClientFactory = Callable[[str, str], Any]  # (service, region) -> boto3 client
Sleep = Callable[[float], None]  # how a wait pauses: time.sleep, a shutdown's cancellable sleep, a test's clock
Clock = Callable[[], float]  # how a wait reads the time: time.monotonic, or a test's clock


_SHARED: dict[tuple, Any] = {}
# every AWS command fails the same way without credentials: one message and one fix for all of them
NO_CREDENTIALS = ("no AWS credentials: boto3 found none (no AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, "
                  "~/.aws/credentials or config, SSO session, or instance role)")
CREDENTIALS_FIX = ("run `aws configure` (or `aws sso login --profile NAME`, then export AWS_PROFILE=NAME), or export "
                   "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; on EC2/SageMaker attach an IAM role")
_CREDENTIAL_FAILURES = {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError",
                        "UnrecognizedClientException", "InvalidClientTokenId", "ExpiredTokenException", "ExpiredToken"}


def client_factory(session: Any = None) -> ClientFactory:
    """Cached clients per (service, region); boto3 honours AWS_ENDPOINT_URL[_<SERVICE>]. Without a
    session, clients are shared process-wide (one costs ~0.2 s to build), keyed by the AWS_* environment
    so changing profile, keys or endpoint URLs gets fresh clients."""
    return _shared_client if session is None else _session_factory(session)


def _shared_client(service: str, region: str) -> Any:
    import os

    key = (service, region, tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_"))))
    if key not in _SHARED:
        _SHARED[key] = _session_factory(None)(service, region)
    return _SHARED[key]


def _session_factory(session: Any) -> ClientFactory:
    try:
        import boto3
        from botocore.config import Config
    except ImportError as exc:  # pragma: no cover - boto3 is in the aws extra
        raise Gemma4T4Error("boto3 is not installed", fix="pip install 'gemma4-t4[aws]'") from exc
    session = session or boto3.session.Session()
    config = Config(retries={"mode": "adaptive", "max_attempts": 8}, user_agent_extra="gemma4-t4")
    cache: dict[tuple[str, str], Any] = {}

    def make(service: str, region: str) -> Any:
        key = (service, region)
        if key not in cache:
            # before the first client: without credentials every call would fail, and a command that
            # records per-region failures (quotas) would conclude something else from them
            if not cache and session.get_credentials() is None:
                raise Gemma4T4Error(NO_CREDENTIALS, fix=CREDENTIALS_FIX)
            cache[key] = session.client(service, region_name=region, config=config)
        return cache[key]

    return make


def aws_exceptions() -> tuple[type[BaseException], ...]:
    """botocore's failure types (client errors, connection and credential errors)."""
    try:
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:  # pragma: no cover
        return ()
    return (ClientError, BotoCoreError)


def _error_fields(exc: BaseException) -> dict[str, str]:
    """The ``Error`` block of a botocore ClientError's response (none for other failures)."""
    response = getattr(exc, "response", None)
    return response.get("Error", {}) if isinstance(response, dict) else {}


def error_code(exc: BaseException) -> str | None:
    return _error_fields(exc).get("Code")


def error_message(exc: BaseException) -> str:
    return _error_fields(exc).get("Message") or str(exc)


def is_not_found(exc: BaseException) -> bool:
    """SageMaker reports a missing resource as ValidationException 'Could not find ...'."""
    code = error_code(exc)
    if code in ("ResourceNotFound", "ResourceNotFoundException", "NoSuchResourceException",
                "ObjectNotFoundException"):
        return True
    return code == "ValidationException" and "could not find" in error_message(exc).lower()


def is_credentials_error(exc: BaseException) -> bool:
    """The caller has no (valid) credentials: no region or retry answers differently."""
    return type(exc).__name__ in _CREDENTIAL_FAILURES or error_code(exc) in _CREDENTIAL_FAILURES


def aws_error(exc: BaseException, action: str) -> Gemma4T4Error:
    """A botocore failure as a Gemma4T4Error with the fix for the common causes."""
    code = error_code(exc) or type(exc).__name__
    message = error_message(exc)
    fixes = {
        "NoCredentialsError": CREDENTIALS_FIX,
        "PartialCredentialsError": CREDENTIALS_FIX,
        "ExpiredTokenException": "refresh your session: aws sso login",
        "AccessDeniedException": "grant the caller the SageMaker permissions listed in docs/sagemaker.md",
        "ResourceLimitExceeded": "request a quota increase for '<instance> for endpoint usage' in Service "
        "Quotas, or deploy to a region with quota (gemma4-t4 sagemaker quotas)",
        "ThrottlingException": "retry in a minute; calls already use adaptive retries",
    }
    return Gemma4T4Error(f"{action} failed: {code}: {message}", fix=fixes.get(code))


@contextlib.contextmanager
def aws_call(action: str) -> Iterator[None]:
    """A botocore failure in the block is raised as :func:`aws_error`, naming ``action``."""
    try:
        yield
    except aws_exceptions() as exc:
        raise aws_error(exc, action) from exc


# -- what an interrupted command undid ----------------------------------------------------------
# An interrupted deploy, matrix or build (Ctrl-C, or SIGTERM/SIGHUP through gemma4_t4.foundation.signals) cleans
# up on its way out and re-raises the interrupt; the notes it adds to that exception are how the
# command's last line can say what was deleted or stopped before the process ends.
_UNDONE = "gemma4-t4 undid: "


def note_undone(exc: BaseException, what: str) -> None:
    """Record on the interrupt ``exc`` that ``what`` was deleted or stopped while it unwound."""
    exc.add_note(_UNDONE + what)


def undone(exc: BaseException) -> list[str]:
    """What :func:`note_undone` recorded on ``exc``, in the order it happened."""
    return [n[len(_UNDONE) :] for n in getattr(exc, "__notes__", []) if n.startswith(_UNDONE)]


def sleep_ticking(sleep: Sleep, seconds: float, tick: Callable[[], None]) -> None:
    """``sleep(seconds)`` in steps of at most a second, calling ``tick`` after each: a wait's elapsed
    counter keeps moving between polls instead of standing still for a whole poll interval."""
    if seconds <= 0:
        sleep(seconds)
        return
    left = seconds
    while left > 0:
        chunk = min(1.0, left)
        sleep(chunk)
        left -= chunk
        tick()
