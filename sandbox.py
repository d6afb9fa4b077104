"""A sandboxed Python interpreter for tool-calling recipes: untrusted code in, a short model-readable string out.

    from sandbox import Sandbox
    box = Sandbox(timeout=5)
    box.run("x = 6 * 7\\nx")            # -> "42"
    box.run("while True: pass")         # -> "Error: timed out after 5 s" (and the next call works)

TRL runs tools in the training process with no timeout, so a model's code must never run there. A fork server (a
"zygote": a clean Python started once, with no secrets in its environment) forks one child per call; the child is
locked down, runs the code and reports back; then it is killed and its working directory removed. Forking a warm
interpreter costs a few milliseconds, against tens for a fresh `python -c` (benchmarks/bench_sandbox.py measures).

What each call gets, and where it is enforced:

| protection | Linux as root | Linux, other users | macOS |
|---|---|---|---|
| wall-clock timeout, then SIGKILL of the child and its process group | yes | yes | yes |
| CPU-time, address-space (memory) and file-size limits (setrlimit) | yes | yes | no memory limit (no RLIMIT_AS) |
| no new processes or threads (RLIMIT_NPROC = 0: fork bombs fail at once) | yes | yes | yes |
| output capped (`max_output` characters, then a truncation marker) | yes | yes | yes |
| fresh temporary working directory, removed afterwards | yes | yes | yes |
| scrubbed environment (no API keys, HF/WANDB tokens): the zygote starts with a minimal one | yes | yes | yes |
| a throwaway user id: no writing outside its directory and /tmp, no access to the trainer | yes | no | yes |
| no network (a fresh, empty network namespace) | yes | if unprivileged user namespaces are on | no |

`Sandbox.protections()` reports which of the last two are active on this machine (the macOS column says what the
code does there; it has been run on Linux only). It is not a security boundary
against a determined attacker (no seccomp, no filesystem namespace): it keeps a policy model's mistakes and reward
hacks from hurting the training run, the machine, or the next call.
"""

import ast
import builtins
import ctypes
import json
import os
import resource
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import traceback

CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
_SAFE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8",
             "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
             "PYTHONDONTWRITEBYTECODE": "1"}
# Imported once in the zygote, so free in every child. They are also all a child can import where Python lives in a
# directory the throwaway user cannot read (root's home): list what the model's code may need. Heavy modules cost on
# every call (a bigger process to fork): adding numpy and sympy takes a call from about 5 to 10 ms.
PRELOAD = ("math", "cmath", "fractions", "decimal", "statistics", "itertools", "functools", "operator", "collections",
           "heapq", "bisect", "re", "string", "json", "datetime", "calendar", "random", "socket", "encodings.idna")


class Sandbox:
    """Runs code in a forked, locked-down child of a long-lived zygote process. Thread-safe; one call at a time."""

    def __init__(self, timeout: float = 5.0, memory_mb: int = 1024, max_output: int = 2000, file_size_mb: int = 16,
                 preload: tuple[str, ...] = PRELOAD):
        self.limits = {"timeout": timeout, "memory_mb": memory_mb, "max_output": max_output,
                       "file_size_mb": file_size_mb}
        self.preload = preload
        self._lock = threading.Lock()
        self._zygote: subprocess.Popen | None = None
        self._protections: dict | None = None

    def run(self, code: str) -> str:
        """Run `code`; return what it printed plus its last expression's value, or 'Error: …'. Never raises."""
        if not isinstance(code, str):
            return f"Error: code must be a string, not {type(code).__name__}"
        with self._lock:
            try:
                self._ensure_zygote()
                self._zygote.stdin.write(json.dumps({"code": code, **self.limits}) + "\n")
                self._zygote.stdin.flush()
                ready, _, _ = select.select([self._zygote.stdout], [], [], self.limits["timeout"] + 10)
                line = self._zygote.stdout.readline() if ready else ""
                if line:
                    return json.loads(line)["result"]
            except (OSError, ValueError) as err:
                self._stop_zygote()
                return f"Error: the sandbox failed ({err.__class__.__name__}); try again"
            self._stop_zygote()  # unresponsive or dead (the code killed it?): the next call starts a fresh one
            return "Error: the sandbox crashed while running this code"

    def protections(self) -> dict:
        """Which of the machine-dependent protections are active: {'separate_user': bool, 'no_network': bool}."""
        self.run("None")
        return dict(self._protections or {})

    def close(self) -> None:
        with self._lock:
            self._stop_zygote()

    def _ensure_zygote(self) -> None:
        if self._zygote is not None and self._zygote.poll() is None:
            return
        here = os.path.dirname(os.path.abspath(__file__))
        self._zygote = subprocess.Popen(
            [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {here!r}); import sandbox; "
                                         f"sandbox._zygote({list(self.preload)!r})"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=_SAFE_ENV,
            cwd=tempfile.gettempdir(), start_new_session=True)
        ready, _, _ = select.select([self._zygote.stdout], [], [], 60)
        if not ready:
            raise OSError("the sandbox zygote did not start")
        self._protections = json.loads(self._zygote.stdout.readline())

    def _stop_zygote(self) -> None:
        if self._zygote is not None:
            self._zygote.kill()
            self._zygote.wait()
            self._zygote.stdin.close()
            self._zygote.stdout.close()
            self._zygote = None


