"""``gemma4-t4 mcp``: run the MCP server on stdio (for Claude Code, Codex, Cursor, ...)."""

from __future__ import annotations

import argparse

from gemma4_t4.cli import Output, add_command


def _run(args: argparse.Namespace) -> Output:
    # lazy: the MCP SDK (about 4 s to import) loads only for gemma4-t4 mcp, not for every CLI start-up
    from gemma4_t4.mcp_server import main

    main()
    return Output(None, "")


def register(subparsers: argparse._SubParsersAction) -> None:
    add_command(subparsers, "mcp", _run, "run the MCP server (stdio) with the SageMaker and serving tools",
                description="Run the gemma4-t4 MCP server on stdio. Example client config: mcp.example.json")
