"""Inside the sandbox: the fork server ("zygote") that sandbox.py starts once, and the calls it forks.

The zygote reads one JSON request per line: a call ({"code": ...}), which a confined child runs and reports on, or a
session ({"program": ...}), a confined child that answers the messages the lines after it relay. Every child is
confined (confinement.confine) before anything of the call runs, and killed when the call ends.

This module runs inside the sandbox: it imports nothing of ours but confinement.py (sandbox.SANDBOX_FILES).
"""

import ast
import builtins
import ctypes
import json
import os
import select
import signal
import sys
import tempfile
import time
import traceback

from grpo_recipes.confinement import CALL_DIR, PR_SET_DUMPABLE, SANDBOX_DIR, confine, effective_capabilities, \
    landlock_abi, random_states, remove_tree, seccomp_filter

REPORT_MARKER = "\n[... {} more characters truncated]"
MESSAGE_BYTES = 1_000_000  # the longest answer a session's child may give to one message


def serve(config_json: str) -> None:
    """Fork one confined child per request line; answer each with one JSON line. Exits when stdin closes."""
    config = json.loads(config_json)
    libc = ctypes.CDLL(None, use_errno=True)
    _warm_up(config["preload"], config["warmup"])  # before the random generators are found: they may make some
    protections = {"engine": None if config["in_bwrap"] else "landlock", "namespaces": config["in_bwrap"],
                   "fresh_tmp": False, "separate_user": False}
    confinement = _confinement(config, libc, protections)
    print(json.dumps(protections), flush=True)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # the trainer stops reading stderr once the zygote is up
    try:
        _serve_requests(confinement, libc)
    finally:
        if confinement["calls_dir"]:
            remove_tree(confinement["calls_dir"])


def _warm_up(preload: list[str], warmup: str) -> None:
    """Import what every call may use, once, so that a forked child has it for free."""
    for module in preload:
        try:
            __import__(module)
        except ImportError:
            pass  # optional modules (numpy, sympy) need not be installed
    try:
        exec(warmup, {})  # the recipe's own code, trusted: it loads what first use would load
    except ImportError:
        pass


def _confinement(config: dict, libc, protections: dict) -> dict:
    """What each child's confinement needs (confinement.confine), set up once in the zygote; `protections` gets what
    holds here."""
    in_bwrap = config["in_bwrap"]
    generators = random_states()
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # nothing of its uid may trace it or read or write its memory
    protections["capabilities"] = effective_capabilities()  # what every child starts with: none
    uid = None
    if not in_bwrap and os.geteuid() == 0:  # root without namespaces: a throwaway user id per zygote
        uid = 200_000 + int.from_bytes(os.urandom(3), "big") % 100_000
        protections["separate_user"] = True
    base = None
    if not in_bwrap:  # each call gets a new directory in here, removed after it; nothing else may be created here
        base = protections["calls_dir"] = tempfile.mkdtemp(prefix="grpo-sandbox-")
        os.chmod(base, 0o711)
    readable = config["readable"] + ([SANDBOX_DIR] * in_bwrap)
    landlock_error, protections["landlock"] = landlock_abi(config["max_landlock_abi"])
    seccomp, protections["seccomp"] = seccomp_filter(os.getpid() if in_bwrap else None, metadata=not in_bwrap)
    if landlock_error:
        protections["landlock_error"] = landlock_error
    if isinstance(seccomp, str):
        protections["seccomp_error"], seccomp = seccomp, None
    confinement = {"landlock_abi": protections["landlock"], "readable": readable, "seccomp": seccomp, "uid": uid,
                   "namespaces": in_bwrap, "seccomp_per_child": protections["seccomp"] and seccomp is None,
                   "random_states": generators, "calls_dir": base,
                   **{key: config[key] for key in ("tmp_mb", "tmp_files")}}
    if in_bwrap:  # can a call get a tmpfs of its own? (a nested user namespace, which some AppArmor profiles deny)
        probe = _run_in_child({"code": "import os; os.statvfs('.').f_blocks > 0", "timeout": 10, "max_output": 100,
                               "memory_mb": 1024, "file_size_mb": 1}, CALL_DIR, confinement, libc)
        protections["fresh_tmp"] = probe == "True"
        if probe != "True":
            protections["fresh_tmp_error"] = probe
    protections["no_network"] = in_bwrap or protections["seccomp"]  # seccomp forbids every socket
    return confinement


