"""Inside the sandbox: the kernel mechanisms that confine one call's process (sandbox.py's docstring says what each
guarantees). The zygote (zygote.py) calls `confine` in each child it forks, before the call's code runs.

This module runs inside the sandbox, where only the standard library, the sandbox's engines (landlockpy, pyseccomp)
and the files sandbox.SANDBOX_FILES name can be imported: it imports nothing else of ours.
"""

import ctypes
import errno
import os
import platform
import resource
import signal
import sys
import tempfile

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWUSER, CLONE_NEWNET = 0x00020000, 0x04000000, 0x10000000, 0x40000000
MS_BIND, MS_NOSUID, MS_NODEV = 4096, 2, 4
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS = 1, 4, 22, 38
SECCOMP_MODE_FILTER = 2
SAFE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8",
            "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
            "PYTHONDONTWRITEBYTECODE": "1"}
SANDBOX_DIR = "/opt/grpo-sandbox"  # where bubblewrap shows the zygote its files (sandbox.SANDBOX_FILES)
CALL_DIR = "/sandbox"  # under bubblewrap: the calls' working directory, HOME and TMPDIR; /tmp links to it
# Syscalls a call never needs and an attacker would: tracing, namespaces, mounts, keyrings, kernel attack surface,
# sockets (no network at all, Unix sockets included), new processes or threads, replacing its program (execve would
# make it dumpable again), System V IPC and POSIX message queues (the host's, where there is no IPC namespace), legacy
# AIO (one call can take the machine's whole quota), inotify and fanotify (watching the host's files change), changes
# to Landlock rulesets, the kernel log (syslog: whatever the host's dmesg_restrict), and whatever reads or steers the
# page cache (mincore, cachestat, preadv2's RWF_NOWAIT read whether a file's pages are cached; fadvise and readahead
# evict or load them): one call would set bits in files every call can read, and a later one read them.
DENIED_SYSCALLS = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_open", "pidfd_getfd", "pidfd_send_signal",
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen", "fsconfig",
    "fsmount", "fspick", "mount_setattr", "name_to_handle_at", "open_by_handle_at", "keyctl", "add_key",
    "request_key", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "socket", "socketpair", "fork", "vfork", "clone", "clone3", "personality", "setpriority", "sched_setaffinity",
    "sched_setscheduler", "sched_setparam", "sched_setattr", "ioprio_set", "process_madvise", "migrate_pages",
    "move_pages", "memfd_secret", "landlock_create_ruleset", "landlock_add_rule", "mq_open", "mq_unlink", "msgget",
    "semget", "shmget", "capset", "memfd_create", "statmount", "listmount", "lsm_set_self_attr", "open_tree_attr",
    "execve", "execveat", "shmctl", "shmat", "shmdt", "semctl", "semop", "semtimedop", "msgctl", "msgsnd", "msgrcv",
    "ipc", "io_setup", "io_destroy", "io_submit", "io_cancel", "io_getevents", "io_pgetevents", "inotify_init",
    "inotify_init1", "inotify_add_watch", "fanotify_init", "fanotify_mark", "syslog", "mincore", "cachestat",
    "fadvise64", "fadvise64_64", "arm_fadvise64_64", "readahead", "preadv2", "pwritev2", "remap_file_pages")
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
    "lsm_set_self_attr": 460, "cachestat": 451, "setxattrat": 463, "removexattrat": 466, "open_tree_attr": 467,
    "file_setattr": 469}
# Arguments that turn an allowed syscall into an attack: making a call dumpable again (a core dump would hand its
# memory to a root helper such as apport or systemd-coredump), naming a process to signal on I/O (fcntl's F_SETOWN,
# F_SETOWN_EX, F_SETSIG; ioctl's FIOSETOWN, SIOCSPGRP), which passes signals around the kill() rules, watching a
# directory of the host's (fcntl's F_NOTIFY, dnotify), and evicting a file's pages from the cache (madvise's MADV_COLD,
# MADV_PAGEOUT).
F_NOTIFY, MADV_COLD, MADV_PAGEOUT = 1026, 20, 21
DENIED_ARGUMENTS = {"prctl": (0, (PR_SET_DUMPABLE,)), "fcntl": (1, (8, 15, 10, F_NOTIFY)),
                    "ioctl": (1, (0x8901, 0x8902)), "madvise": (2, (MADV_COLD, MADV_PAGEOUT))}
HOSTNAME = b"sandbox"  # what a call reads as the machine's name, in place of the host's


def random_states() -> list:
    """The random generators the preloaded modules made (random's, numpy's global one, sympy's, ...): a child reseeds
    them all, or every call would draw the zygote's numbers, and one call could predict the next one's."""
    import gc
    import random

    kinds = (random.Random,)
    if "numpy.random" in sys.modules:
        kinds += (sys.modules["numpy.random"].RandomState, sys.modules["numpy.random"].Generator)
    return [state for state in gc.get_objects() if isinstance(state, kinds)] + (
        [sys.modules["numpy.random"].mtrand._rand] if "numpy.random" in sys.modules else [])


