"""One exception type for every user-facing failure (it carries the fix, so the CLI, the MCP server and
the notebooks all show "what went wrong" and "what to do"), and :func:`user_error`, the error boundaries'
translation of any other exception: its type, message and a fix, never a traceback (``--debug`` shows it).
"""

from __future__ import annotations

import errno
import os

DEBUG_ENV = "GEMMA4_T4_DEBUG"
DEBUG_FIX = (
    f"rerun with --debug (or {DEBUG_ENV}=1) to see the traceback, and report it if the cause is not yours"
)


class Gemma4T4Error(Exception):
    """A failure the user can act on. ``fix`` says how. ``kind`` names it in :meth:`to_dict`: its own type's
    name, or (as :func:`user_error` shows any other exception) the original exception's."""

    def __init__(self, message: str, fix: str | None = None, kind: str | None = None):
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.kind = kind or type(self).__name__

    def __str__(self) -> str:
        return f"{self.message}\n  fix: {self.fix}" if self.fix else self.message

    def to_dict(self) -> dict[str, str | None]:
        return {"error": self.kind, "message": self.message, "fix": self.fix}


# The optional packages the package imports where they are used, and what installs each: a
# ModuleNotFoundError for one of them names its extra (tests/test_imports_declared.py checks this
# table against pyproject.toml and against every such import in the package).
EXTRA_FOR_MODULE = {
    "boto3": "aws", "botocore": "aws", "mcp": "mcp", "anyio": "mcp", "matplotlib": "notebooks",
    "papermill": "notebooks", "nbconvert": "notebooks", "nbformat": "notebooks",
    "jupyter_client": "notebooks", "mistune": "notebooks", "IPython": "notebooks", "torch": "model",
    "transformers": "model", "tokenizers": "model", "moto": "dev",
}
# vLLM (and the Triton it brings) depends on the host's GPU and driver: setup picks the build
SETUP_FOR_MODULE = ("vllm", "triton")


def missing_module_fix(exc: ModuleNotFoundError) -> str | None:
    """The install that brings the module ``exc`` names, where it is one of the package's extras."""
    top = (exc.name or "").split(".")[0]
    if top in EXTRA_FOR_MODULE:
        return f"pip install 'gemma4-t4[{EXTRA_FOR_MODULE[top]}]'"
    if top in SETUP_FOR_MODULE:
        return "gemma4-t4 setup (installs the vLLM build this host's GPU and driver run; no GPU: the CPU build)"
    return None


def debug_enabled(flag: bool = False) -> bool:
    """``--debug`` was given, or ``GEMMA4_T4_DEBUG`` is set to something other than 0/empty."""
    return flag or os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def os_fix(exc: OSError) -> str | None:
    """What to do about a file-system or network ``OSError`` the user can act on (None: no advice)."""
    where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
    return {
        errno.ENOSPC: f"free disk space{where}, or write to a disk with more room",
        errno.EDQUOT: f"free space within your disk quota{where}, or write elsewhere",
        errno.EFBIG: f"raise the file-size limit (ulimit -f){where}, or write to another disk",
        errno.EROFS: f"the filesystem is read-only{where}: choose a writable location",
        errno.EACCES: f"check the owner and permissions{where}, or choose a location you can write",
        errno.EPERM: f"this needs permissions you do not have{where}: choose another location or run as its owner",
        errno.ENOENT: f"check the path exists{where} (its parent folder too)",
        errno.ENOTDIR: f"a part of the path is a file, not a folder{where}: choose another path",
        errno.EISDIR: f"the path is a folder, not a file{where}: pass a file path",
        errno.EEXIST: f"the path already exists{where}: choose a new one or remove it first",
        errno.ENAMETOOLONG: f"a file name or the whole path is longer than the filesystem allows{where}: "
        "choose a shorter name or a shallower folder (e.g. a shorter --out or --work-dir)",
        errno.EPIPE: "the program reading this output closed it early (e.g. `| head`): read all of it, or ignore this",
        errno.EADDRINUSE: "the port is taken: choose another port (or stop what listens there)",
        errno.ECONNREFUSED: "nothing listens there: start the server, or check the URL and port",
    }.get(exc.errno or -1)


def user_error(exc: BaseException) -> Gemma4T4Error:
    """``exc`` as a :class:`Gemma4T4Error` with a one-line message and a fix (itself if it is one)."""
    if isinstance(exc, Gemma4T4Error):
        return exc
    name = type(exc).__name__
    text = " ".join((str(exc) or name).split())  # on one line, at most 400 characters
    text = text if len(text) <= 400 else text[:397] + "..."
    fix: str | None = None
    if isinstance(exc, OSError):
        fix = os_fix(exc)
    elif isinstance(exc, ModuleNotFoundError):
        fix = missing_module_fix(exc)
    module = type(exc).__module__ or ""
    if fix is not None:
        pass
    elif module.startswith("yaml"):
        fix = "fix the YAML syntax at the line and column named above"
    elif name == "JSONDecodeError":
        fix = "the file or reply is not valid JSON: check it (or regenerate it)"
    elif isinstance(exc, UnicodeError):
        fix = "the input is not UTF-8 text: pass a text file"
    elif isinstance(exc, MemoryError):
        fix = "use a machine with more RAM (or add swap: gemma4-t4 swap create), or a smaller model"
    elif isinstance(exc, (ConnectionError, TimeoutError)) or module.startswith(("urllib", "http")):
        fix = "check the URL and that the server is up (gemma4-t4 serve status)"
    elif module.startswith(("botocore", "boto3")):
        fix = "check AWS credentials, region and permissions (aws sts get-caller-identity)"
    return Gemma4T4Error(f"{name}: {text}", fix or DEBUG_FIX, kind=name)