def _serve_requests(confinement: dict, libc) -> None:
    """Each request line: a call, or a session and its messages; each in a directory no other call has seen."""
    in_bwrap, uid = confinement["namespaces"], confinement["uid"]
    for line in sys.stdin:
        request = json.loads(line)
        workdir = CALL_DIR if in_bwrap else tempfile.mkdtemp(dir=confinement["calls_dir"])
        if uid is not None:
            os.chown(workdir, uid, uid)
        if "program" in request:  # a session: the lines that follow are its messages, until it is closed
            _serve_session(request, workdir, confinement, libc, sys.stdin)
            result = None
        else:
            result = _run_in_child(request, workdir, confinement, libc)
        kept = not in_bwrap and not remove_tree(workdir)  # with bubblewrap the call's tmpfs died with it
        print(json.dumps({"result": result, "restart": kept}), flush=True)
        if kept:
            break  # the trainer starts a fresh zygote, in a fresh directory, and removes this one


def _run_in_child(request: dict, workdir: str, confinement: dict, libc) -> str:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: confine, run, report, exit without cleanup handlers
        os.close(read_end)
        try:
            confine(workdir, request, confinement, libc, keep=(write_end,))
            result = _execute(request["code"], request["max_output"])
        except BaseException as err:  # noqa: BLE001 - the confinement itself failed: run nothing
            result = f"Error: sandbox setup failed: {err}"
        try:
            os.write(write_end, result.encode("utf-8", errors="replace"))
        finally:
            os._exit(0)
    os.close(write_end)
    result, timed_out = _read_report(read_end, request["timeout"], 4 * request["max_output"] + 4096)
    os.kill(pid, signal.SIGKILL)  # it cannot have started another process: no orphan can survive the call
    _, status = os.waitpid(pid, 0)
    os.close(read_end)
    if timed_out:
        return f"Error: timed out after {request['timeout']:g} s"
    if result:  # the report is the call's own bytes: cut at the limit here too, whatever wrote them
        room = request["max_output"] + len(REPORT_MARKER.format(10**12))
        return result if len(result) <= room else result[:request["max_output"]] + REPORT_MARKER.format(
            len(result) - request["max_output"])
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) != signal.SIGKILL:
        name = signal.Signals(os.WTERMSIG(status)).name
        return f"Error: the code was killed by {name} (out of memory, CPU time or file size?)"
    return "Error: the code exited without a result"


def _serve_session(request: dict, workdir: str, confinement: dict, libc, lines) -> None:
    """Start a session's child, then relay each message line to it and its answer back, until the caller closes it.
    The child is killed when it times out, exits, or answers more than MESSAGE_BYTES in one line."""
    inbox_read, inbox_write = os.pipe()
    outbox_read, outbox_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: confine, run the caller's program with its channel, exit without cleanup handlers
        os.close(inbox_write)
        os.close(outbox_read)
        try:
            confine(workdir, request, confinement, libc, keep=(inbox_read, outbox_write))
            sys.stdout = sys.stderr = _CappedOutput(request["max_output"])  # prints go nowhere, in bounded memory
            exec(compile(request["program"], "<session>", "exec"),
                 {"__name__": "__main__", "__builtins__": builtins, "channel": _Channel(inbox_read, outbox_write)})
        finally:
            os._exit(0)
    os.close(inbox_read)
    os.close(outbox_write)
    os.set_blocking(inbox_write, False)
    print(json.dumps({"started": True}), flush=True)
    ended, pending = None, b""
    for line in lines:
        message = json.loads(line)
        if "close" in message:
            break
        if ended is None:
            answer, ended, pending = _relay(inbox_write, outbox_read, message, pending)
        if ended is not None:
            os.kill(pid, signal.SIGKILL)  # a child that ran out of time stops computing now
        print(json.dumps({"answer": answer} if ended is None else {"ended": ended}), flush=True)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    os.close(inbox_write)
    os.close(outbox_read)


