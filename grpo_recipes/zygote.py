"""Inside the sandbox: the fork server ("zygote") that sandbox.py starts once, and the calls it forks.

The zygote reads one control message at a time from its Unix socket (a SOCK_SEQPACKET on its stdin): a call or a
session, each with the pipes the trainer made for it attached (SCM_RIGHTS). It forks a confined child, hands it those
pipes, and waits for the trainer's "end" (or its own deadline); then it kills the child, removes its directory and
answers with how the child ended. The call's bytes never pass through the zygote: the child reads its code or program
from its own request pipe, and writes its report, or a session's answers, to pipes only the trainer reads. So nothing
of a call sits in the zygote's memory, where the next child, forked from it, would find it.

This module runs inside the sandbox: it imports nothing of ours but confinement.py (sandbox.SANDBOX_FILES).
"""

import ast
import builtins
import ctypes
import json
import os
import select
import signal
import socket
import sys
import tempfile
import time
import traceback

from grpo_recipes.confinement import CALL_DIR, PR_SET_DUMPABLE, SANDBOX_DIR, confine, effective_capabilities, \
    LandlockRules, landlock_abi, random_states, remove_tree, seccomp_filter

REPORT_MARKER = "\n[... {} more characters truncated]"
MESSAGE_BYTES = 1_000_000  # the longest answer a session's child may give to one message
CONTROL_BYTES = 1 << 20  # the longest control message (the config, with its readable paths and warm-up code)
REQUEST_BYTES = 64 << 20  # the longest code or program a child reads from its request pipe
CLEANUP_SECONDS = 10.0  # removing a call's directory (Landlock-only mode) past this: a fresh zygote instead
IN_CALL_CLEANUP_SECONDS = 0.25  # past this, a call's directory is removed in the background, while the next calls run
BACKGROUND_REMOVALS = 2  # at most this many at once: a further call whose directory needs one waits for the oldest


def serve() -> None:
    """Serve the control socket on stdin: the config first, then one call or session at a time. Exits when the
    trainer closes its end."""
    control = socket.socket(fileno=0)
    config = json.loads(control.recv(CONTROL_BYTES))
    libc = ctypes.CDLL(None, use_errno=True)
    _warm_up(config["preload"], config["warmup"])  # before the random generators are found: they may make some
    protections = {"engine": None if config["in_bwrap"] else "landlock", "namespaces": config["in_bwrap"],
                   "fresh_tmp": False, "separate_user": False}
    confinement = _confinement(config, libc, protections)
    control.send(json.dumps(protections).encode())
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):  # the trainer reads neither once the zygote is up
        os.dup2(devnull, fd)
    try:
        _serve_requests(control, confinement, libc)
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
    rules = LandlockRules(readable, protections["landlock"]) if protections["landlock"] else None
    confinement = {"landlock_abi": protections["landlock"], "landlock_rules": rules, "seccomp": seccomp, "uid": uid,
                   "namespaces": in_bwrap, "seccomp_per_child": protections["seccomp"] and seccomp is None,
                   "random_states": generators, "calls_dir": base,
                   **{key: config[key] for key in ("tmp_mb", "tmp_files")}}
    if in_bwrap:  # can a call get a tmpfs of its own? (a nested user namespace, which some AppArmor profiles deny)
        probe = _probe(confinement, libc, "import os; os.statvfs('.').f_blocks > 0")
        protections["fresh_tmp"] = probe == "True"
        if probe != "True":
            protections["fresh_tmp_error"] = probe
    protections["no_network"] = in_bwrap or protections["seccomp"]  # seccomp forbids every socket
    return confinement


def _probe(confinement: dict, libc, code: str) -> str:
    """Run `code` as a call of the zygote's own, before it serves any: its report, or the error it ended with."""
    request_read, request_write = os.pipe()
    report_read, report_write = os.pipe()
    os.write(request_write, code.encode())
    os.close(request_write)
    limits = {"timeout": 10, "max_output": 100, "memory_mb": 1024, "file_size_mb": 1}
    pid = _fork_call(limits, CALL_DIR, confinement, libc, (request_read, report_write))
    os.close(request_read)
    os.close(report_write)
    chunks = []
    while select.select([report_read], [], [], 10)[0] and (chunk := os.read(report_read, 4096)):
        chunks.append(chunk)
    os.close(report_read)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return b"".join(chunks).decode("utf-8", errors="replace") or "the probe ended without a result"


def _serve_requests(control: socket.socket, confinement: dict, libc) -> None:
    """Each control message: a call or a session, with its pipes; each in a directory no other call has seen."""
    in_bwrap, uid = confinement["namespaces"], confinement["uid"]
    removals = {}  # pid -> deadline of a child removing an earlier call's directory
    while True:
        message, fds, _, _ = socket.recv_fds(control, CONTROL_BYTES, 4)
        if not message:
            return  # the trainer has gone
        request = json.loads(message)
        workdir = CALL_DIR if in_bwrap else tempfile.mkdtemp(dir=confinement["calls_dir"])
        if uid is not None:
            os.chown(workdir, uid, uid)
        fork = _fork_call if "call" in request else _fork_session
        pid = fork(request["limits"], workdir, confinement, libc, tuple(fds))
        for fd in fds:  # the child's now: the zygote keeps none of a call's pipes
            os.close(fd)
        status = _wait_for_end(control, pid, request.get("deadline"))
        if status is None:
            return  # the trainer has gone
        kept = not in_bwrap and not _remove_in_child(workdir, removals)  # bubblewrap's tmpfs died with the call
        control.send(json.dumps({"status": status, "restart": kept}).encode())
        if kept:
            return  # the trainer starts a fresh zygote, in a fresh directory, and removes this one


