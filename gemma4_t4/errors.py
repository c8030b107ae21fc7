"""One exception type for every user-facing failure.

Each error carries the fix, so the CLI, the MCP server and the notebooks can all show
"what went wrong" and "what to do" the same way.
"""

from __future__ import annotations


class Gemma4T4Error(Exception):
    """A failure the user can act on. ``fix`` says how."""

    def __init__(self, message: str, fix: str | None = None):
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        if self.fix:
            return f"{self.message}\n  fix: {self.fix}"
        return self.message

    def to_dict(self) -> dict:
        return {"error": type(self).__name__, "message": self.message, "fix": self.fix}