def _relay(inbox: int, outbox: int, message: dict, pending: bytes) -> tuple[str | None, str | None, bytes]:
    """Write one message to a session's child and read its one-line answer: (answer, None, what followed it) or
    (None, why it ended, b"")."""
    deadline = time.monotonic() + message["timeout"]
    data = message["send"].encode("utf-8", errors="replace") + b"\n"
    while data:
        _, writable, _ = select.select([], [inbox], [], max(deadline - time.monotonic(), 0))
        if not writable:
            return None, f"timed out after {message['timeout']:.3g} s", b""
        try:
            data = data[os.write(inbox, data):]
        except BrokenPipeError:
            return None, "the code exited", b""
    while b"\n" not in pending:
        if len(pending) > MESSAGE_BYTES:
            return None, f"an answer over {MESSAGE_BYTES} bytes", b""
        ready, _, _ = select.select([outbox], [], [], max(deadline - time.monotonic(), 0))
        if not ready:
            return None, f"timed out after {message['timeout']:.3g} s", b""
        chunk = os.read(outbox, 65536)
        if not chunk:
            return None, "the code exited", b""
        pending += chunk
    answer, pending = pending.split(b"\n", 1)
    return answer.decode("utf-8", errors="replace"), None, pending


class _Channel:
    """A session child's side of its messages: one line in, one line out."""

    def __init__(self, inbox: int, outbox: int):
        self.inbox, self.outbox, self.buffer = inbox, outbox, b""

    def receive(self) -> str:
        while b"\n" not in self.buffer:
            chunk = os.read(self.inbox, 65536)
            if not chunk:
                raise EOFError("the session was closed")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode("utf-8", errors="replace")

    def send(self, text: str) -> None:
        data = text.replace("\n", " ").encode("utf-8", errors="replace") + b"\n"
        while data:
            data = data[os.write(self.outbox, data):]


def _read_report(fd: int, timeout: float, max_bytes: int) -> tuple[str, bool]:
    """The child's report, read until it closes the pipe, the deadline passes or max_bytes arrive."""
    deadline, chunks, size = time.monotonic() + timeout, [], 0
    while size < max_bytes:
        ready, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0))
        if not ready:
            return b"".join(chunks).decode("utf-8", errors="replace"), True
        chunk = os.read(fd, min(65536, max_bytes - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace"), False


class _CappedOutput:
    """A text stream that keeps the first `limit` characters and counts the rest."""

    def __init__(self, limit: int):
        self.limit, self.parts, self.kept, self.dropped = limit, [], 0, 0

    def write(self, text) -> int:
        text = str(text)
        room = self.limit - self.kept
        self.parts.append(text[:room])
        self.kept += min(len(text), room)
        self.dropped += max(len(text) - room, 0)
        return len(text)

    def flush(self) -> None:
        pass

    def text(self) -> str:
        marker = REPORT_MARKER.format(self.dropped) if self.dropped else ""
        return "".join(self.parts) + marker


def _execute(code: str, max_output: int) -> str:
    """Run code like a notebook cell: printed output, then the repr of a final expression; or the error's last line."""
    output = _CappedOutput(max_output)
    sys.stdout = sys.stderr = output
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    try:
        tree = ast.parse(code, "<tool>", "exec")
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, "<tool>", "exec"), namespace)
        if last is not None:
            value = eval(compile(ast.Expression(last.value), "<tool>", "eval"), namespace)
            if value is not None:
                output.write(repr(value))
    except SystemExit as err:
        output.write(f"Error: SystemExit({err.code!r})")
    except BaseException as err:  # noqa: BLE001 - the model's bug becomes the tool's answer
        output.write("Error: " + traceback.format_exception_only(type(err), err)[-1].strip())
    text = output.text().strip()
    return text if text else "(no output)"


