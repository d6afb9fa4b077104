"""A trainer's side of the sandbox, run as a separate process: tests/test_sandbox.py starts it as an ordinary user.

    python sandbox_trainer.py     # JSON requests on stdin, one JSON answer per line on stdout

Requests: {"op": "run", "code": ...}, {"op": "protections"}, {"op": "state"} (this process's pid, limits and
OOM score, the pids below the sandbox's engine process, and what is left in the calls' directory on this disk). It ends
when its stdin closes.
"""

import json
import os
import resource
import sys

from grpo_recipes.sandbox import Sandbox


def descendants(root: int) -> list[int]:
    """Every process below `root` that still runs, from /proc (an exited child its parent has yet to reap holds
    nothing: the zygote reaps its background removals at its next call)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    state, parent = stat.read().rsplit(")", 1)[1].split()[:2]
                if state != "Z":
                    parents[int(entry)] = int(parent)
            except OSError:
                pass
    found, frontier = [], [root]
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return sorted(found)


def state(box: Sandbox) -> dict:
    with open(f"/proc/{os.getpid()}/oom_score_adj") as oom:
        oom_score_adj = int(oom.read())
    calls_dir = (box._protections or {}).get("calls_dir")  # without bubblewrap: each call's directory is made here
    return {"pid": os.getpid(), "nofile": resource.getrlimit(resource.RLIMIT_NOFILE), "oom_score_adj": oom_score_adj,
            "sandbox_processes": descendants(box._zygote.pid) if box._zygote else [],
            "calls_dir_entries": sorted(os.listdir(calls_dir)) if calls_dir and os.path.isdir(calls_dir) else []}


def main() -> None:
    box = Sandbox(**json.loads(sys.argv[1]) if len(sys.argv) > 1 else {})
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "run":
            answer = box.run(request["code"])
        elif request["op"] == "protections":
            answer = box.protections()
        else:
            answer = state(box)
        print(json.dumps(answer), flush=True)
    box.close()


if __name__ == "__main__":
    main()
