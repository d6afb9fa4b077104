"""An MCP server to train against: a calculator and a notebook of notes, over stdio (the default) or streamable HTTP.

    python -m grpo_recipes.mcp_example_server                      # stdio: mcp_grpo.py's default --mcp_command
    python -m grpo_recipes.mcp_example_server --http --port 8765   # http://127.0.0.1:8765/mcp

mcp_grpo.py's default server and the tests' (offline, on a CPU): a real server process speaking MCP through the
official SDK (`mcp.server.mcpserver.MCPServer`), the shape of a server you bring. `calculate` holds no state, and its
arithmetic is bounded (grpo_recipes/arithmetic.py: no step beyond 10**1000, so no call can hold the server); the notes
do hold state, one notebook per server process, and the tools say so in their annotations (`readOnlyHint`), which is
how mcp_grpo.py's default `--mcp_session auto` knows to give each rollout a server of its own over stdio (a process
serves one connection there). Over HTTP every client shares the one notebook: MCP's 2026-07-28 revision has no
sessions, and a server that keeps state per client keys it itself. `--faults` adds tools
for the tests of the client's handling, most misbehaving on purpose: one that sleeps, one that fails, one that answers
at length, one that kills the server, one whose arguments take every JSON schema shape the client must describe to
the model, and one that reads the server's environment.
"""

import argparse
import os
import time
from typing import Literal

from pydantic import BaseModel

from grpo_recipes import arithmetic
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations

READ_ONLY = ToolAnnotations(readOnlyHint=True)  # the tool changes no state: clients may share a session for it


class Point(BaseModel):
    x: float
    y: float


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression (numbers, parentheses, + - * / // % **) and return its value."""
    operators = ("+", "-", "*", "/", "//", "%", "**")
    try:
        value = arithmetic.evaluate(arithmetic.admit(expression, operators))
    except (ValueError, ZeroDivisionError, OverflowError) as err:
        raise ToolError(f"cannot calculate {expression[:200]!r}: {err}") from None
    return str(int(value) if isinstance(value, float) and value.is_integer() else value)


def build_server(faults: bool = False) -> MCPServer:
    server = MCPServer("grpo-recipes example")
    notes: dict[str, str] = {}  # the server's state: its one notebook
    server.tool(annotations=READ_ONLY)(calculate)  # module-level: benchmarks/bench_mcp.py calls it as a plain tool

    @server.tool()
    def write_note(title: str, text: str) -> str:
        """Keep a note under a title, replacing any note of that title. Notes last as long as the server."""
        notes[title] = text
        return f"saved {title[:100]!r}"

    @server.tool(annotations=READ_ONLY)
    def read_note(title: str) -> str:
        """Read the note kept under a title."""
        if title not in notes:
            raise ToolError(f"no note titled {title[:100]!r}")  # not the titles there are: they may be another's
        return notes[title]

    if faults:
        add_fault_tools(server)
    return server


def add_fault_tools(server: MCPServer) -> None:
    """The tests' tools (--faults)."""

    @server.tool()
    def sleep(seconds: float) -> str:
        """Wait, then answer (the client's timeout is tested against it)."""
        time.sleep(seconds)
        return f"slept {seconds} s"

    @server.tool()
    def fail(message: str) -> str:
        """Fail with the message (an error result)."""
        raise ToolError(message)

    @server.tool()
    def long_text(characters: int) -> str:
        """Answer with this many characters."""
        return "x" * characters

    @server.tool()
    def crash(status: int = 3) -> str:
        """End the server process at once, as a crashing server does."""
        os._exit(status)

    @server.tool()
    def environment(name: str) -> str:
        """The value of one of the server's environment variables, or 'unset' (what --mcp_env passed)."""
        return os.environ.get(name, "unset")

    @server.tool()
    def shapes(word: str, count: int, ratio: float, flag: bool, numbers: list[int], mode: Literal["fast", "slow"],
               point: Point, maybe: str | None = None, limit: int = 5) -> str:
        """Take an argument of every JSON schema shape.

        Args:
            word: A word.
            count: A whole number.
            ratio: A number.
            flag: True or false.
            numbers: Whole numbers.
            mode: How fast.
            point: A point in the plane.
            maybe: A word, or nothing.
            limit: At most this many.
        """
        return f"{word} {count} {ratio} {flag} {numbers} {mode} {point.x},{point.y} {maybe} {limit}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", action="store_true", help="serve streamable HTTP instead of stdio")
    parser.add_argument("--port", type=int, default=8765, help="with --http: the port on 127.0.0.1")
    parser.add_argument("--faults", action="store_true", help="add the tests' tools, most misbehaving on purpose")
    args = parser.parse_args(argv)
    server = build_server(args.faults)
    if args.http:
        server.run("streamable-http", host="127.0.0.1", port=args.port)
    else:
        server.run()


if __name__ == "__main__":
    main()
