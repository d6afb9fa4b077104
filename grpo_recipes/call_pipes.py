"""The trainer's ends of a sandboxed child's pipes (sandbox.py): its code or program written in, its report read out,
a session's message and one-line answer; each bounded by a deadline, a size, or the child's end.
"""

import os
import select
import time

from grpo_recipes.zygote import MESSAGE_BYTES


def write_all(fd: int, data: bytes, deadline: float) -> None:
    """Write a child's code or program to its request pipe, then close it; stop at the deadline or when the child
    has gone (its report says what happened)."""
    os.set_blocking(fd, False)
    view = memoryview(data)
    try:
        while view:
            _, writable, _ = select.select([], [fd], [], max(deadline - time.monotonic(), 0))
            if not writable:
                break
            view = view[os.write(fd, view):]
    except OSError:  # BrokenPipeError: the child has gone
        pass
    finally:
        os.close(fd)


def read_report(fd: int, deadline: float, max_bytes: int) -> tuple[str, bool]:
    """A call's report, read until its child closes the pipe, the deadline passes or max_bytes arrive; (text,
    timed out). Closes the pipe."""
    chunks, size, timed_out = [], 0, False
    try:
        while size < max_bytes:
            ready, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0))
            if not ready:
                timed_out = True
                break
            chunk = os.read(fd, min(65536, max_bytes - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", errors="replace"), timed_out


def relay(inbox: int, outbox: int, message: str, timeout: float, pending: bytes) -> tuple[str | None, str | None,
                                                                                             bytes]:
    """Write one message to a session's child and read its one-line answer: (answer, None, what followed it) or
    (None, why it ended, b"")."""
    deadline = time.monotonic() + timeout
    data = message.encode("utf-8", errors="replace") + b"\n"
    try:
        while data:
            _, writable, _ = select.select([], [inbox], [], max(deadline - time.monotonic(), 0))
            if not writable:
                return None, f"timed out after {timeout:.3g} s", b""
            data = data[os.write(inbox, data):]
        while b"\n" not in pending:
            if len(pending) > MESSAGE_BYTES:
                return None, f"an answer over {MESSAGE_BYTES} bytes", b""
            ready, _, _ = select.select([outbox], [], [], max(deadline - time.monotonic(), 0))
            if not ready:
                return None, f"timed out after {timeout:.3g} s", b""
            chunk = os.read(outbox, 65536)
            if not chunk:
                return None, "the code exited", b""
            pending += chunk
    except BrokenPipeError:
        return None, "the code exited", b""
    answer, pending = pending.split(b"\n", 1)
    return answer.decode("utf-8", errors="replace"), None, pending
