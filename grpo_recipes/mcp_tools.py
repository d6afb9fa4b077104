"""Any MCP server's tools as a recipe's tools (mcp_grpo.py): the server's own names, descriptions and argument schemas,
each call sent to the server through the official SDK's client (`mcp.Client`), over stdio or streamable HTTP.

    tools = McpTools(McpServer(command="python -m grpo_recipes.mcp_example_server"))
    tools.start()                                  # connect and list the tools: a server that cannot start is one line
    GRPOTrainer(..., environment_factory=tools)    # one McpToolbox per rollout; its methods are the server's tools

TRL shows the model a tool as transformers' get_json_schema describes a Python function (its docstring and type
hints), so each MCP tool becomes such a function: its hints and `Args:` lines say what the tool's input schema says,
and what hints cannot carry (a nested object's fields, a range, a default) is written into the argument's line as
JSON, so the model is shown everything the server declared.

Sessions (`McpServer.session`): "shared" is one connection for every rollout of the process (a server without state,
or whose state all rollouts may share); "rollout" gives each rollout a new connection at its reset and closes its last
one (over stdio, a new server process), so that no rollout sees another's state; "auto" (the default) is "shared" when
every offered tool declares itself read-only (the MCP annotation `readOnlyHint`: it changes no state a rollout could
leave for another), else "rollout".

Warm pool (session "rollout", `McpServer.warm_pool`): the pool holds a spare connection, opened ahead and never used,
for each toolbox that started a rollout within SPARE_IDLE_SECONDS (TRL keeps a toolbox per rollout of its largest
batch, and reuses them: training's batch every step, evaluation's extra ones at each evaluation); a reset takes the
oldest spare and another is started in the background in its place, so a rollout's first call does not wait for a
server to start (benchmarks/bench_mcp.py measures it). Spares beyond that count are closed, the newest first, within a
second of becoming surplus (all of them once no rollout has started for SPARE_IDLE_SECONDS). A call that finds its
server still starting (the first step, a batch larger than any before it, a server slower to start than a step) is
counted in `mcp/start_waits`.

A call answers the result's text, cut at `max_result_chars` (marked, and counted as `mcp/truncated`); an error's text
is cut the same way. A call that fails (an error result, arguments the server rejects, no answer within `timeout`)
raises ToolCallFailed: TRL's loop makes it the tool message `{"error": ...}` and counts it in
`tools/failure_frequency` (evaluate.py: an `Error:` result). A connection whose call timed out is closed (a stdio
server's process with it) and the next call opens a fresh one, so one call cannot stall every rollout behind it
(`mcp/timeouts` counts them); MAX_TIMEOUTS_IN_A_ROW timed-out calls with no answered call between them stop the run in
one line rather than train on failures. A server that is gone (its process ended, its URL refuses) raises StopRun,
which TRL's loop does not swallow: the run stops with one line naming the server and the last line it wrote to
stderr.

Trust: a server's tools run outside the sandbox, with the rights of the server's process (a stdio server runs as you).
"""

import asyncio
import collections
import concurrent.futures
import inspect
import json
import keyword
import os
import shlex
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Literal, Union

from grpo_recipes.contract import NOT_TOOLS, StepHooks
from grpo_recipes.refusal import Refusal, StopRun

SESSIONS = ("auto", "shared", "rollout")
SPARE_IDLE_SECONDS = 600.0  # a toolbox with no rollout started this long keeps no spare (an evaluation's; a run's end)
MAX_TIMEOUTS_IN_A_ROW = 8  # timed-out calls with no answered one between them: the server is not coming back
STARTUP_SECONDS = 60.0  # a stdio server imports its SDK first: seconds on a loaded machine
JSON_HINTS = {"string": str, "integer": int, "number": float, "boolean": bool, "null": type(None), "array": list,
              "object": dict}


class ToolCallFailed(Exception):
    """A call the server answered with an error, rejected, or did not answer in time: the rollout's tool message."""


class ToolCallTimedOut(ToolCallFailed):
    """A call the server did not answer within the timeout: its connection is replaced before the next call."""