# ------------------------------------------------------------------------------------------ inside the zygote process


def _zygote(preload: list[str]) -> None:
    """Fork one locked-down child per request line; answer each with one JSON line. Exits when stdin closes."""
    for module in preload:
        try:
            __import__(module)
        except ImportError:
            pass  # optional modules (numpy, sympy) need not be installed
    uid = 200_000 + secrets.randbelow(100_000) if os.geteuid() == 0 else None  # a throwaway user id per zygote
    base = tempfile.mkdtemp(prefix="grpo-sandbox-")
    os.chmod(base, 0o711)  # children may enter their own directory but not create anything beside it
    print(json.dumps({"separate_user": uid is not None, "no_network": _can_unshare_network(uid)}), flush=True)
    try:
        for line in sys.stdin:
            request = json.loads(line)
            print(json.dumps({"result": _run_in_child(request, uid, base)}), flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _can_unshare_network(uid: int | None) -> bool:
    pid = os.fork()
    if pid == 0:
        os._exit(0 if _unshare_network(uid) else 1)
    return os.waitpid(pid, 0)[1] == 0


def _unshare_network(uid: int | None) -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    flags = CLONE_NEWNET if uid is not None else CLONE_NEWUSER | CLONE_NEWNET
    return sys.platform == "linux" and libc.unshare(flags) == 0


def _run_in_child(request: dict, uid: int | None, base: str) -> str:
    workdir = tempfile.mkdtemp(dir=base)
    if uid is not None:
        os.chown(workdir, uid, uid)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: lock down, run, report, exit without cleanup handlers
        os.close(read_end)
        try:
            _lock_down(workdir, uid, request)
            result = _execute(request["code"], request["max_output"])
        except BaseException as err:  # noqa: BLE001 - the lock-down itself failed
            result = f"Error: sandbox setup failed: {err}"
        with os.fdopen(write_end, "w") as report:
            report.write(result)
        os._exit(0)
    os.close(write_end)
    ready, _, _ = select.select([read_end], [], [], request["timeout"])
    result = _read_all(read_end) if ready else None
    for target in (-pid, pid):  # the process group first: anything it started dies with it
        try:
            os.kill(target, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    _, status = os.waitpid(pid, 0)
    os.close(read_end)
    shutil.rmtree(workdir, ignore_errors=True)
    if result:
        return result
    if not ready:
        return f"Error: timed out after {request['timeout']:g} s"
    if os.WIFSIGNALED(status):
        name = signal.Signals(os.WTERMSIG(status)).name
        return f"Error: the code was killed by {name} (out of memory, CPU time or file size?)"
    return "Error: the code exited without a result"


def _read_all(fd: int) -> str:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace")


def _lock_down(workdir: str, uid: int | None, request: dict) -> None:
    os.setsid()  # its own process group, killed as a whole
    _unshare_network(uid)  # best effort; protections() reports whether it holds here
    if uid is not None:
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