def _wait_for_end(control: socket.socket, pid: int, deadline: float | None) -> int | None:
    """Wait for the trainer's "end" (its deadline or the child's end, which it sees on the child's pipes), or this
    call's own deadline; then kill the child (it cannot have started another process) and return its wait status
    (None: the trainer has gone)."""
    ready, _, _ = select.select([control], [], [], deadline)
    if not ready:  # the trainer has not ended it in time: stop the child now, then wait for the trainer
        os.kill(pid, signal.SIGKILL)
        select.select([control], [], [])
    message = control.recv(CONTROL_BYTES)
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    return status if message else None


def _remove_in_child(workdir: str, removals: dict) -> bool:
    """Remove a call's directory in a child process (the names it holds never enter the zygote's memory): within
    IN_CALL_CLEANUP_SECONDS, else in the background (no later call can reach it: each has a directory of its own), so
    that a directory bomb costs its call no more than its deadline. At most BACKGROUND_REMOVALS at once (a further one
    waits for the oldest), each within CLEANUP_SECONDS. False where one failed: a fresh zygote, which removes them
    all, is needed."""
    try:
        os.rmdir(workdir)  # empty, as most calls leave it: no names to read, no child needed
        return _reaped(removals, wait=False)
    except OSError:
        pass
    pid = os.fork()
    if pid == 0:
        os._exit(0 if remove_tree(workdir) else 1)
    removals[pid] = time.monotonic() + CLEANUP_SECONDS
    ok = _waited(pid, time.monotonic() + IN_CALL_CLEANUP_SECONDS, removals)
    return ok and _reaped(removals, wait=len(removals) > BACKGROUND_REMOVALS)


def _reaped(removals: dict, wait: bool) -> bool:
    """Reap the background removals that ended (the oldest too, waiting for it, when `wait`); False if one failed or
    ran out of time."""
    ok = True
    for pid, deadline in sorted(removals.items(), key=lambda item: item[1]):
        ok &= _waited(pid, deadline if wait else 0.0, removals)
        wait = False
    return ok


def _waited(pid: int, until: float, removals: dict) -> bool:
    """Wait for the removal `pid` until `until` (killed at its own deadline): False if it failed or was killed."""
    pause = 0.0002
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            del removals[pid]
            return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        if time.monotonic() > removals[pid]:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            del removals[pid]
            return False
        if time.monotonic() > until:
            return True  # still going, in the background
        time.sleep(pause)
        pause = min(2 * pause, 0.01)


def _fork_call(limits: dict, workdir: str, confinement: dict, libc, fds: tuple[int, ...]) -> int:
    """A child that reads its code from fds[0], runs it confined, writes its report to fds[1] and exits."""
    pid = os.fork()
    if pid == 0:  # the child: read, confine, run, report, exit without cleanup handlers
        request, report = fds
        try:
            code = _read_request(request)
            confine(workdir, limits, confinement, libc, keep=(report,))
            result = _execute(code, limits["max_output"])
        except BaseException as err:  # noqa: BLE001 - the confinement itself failed: run nothing
            result = f"Error: sandbox setup failed: {err}"
        try:
            os.write(report, result.encode("utf-8", errors="replace"))
        finally:
            os._exit(0)
    return pid


def _fork_session(limits: dict, workdir: str, confinement: dict, libc, fds: tuple[int, ...]) -> int:
    """A child that reads a program from fds[0] and runs it confined, with `channel` reading messages from fds[1]
    and writing answers to fds[2]."""
    pid = os.fork()
    if pid == 0:  # the child: read, confine, run the caller's program with its channel, exit without cleanup handlers
        request, inbox, outbox = fds
        try:
            program = _read_request(request)
            confine(workdir, limits, confinement, libc, keep=(inbox, outbox))
            sys.stdout = sys.stderr = _CappedOutput(limits["max_output"])  # prints go nowhere, in bounded memory
            exec(compile(program, "<session>", "exec"),
                 {"__name__": "__main__", "__builtins__": builtins, "channel": _Channel(inbox, outbox)})
        finally:
            os._exit(0)
    return pid


def _read_request(fd: int) -> str:
    """A child's code or program: everything the trainer wrote to its request pipe, then closed."""
    chunks, size = [], 0
    while size < REQUEST_BYTES and (chunk := os.read(fd, 1 << 16)):
        chunks.append(chunk)
        size += len(chunk)
    os.close(fd)
    return b"".join(chunks).decode("utf-8", errors="replace")


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