@dataclass(frozen=True)
class McpServer:
    """Where the tools are and how they are called: a stdio `command` (started by the client) or a streamable-HTTP
    `url`; the sessions; seconds a call may take; characters of a result the model is shown; the tools offered (all
    when empty); the names of this run's environment variables a stdio server is given besides the SDK's few (PATH,
    HOME, ...): their values are read where the server starts, never pickled; whether session "rollout" keeps spare
    connections started ahead of the rollouts (a spare server per rollout: False for a server too heavy to run twice
    over)."""

    command: str | None = None
    url: str | None = None
    session: str = "auto"
    timeout: float = 30.0
    max_result_chars: int = 4000
    tools: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    warm_pool: bool = True

    def __post_init__(self):
        if (self.command is None) == (self.url is None):
            raise Refusal("name one MCP server: --mcp_command (a stdio server) or --mcp_url (streamable HTTP)")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise Refusal(f"--mcp_url {self.url}: an http:// or https:// URL of a streamable-HTTP server (…/mcp)")
        if self.session not in SESSIONS:
            raise Refusal(f"--mcp_session {self.session}: one of {', '.join(SESSIONS)}")
        if self.command is not None and not self.argv():
            raise Refusal("--mcp_command is empty: the command that starts a stdio MCP server")
        if self.timeout <= 0 or self.max_result_chars < 1:
            raise Refusal("--mcp_timeout and --mcp_max_result_chars: above 0")
        if self.env and self.url is not None:
            raise Refusal("--mcp_env gives variables to a server this run starts (--mcp_command); the server at "
                          "--mcp_url has its own environment")
        if unset := [name for name in self.env if name not in os.environ]:
            raise Refusal(f"--mcp_env names {', '.join(unset)}, which this run's environment does not set: export "
                          "it, or leave it out")

    def argv(self) -> list[str]:
        """The command as a list; `python` is this interpreter, so the server finds the packages of this run."""
        try:
            argv = shlex.split(self.command)
        except ValueError as err:
            raise Refusal(f"--mcp_command {self.command!r}: {err}") from None
        return [sys.executable, *argv[1:]] if argv and argv[0] in ("python", "python3") else argv

    def name(self) -> str:
        return f"`{self.command}`" if self.command is not None else self.url