def reseed(random_states: list) -> None:
    for state in random_states:
        seed = int.from_bytes(os.urandom(16), "big")
        if hasattr(state, "bit_generator"):  # numpy's Generator: a fresh bit generator of the same kind
            state.bit_generator.state = type(state.bit_generator)(seed % 2**128).state
        else:  # random.Random, numpy's RandomState
            state.seed(seed % 2**32)


def fresh_tmp(libc, size_mb: int, files: int) -> None:
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
    drop_capabilities(libc)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # and for good: seccomp denies setting it back


class _CapabilityHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapabilitySets(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_capabilities(libc) -> None:
    """Give up the capabilities that creating a user namespace granted, so that the call's code has none."""
    PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, LINUX_CAPABILITY_VERSION_3 = 47, 4, 0x20080522
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    if libc.capset(ctypes.byref(_CapabilityHeader(LINUX_CAPABILITY_VERSION_3, 0)), (_CapabilitySets * 2)()) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def effective_capabilities() -> str:
    """This process's effective capability set as /proc shows it ('0000000000000000': none)."""
    try:
        with open("/proc/self/status") as status:
            return status.read().split("CapEff:")[1].split()[0]
    except OSError:
        return ""


def remove_tree(path: str) -> bool:
    """Remove `path` and everything below it whatever a call left there: any depth, names past PATH_MAX, locked modes,
    attributes. Iterative and relative to directory descriptors, never following a link, each directory read once
    (a directory bomb costs about what making it cost); True when it is gone.

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
    entered = []  # the directories entered below `path`, by name: descriptors are held for one level only
    left = [None]  # per level: the subdirectories still to remove (None: not read yet)
    try:
        while True:
            if left[-1] is None:  # first time here
                left[-1] = _remove_files_and_empty_directories(current)
            if left[-1]:  # go down: unlock it first (mode 0, or no search permission)
                name = left[-1].pop()
                os.chmod(name, 0o700, dir_fd=current)
                below = os.open(name, flags, dir_fd=current)
                os.close(current)
                current = below
                entered.append(name)
                left.append(None)
            elif entered:  # empty: go up and remove it
                above = os.open("..", flags, dir_fd=current)
                os.close(current)
                current = above
                os.rmdir(entered.pop(), dir_fd=current)
                left.pop()
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


def _remove_files_and_empty_directories(directory: int) -> list[str]:
    """Remove what the directory (a descriptor) holds but non-empty subdirectories; their names."""
    left = []
    with os.scandir(directory) as entries:
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False):
                os.unlink(entry.name, dir_fd=directory)
                continue
            try:
                os.rmdir(entry.name, dir_fd=directory)  # an empty one goes in one call
            except OSError:
                left.append(entry.name)
    return left


def landlock_abi(cap: int | None) -> tuple[str | None, int]:
    """(why Landlock cannot be used, or None; the ABI a call's ruleset uses, at most `cap`; 0 = none)."""
    try:
        import landlockpy as landlock

        if not landlock.supported():
            return "this kernel has no Landlock", 0
        abi = landlock.abi_version() if cap is None else min(landlock.abi_version(), cap)
        return (None if abi else f"Landlock capped at ABI {cap}"), abi
    except Exception as err:  # noqa: BLE001 - not installed, not Linux
        return f"{type(err).__name__}: {err}", 0


class LandlockRules:
    """What every call's Landlock ruleset holds but its own directory, worked out once (in the zygote, so that a
    call only adds the rules): read only the system and Python trees, write only the call's directory, no TCP
    (ABI 4+), no signals or abstract Unix sockets outside the call (ABI 6+); outside processes cannot be traced at
    any ABI."""

    def __init__(self, readable: list[str], abi: int):
        import landlockpy as landlock

        self.every = landlock.fs_for_abi(abi)
        self.net, self.scoped = landlock.net_for_abi(abi), landlock.scope_for_abi(abi)
        read_dir = (landlock.AccessFS.READ_FILE | landlock.AccessFS.READ_DIR | landlock.AccessFS.EXECUTE) & self.every
        read_file = (landlock.AccessFS.READ_FILE | landlock.AccessFS.EXECUTE) & self.every
        self.paths = [(path, read_dir if os.path.isdir(path) else read_file)
                      for path in readable + ["/dev/urandom", "/dev/random", "/dev/zero"] if os.path.exists(path)]
        self.paths.append(("/dev/null", (landlock.AccessFS.READ_FILE | landlock.AccessFS.WRITE_FILE) & self.every))

    def ruleset(self, workdir: str):
        """A call's ruleset, built in the call's process after its directory exists (a rule holds an inode, not a
        path)."""
        import landlockpy as landlock

        ruleset = landlock.Ruleset(handled_fs=self.every, handled_net=self.net, scoped=self.scoped)
        for path, access in self.paths:
            try:
                ruleset.allow_path(path, access)
            except OSError:  # out of this call's reach (a throwaway user id cannot enter /root): nothing to allow
                pass
        ruleset.allow_path(workdir, self.every)
        return ruleset


def seccomp_filter(zygote_pid: int | None, metadata: bool):
    """(a seccomp filter children load, or None to build one per child; True), or (why not, False).

    Denies DENIED_SYSCALLS, DENIED_ARGUMENTS, METADATA_SYSCALLS when `metadata` (no read-only mount tree), and any
    signal or limit change aimed at another process: in bubblewrap's PID namespace the only others are its init (1)
    and the zygote, so one filter serves every child; elsewhere each child builds its own, allowing only its own pid."""
    try:
        import pyseccomp  # noqa: F401 - loads libseccomp

        if sys.platform != "linux":
            return "not Linux", False
        return (CompiledFilter(build_seccomp([1, zygote_pid], metadata)) if zygote_pid else None), True
    except Exception as err:  # noqa: BLE001 - not installed, no libseccomp
        return f"{type(err).__name__}: {err}", False


class CompiledFilter:
    """A seccomp filter compiled once, in the zygote, to the BPF program libseccomp itself would load (its export);
    each child loads it with one prctl instead of compiling it again (half a millisecond a call)."""

    def __init__(self, rules):
        with os.fdopen(os.memfd_create("seccomp"), "w+b") as exported:
            rules.export_bpf(exported)
            exported.seek(0)
            program = exported.read()
        self._code = ctypes.create_string_buffer(program, len(program))  # lives in the zygote, so in each child
        self._program = _SockFprog(len(program) // 8, ctypes.cast(self._code, ctypes.c_void_p))

    def load(self, libc) -> None:
        """Load it into this process, after no_new_privs (libseccomp's default): it holds for this process and
        anything it could start."""
        for option, arguments in ((PR_SET_NO_NEW_PRIVS, (1, 0, 0, 0)),
                                  (PR_SET_SECCOMP, (SECCOMP_MODE_FILTER, ctypes.byref(self._program), 0, 0))):
            if libc.prctl(option, *arguments) != 0:
                raise OSError(ctypes.get_errno(), "loading the seccomp filter failed")


class _SockFprog(ctypes.Structure):  # the kernel's struct sock_fprog: instruction count, then their address
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def build_seccomp(others: list[int] | None = None, metadata: bool = True):
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
    deny_other_processes(rules, denied, others)
    return rules


def deny_other_processes(rules, denied, others: list[int] | None) -> None:
    """Signals and limit changes only for the caller itself: denied for `others` by pid and every process group, or
    (others None) for every pid but the caller's."""
    import pyseccomp as seccomp

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


def own_network_and_name(libc, uid: int | None) -> None:
    """Where bubblewrap gave no namespaces, best effort: no network (seccomp forbids every socket anyway) and a fixed
    host name (without a UTS namespace, the host's shows). `uid` None: an ordinary user, through a user namespace,
    whose capabilities the code does not get."""
    if libc.unshare(CLONE_NEWNET | CLONE_NEWUTS | (CLONE_NEWUSER if uid is None else 0)) == 0:
        libc.sethostname(HOSTNAME, len(HOSTNAME))
    if uid is None:
        drop_capabilities(libc)


def set_limits(request: dict) -> None:
    """The call's resource limits: CPU time, memory, file size, no processes, no core files, 128 descriptors."""
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


def confine(workdir: str, request: dict, confinement: dict, libc, keep: tuple[int, ...]) -> None:
    """Confine this forked child for one call, in this order (each step needs the ones before it): its own session,
    fresh random seeds, its namespaces or user, death with the zygote, its limits, its directory and environment, no
    inherited streams, then Landlock, then every descriptor but `keep` closed, then seccomp last."""
    os.setsid()  # its own session and process group
    reseed(confinement["random_states"])
    uid = confinement["uid"]
    if confinement["namespaces"]:
        fresh_tmp(libc, confinement["tmp_mb"], confinement["tmp_files"])
    else:
        own_network_and_name(libc, uid)
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    zygote = os.getppid()
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # after the uid changes, which clear it
    if os.getppid() != zygote:  # the zygote died before that: no call outlives it
        os._exit(1)
    set_limits(request)
    os.chdir(workdir)
    os.environ.clear()
    os.environ.update(SAFE_ENV, HOME=workdir, TMPDIR=workdir)
    tempfile.tempdir = None  # the zygote's own mkdtemp cached /tmp: a call's temporary files go in its directory
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # output written straight to the file descriptors goes nowhere; print() is captured
        os.dup2(devnull, fd)
    if confinement["landlock_rules"] is not None:
        confinement["landlock_rules"].ruleset(workdir).restrict()
    low = 3  # nothing the zygote holds (its pipes) stays within reach; the call's own pipes are the one way out
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 65536)
    if confinement["seccomp"] is not None:
        confinement["seccomp"].load(libc)
    elif confinement["seccomp_per_child"]:
        build_seccomp().load()