class _EventLoop:
    """An asyncio loop on a daemon thread: the SDK's client is async, and TRL calls tools from its own threads."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="mcp-client", daemon=True).start()

    def submit(self, coroutine) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)


class _Connection:
    """One client session, opened at once in the background (a pool of rollouts starts its servers side by side) and
    held open by a task on the loop until close()."""

    def __init__(self, server: McpServer, loop: _EventLoop):
        self.server, self.loop = server, loop
        # the server's stderr, read back for the line that says why it ended; closed with this connection's object
        self.stderr = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") if server.command else None  # noqa: SIM115
        self.retired = False  # closed by this run after a call timed out: the calls still on it fail, not the run
        self.ready: concurrent.futures.Future = concurrent.futures.Future()
        self.closing = asyncio.Event()  # made here, so that a close() before the task runs is not missed
        self.held = loop.submit(self._hold())

    def _transport(self):
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        if self.server.url is not None:
            return self.server.url
        argv = self.server.argv()
        env = {name: os.environ[name] for name in self.server.env if name in os.environ}  # the SDK adds its few
        return stdio_client(StdioServerParameters(command=argv[0], args=argv[1:], env=env), errlog=self.stderr)

    async def _hold(self) -> None:
        from mcp import Client

        try:
            async with Client(self._transport()) as client:
                await client.list_tools()  # the SDK lists them before a session's first call: here, ahead of it
                self.ready.set_result(client)
                await self.closing.wait()
        except BaseException as err:  # noqa: BLE001 - a start that failed is the caller's line; a later end, its calls'
            if not self.ready.done():
                self.ready.set_exception(err)

    def client(self):
        try:
            return self.ready.result(STARTUP_SECONDS)
        except concurrent.futures.TimeoutError:
            raise StopRun(f"the MCP server {self.server.name()} did not start within {STARTUP_SECONDS:g} s"
                          f"{self.last_words()}") from None
        except Exception as err:  # noqa: BLE001 - one line names the server and what it said
            verb = "did not start" if self.server.command else "could not be reached"
            raise StopRun(f"the MCP server {self.server.name()} {verb}: {describe(err)}{self.last_words()}") from None

    def call(self, name: str, arguments: dict) -> Any:
        """The tool's CallToolResult; ToolCallFailed for a call the server rejected or did not answer in time; StopRun
        where the server is gone (not where this run closed it: see McpTools.timed_out)."""
        try:
            return self._call_tool(name, arguments)
        except (StopRun, ToolCallTimedOut):
            if self.retired:  # another call timed out here and the connection was closed: this call failed with it
                raise ToolCallFailed(f"{name}: the server was restarted after another call did not answer") from None
            raise

    def _call_tool(self, name: str, arguments: dict) -> Any:
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        client = self.client()
        future = self.loop.submit(client.call_tool(name, arguments, read_timeout_seconds=self.server.timeout))
        try:
            return future.result(self.server.timeout + 10)  # the SDK's own timeout ends it first
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise ToolCallTimedOut(f"{name} did not answer within {self.server.timeout:g} s") from None
        except MCPError as err:
            if err.code == REQUEST_TIMEOUT:
                raise ToolCallTimedOut(f"{name} did not answer within {self.server.timeout:g} s") from None
            if err.code != CONNECTION_CLOSED:
                raise ToolCallFailed(f"{name}: {err}") from None
            raise StopRun(self.gone(name, err)) from None
        except Exception as err:  # noqa: BLE001 - the transport failed (a refused connection, a broken pipe)
            if "ValidationError" in type(err).__name__:  # a result the protocol does not allow: the tool's fault
                raise ToolCallFailed(f"{name} answered something MCP does not allow: {describe(err)}") from None
            raise StopRun(self.gone(name, err)) from None

    def gone(self, name: str, err: BaseException) -> str:
        return (f"the MCP server {self.server.name()} stopped answering during a call to {name} ({describe(err)})"
                f"{self.last_words()}: fix or restart the server, then resume the run")

    def last_words(self) -> str:
        """The last line the server wrote to stderr, where it was started here."""
        if self.stderr is None:
            return ""
        self.stderr.flush()
        self.stderr.seek(0)
        lines = [line.strip() for line in self.stderr.read().splitlines() if line.strip()]
        return f"; its stderr ends: {lines[-1][:300]}" if lines else ""

    def close(self, wait: bool = True) -> None:
        """End the session (a stdio server's process exits with it); `wait`: until it ended, or 10 s for a server
        that hangs."""
        self.loop.loop.call_soon_threadsafe(self.closing.set)
        if not wait:
            return
        try:
            self.held.result(10)
        except Exception:  # noqa: BLE001 - a server that does not close is left to exit with this process
            self.held.cancel()


def describe(err: BaseException) -> str:
    """One line for an exception, the first inside an exception group (anyio wraps the transport's)."""
    while isinstance(err, BaseExceptionGroup) and err.exceptions:
        err = err.exceptions[0]
    text = " ".join(str(err).split()) or type(err).__name__
    return text[:300]


class McpToolbox:
    """The tools of one rollout: TRL's environment_factory makes one per rollout and calls reset() before its
    generation. Its methods (made per server by McpTools) send each call to the server; with session "rollout" each
    reset opens a new connection."""

    def __init__(self, tools: "McpTools"):
        self._tools, self._connection, self._opened = tools, None, []
        weakref.finalize(self, _close_all, self._opened)  # a rollout's last connection closes with its toolbox

    def reset(self, **row) -> None:
        if self._tools.session == "rollout":
            _close_all(self._opened)  # in the background: the next rollout does not wait for the last one's server
            self._connection = self._tools.connect(self)
            self._opened.append(self._connection)

    def _call(self, name: str, arguments: dict) -> str:
        if self._tools.session == "shared":
            self._connection = self._tools.shared()  # a fresh one after a timeout
        elif self._connection is None:  # a call before any reset (a toolbox used directly)
            self.reset()
        if not self._connection.ready.done():
            self._tools.count("start_waits")
        try:
            result = self._connection.call(name, arguments)
        except ToolCallTimedOut:
            if self._connection in self._opened:
                self._opened.remove(self._connection)  # timed_out closes it, in the background
            self._tools.timed_out(self._connection)
            if self._tools.session == "rollout":  # this rollout's next call goes to a fresh server
                self.reset()
            raise
        return self._tools.answer(name, result)


def _close_all(connections: list) -> None:
    for connection in connections:
        connection.close(wait=False)
    connections.clear()


class McpTools:
    """The environment_factory of a run's MCP tools: start() lists the server's tools (once per process) and makes
    the toolbox class whose methods they are; calling it makes one toolbox. Only the McpServer is pickled (TRL's async
    trainer runs tools in a spawned process, which connects again)."""

    def __init__(self, server: McpServer):
        self.server = server
        self.session = server.session  # "auto" is decided when the tools are listed
        self.stats = {"calls": 0, "truncated": 0, "timeouts": 0, "start_waits": 0}
        self._timeouts_in_a_row, self._why = 0, ""
        self._loop = self._shared = self._toolbox = None
        self._spares: collections.deque[_Connection] = collections.deque()  # oldest first: the likeliest ready
        self._started = weakref.WeakKeyDictionary()  # toolbox -> time.monotonic() of its last rollout's start
        self._reaping = False  # a _reap_spares is scheduled
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {"server": self.server}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["server"])

    def __call__(self) -> McpToolbox:
        self.start()  # once per process: a spawned one lists the tools again
        return self._toolbox(self)

    def start(self) -> None:
        """Connect and list the tools now: a server that does not start, or a tool the model cannot be shown, is one
        line (a Refusal) before training."""
        if self._toolbox is None:
            self._toolbox = self._toolbox_class(self.list_tools())

    def describe(self) -> str:
        names = [name for name, _ in inspect.getmembers(self._toolbox, inspect.isfunction) if name not in NOT_TOOLS
                 and not name.startswith("_")] if self._toolbox else []
        plural = "s" if len(names) != 1 else ""
        return (f"MCP server {self.server.name()}: {len(names)} tool{plural} ({', '.join(names)}), "
                f"{'one session per rollout' if self.session == 'rollout' else 'one shared session'}"
                f"{' (auto: ' + self._why + ')' if self.server.session == 'auto' else ''}; "
                f"they run outside the sandbox, with the server's rights")

    def connect(self, toolbox: McpToolbox) -> _Connection:
        """A new connection for the toolbox's rollout: the oldest spare where there is one, else one started now;
        with the warm pool, spares are then started in the background up to one per active toolbox."""
        with self._lock:
            now = time.monotonic()
            self._started[toolbox] = now
            connection = self._spares.popleft() if self._spares else self._open()
            if self.server.warm_pool:
                while len(self._spares) < self._active(now):
                    self._spares.append(self._open())
                if not self._reaping:
                    self._reaping = True
                    self._loop.loop.call_soon_threadsafe(self._reap_spares)
        return connection

    def _active(self, now: float) -> int:
        """The toolboxes that started a rollout within SPARE_IDLE_SECONDS: the spares the pool keeps."""
        return sum(now - started < SPARE_IDLE_SECONDS for started in list(self._started.values()))

    def count(self, stat: str) -> None:
        with self._lock:
            self.stats[stat] += 1

    def spares(self) -> int:
        return len(self._spares)

    def close(self) -> None:
        """Close the shared connection and the spares, and wait for them (the rollouts' own close with their
        toolboxes)."""
        with self._lock:
            connections = [*self._spares, *([self._shared] if self._shared else [])]
            self._spares.clear()
            self._shared = None
        for connection in connections:
            connection.close()

    def _open(self) -> _Connection:
        if self._loop is None:
            self._loop = _EventLoop()
        return _Connection(self.server, self._loop)

    def _reap_spares(self) -> None:
        """On the client's loop, once a second while there are spares: close those beyond the active toolboxes."""
        with self._lock:
            surplus = []
            while len(self._spares) > self._active(time.monotonic()):
                surplus.append(self._spares.pop())  # the newest: the oldest are the likeliest ready
            self._reaping = bool(self._spares)
            if self._reaping:
                self._loop.loop.call_later(1.0, self._reap_spares)
        _close_all(surplus)

    def timed_out(self, connection: _Connection) -> None:
        """A call on `connection` timed out: close it in the background (the shared one is replaced at the next
        call), count it, and stop the run after MAX_TIMEOUTS_IN_A_ROW with no answer between them."""
        with self._lock:
            if connection.retired:
                return  # counted and closed already (calls that waited behind the one that timed out)
            connection.retired = True
            self.stats["timeouts"] += 1
            self._timeouts_in_a_row += 1
            if self._shared is connection:
                self._shared = None
            in_a_row = self._timeouts_in_a_row
        threading.Thread(target=connection.close, daemon=True).start()
        if in_a_row >= MAX_TIMEOUTS_IN_A_ROW:
            raise StopRun(f"the MCP server {self.server.name()} did not answer {in_a_row} calls in a row within "
                          f"--mcp_timeout {self.server.timeout:g} s{connection.last_words()}: fix the server, or raise "
                          "--mcp_timeout, then resume the run")

    def shared(self) -> _Connection:
        with self._lock:
            if self._shared is None:
                self._shared = self._open()
        return self._shared

    def list_tools(self) -> list:
        """The server's tools (those of McpServer.tools, when named), listed through a connection of this run."""
        if self.server.session in ("shared", "auto"):
            connection = self.shared()
        else:  # not a rollout's: no spare is taken or started for it
            with self._lock:
                connection = self._open()
        try:
            client = connection.client()
            listed = connection.loop.submit(client.list_tools()).result(self.server.timeout)
        except StopRun as stop:
            raise Refusal(str(stop)) from None
        except Exception as err:  # noqa: BLE001 - one line naming the server
            raise Refusal(f"the MCP server {self.server.name()} did not list its tools: {describe(err)}"
                        f"{connection.last_words()}") from None
        finally:
            if connection is not self._shared:
                connection.close()
        tools = {tool.name: tool for tool in listed.tools}
        missing = [name for name in self.server.tools if name not in tools]
        if missing:
            raise Refusal(f"--mcp_tools names {', '.join(missing)}, which the MCP server {self.server.name()} does "
                        f"not offer; it offers {', '.join(tools) or 'no tools'}")
        if self.server.tools:
            tools = {name: tools[name] for name in self.server.tools}
        if not tools:
            raise Refusal(f"the MCP server {self.server.name()} offers no tools")
        if self.server.session == "auto":  # shared only where no offered tool can leave state for another rollout
            writers = [name for name, tool in tools.items()
                       if not (tool.annotations is not None and tool.annotations.read_only_hint)]
            self.session = "rollout" if writers else "shared"
            self._why = f"{', '.join(writers)} may keep state" if writers else "every tool is read-only"
            if writers:  # the connection that listed them serves no rollout
                with self._lock:
                    self._shared = None
                connection.close()
        return list(tools.values())

    def _toolbox_class(self, tools: list) -> type:
        methods = {}
        for tool in tools:
            problem = unusable(tool.name, tool.input_schema)
            if problem:
                raise Refusal(f"the MCP tool {tool.name} cannot be offered to the model: {problem}; leave it out "
                              "with --mcp_tools (the tools to offer)")
            methods[tool.name] = tool_function(tool.name, tool.description or "", tool.input_schema)
        return type("McpToolbox", (McpToolbox,), methods)

    def answer(self, name: str, result) -> str:
        """The result as the model reads it; an error result raises ToolCallFailed."""
        text = result_text(result)
        with self._lock:
            self._timeouts_in_a_row = 0  # the server answers
            self.stats["calls"] += 1
            if len(text) > self.server.max_result_chars:
                self.stats["truncated"] += 1
        if len(text) > self.server.max_result_chars:
            cut = len(text) - self.server.max_result_chars
            text = (f"{text[:self.server.max_result_chars]}\n[{cut} more characters cut: a result is shown up to "
                    f"{self.server.max_result_chars}]")
        if result.is_error:
            raise ToolCallFailed(text or f"{name} failed")
        return text


def result_text(result) -> str:
    """A CallToolResult's content as text: its text blocks, a resource's text, other blocks named; the structured
    content where there is nothing else."""
    parts = []
    for block in result.content:
        if getattr(block, "text", None) is not None:
            parts.append(block.text)
        elif getattr(getattr(block, "resource", None), "text", None) is not None:
            parts.append(block.resource.text)
        else:
            parts.append(f"[{block.type} content]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content))
    return "\n".join(parts)


def unusable(name: str, schema: dict) -> str:
    """Why a tool cannot be a method TRL offers (a name TRL reserves, an argument that is not a Python name), or ''."""
    if name in NOT_TOOLS or name.startswith("_"):
        return f"TRL keeps the name {name!r} for itself"
    for argument in (schema or {}).get("properties", {}):
        if not argument.isidentifier() or keyword.iskeyword(argument) or argument == "self":
            return f"its argument {argument!r} is not a Python name, which TRL's tool schemas need"
    return ""


def tool_function(name: str, description: str, schema: dict):
    """A function TRL can offer as the MCP tool: named as the tool, its docstring the tool's description and an
    `Args:` line per argument, a type hint per argument from its JSON schema; what the hint and the line cannot say is
    added to the line as JSON. Calling it (as a toolbox's method) sends the call to the server."""
    from transformers.utils import get_json_schema
    from transformers.utils.chat_template_utils import parse_google_format_docstring

    schema = inline_refs(schema or {}, schema or {})
    properties, required = schema.get("properties", {}), set(schema.get("required", []))
    summary, documented, _ = parse_google_format_docstring(description.strip() or name)  # a server's own Args: lines
    summary = (summary or name).strip()

    def call(self, **arguments):
        return self._call(name, arguments)

    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for argument, spec in properties.items():
        default = inspect.Parameter.empty if argument in required else spec.get("default")
        parameters.append(inspect.Parameter(argument, inspect.Parameter.KEYWORD_ONLY, default=default,
                                            annotation=hint(spec)))
    call.__name__ = call.__qualname__ = name
    call.__signature__ = inspect.Signature(parameters)
    call.__annotations__ = {p.name: p.annotation for p in parameters[1:]}
    lines = {argument: " ".join(str(spec.get("description") or (documented or {}).get(argument)
                                    or spec.get("title") or argument).split())
             for argument, spec in properties.items()}
    call.__doc__ = docstring(summary, lines)
    shown = get_json_schema(call)["function"]["parameters"]["properties"]
    for argument, spec in properties.items():  # what the hint could not carry, written out
        declared, rendered = untitled(spec), untitled(shown[argument])
        if "default" in declared:
            lines[argument] += f" (default: {json.dumps(declared.pop('default'))})"
        rendered.pop("description", None)
        declared.pop("description", None)
        if declared != rendered:
            lines[argument] += f" (JSON schema: {json.dumps(declared, separators=(', ', ': '))})"
    call.__doc__ = docstring(summary, lines)
    return call


def docstring(summary: str, lines: dict) -> str:
    text = summary
    if lines:
        text += "\n\nArgs:\n" + "".join(f"    {argument}: {line}\n" for argument, line in lines.items())
    return text


def hint(spec: dict):
    """The Python type hint transformers turns back into (most of) this JSON schema."""
    if "enum" in spec and spec["enum"] and all(type(v) in (str, int, float, bool, type(None)) for v in spec["enum"]):
        return Literal[tuple(spec["enum"])]
    choices = spec.get("anyOf") or spec.get("oneOf")
    if choices:
        hints = tuple(dict.fromkeys(hint(choice) for choice in choices))
        return hints[0] if len(hints) == 1 else Union[hints]  # noqa: UP007 - a Union built from a tuple
    kind = spec.get("type")
    if isinstance(kind, list):
        hints = tuple(dict.fromkeys(hint({**spec, "type": k}) for k in kind))
        return hints[0] if len(hints) == 1 else Union[hints]  # noqa: UP007
    if kind == "array" and isinstance(spec.get("items"), dict):
        return list[hint(spec["items"])]
    if kind == "object" and isinstance(spec.get("additionalProperties"), dict) and not spec.get("properties"):
        return dict[str, hint(spec["additionalProperties"])]
    return JSON_HINTS.get(kind, Any)


def untitled(spec):
    """A schema without its titles (pydantic writes one per field; the model is not shown them)."""
    if isinstance(spec, dict):
        return {k: untitled(v) for k, v in spec.items() if k != "title"}
    if isinstance(spec, list):
        return [untitled(v) for v in spec]
    return spec


def inline_refs(spec, root: dict, depth: int = 0):
    """The schema with each local `$ref` (#/$defs/...) replaced by what it names, so that no line says "see $defs"."""
    if isinstance(spec, list):
        return [inline_refs(v, root, depth) for v in spec]
    if not isinstance(spec, dict):
        return spec
    ref = spec.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/") and depth < 8:
        target = root
        for part in ref[2:].split("/"):
            target = target.get(part, {}) if isinstance(target, dict) else {}
        rest = {k: v for k, v in spec.items() if k != "$ref"}
        return inline_refs({**target, **rest}, root, depth + 1)
    return {k: inline_refs(v, root, depth) for k, v in spec.items() if k != "$defs"}


class McpCallLog(StepHooks):
    """Logs, each logged step, since the last log: `mcp/truncated`, the results cut at --mcp_max_result_chars (a share
    that grows says the model reads less than the server answers); `mcp/timeouts`, the calls the server did not answer
    in time; `mcp/start_waits`, the calls that waited for their server to start (the first step's; later ones say the
    servers start slower than a step, or a batch outgrew the pool); and `mcp/spares`, the spare servers held now.
    Failures are TRL's `tools/failure_frequency`.
    In async_grpo.py's rollout process the tools run elsewhere, and nothing is logged here."""

    def __init__(self, tools: McpTools):
        self.tools, self.seen = tools, {"truncated": 0, "timeouts": 0, "start_waits": 0}

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is not None and "loss" in logs:
            for name, seen in self.seen.items():
                now = self.tools.stats[name]
                logs[f"mcp/{name}"], self.seen[name] = now - seen, now
            if self.tools.session == "rollout":
                logs["mcp/spares"] = self.tools.spares()

