"""What an MCP tool call costs in mcp_grpo.py, per call and per step, against the same function as a plain TRL tool.

    python benchmarks/bench_mcp.py [--rollouts 8] [--calls 2] [--steps 4] [--generation_seconds 5]
                                   [--startup_seconds 0]

The tool is the example server's `calculate` (grpo_recipes/mcp_example_server.py), called as TRL's multi-turn loop
calls a tool (one rollout after another, one call at a time), four ways:
- plain TRL tool: the function itself, in this process (`GRPOTrainer(tools=[calculate])`);
- shared session: one stdio server for every rollout (`--mcp_session shared`, the default for read-only tools);
- rollout sessions, cold: each rollout's reset starts its own server (`--mcp_session rollout --mcp_warm_pool false`);
- rollout sessions, warm pool: each rollout takes a spare started ahead of it (the default for a server with state).
Beside them, the floor: one JSON-RPC request and its answer over a pipe, to a child process that does nothing else.
A step: every rollout is reset (TRL does so before generating), `--generation_seconds` pass (the generation), then
each rollout makes `--calls` calls. `--startup_seconds` delays each server's start (a server that starts slowly: npx,
a browser). Prints per-call p50 and p95, a rollout's first call apart, the seconds of the first step (no spare yet)
and the mean of the later ones. The example server costs about 0.9 s of CPU to start: on a 2-core machine more than
2 rollouts a second of generation leave the spares no CPU to start on.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grpo_recipes.contract import environment_tools  # noqa: E402
from grpo_recipes.mcp_example_server import calculate  # noqa: E402
from grpo_recipes.mcp_tools import McpServer, McpTools  # noqa: E402

SERVER = f"{sys.executable} -m grpo_recipes.mcp_example_server"
ECHO = ("import json, sys\n"
        "for line in sys.stdin:\n"
        "    request = json.loads(line)\n"
        "    answer = {'jsonrpc': '2.0', 'id': request['id'], 'result': {'content': [{'type': 'text', 'text': '4'}]}}\n"
        "    sys.stdout.write(json.dumps(answer) + '\\n')\n"
        "    sys.stdout.flush()\n")


def expression(i: int) -> str:
    return f"{i} * {i + 7} + {i % 13}"


def milliseconds(latencies: list[float]) -> str:
    if not latencies:
        return "-"
    p95 = statistics.quantiles(latencies, n=20)[18] if len(latencies) > 1 else latencies[0]
    return f"p50 {1000 * statistics.median(latencies):7.2f} ms  p95 {1000 * p95:7.2f} ms"


def pipe_floor(n: int) -> list[float]:
    """One JSON-RPC round trip over a pipe: what no stdio server can beat."""
    child = subprocess.Popen([sys.executable, "-c", ECHO], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    latencies = []
    for i in range(n):
        request = {"jsonrpc": "2.0", "id": i, "method": "tools/call",
                   "params": {"name": "calculate", "arguments": {"expression": expression(i)}}}
        started = time.perf_counter()
        child.stdin.write(json.dumps(request) + "\n")
        child.stdin.flush()
        json.loads(child.stdout.readline())
        latencies.append(time.perf_counter() - started)
    child.stdin.close()
    child.wait()
    return latencies


def run_steps(args, reset, call) -> tuple[list[float], list[float], list[float], list[float]]:
    """Steps as TRL makes them: reset every rollout, generate, then each rollout's calls in turn. Returns the latencies
    of the first step's first calls, the later steps' first calls, the later calls, and each step's seconds."""
    first_step, first, later, steps = [], [], [], []
    for step in range(args.steps):
        started = time.perf_counter()
        for rollout in range(args.rollouts):
            reset(rollout)
        time.sleep(args.generation_seconds)
        for rollout in range(args.rollouts):
            for k in range(args.calls):
                at = time.perf_counter()
                answer = call(rollout, expression(step * 1000 + rollout * 10 + k))
                (later if k else first if step else first_step).append(time.perf_counter() - at)
                assert answer == calculate(expression(step * 1000 + rollout * 10 + k)), answer
        steps.append(time.perf_counter() - started)
    return first_step, first, later, steps


def through_mcp(args, session: str, warm_pool: bool = True):
    command = f"sh -c 'sleep {args.startup_seconds:g}; exec {SERVER}'" if args.startup_seconds else SERVER
    factory = McpTools(McpServer(command=command, session=session, warm_pool=warm_pool))
    factory.start()
    boxes = [factory() for _ in range(args.rollouts)]
    tools = [{tool.__name__: tool for tool in environment_tools(box)} for box in boxes]
    measured = run_steps(args, lambda rollout: boxes[rollout].reset(),
                         lambda rollout, text: tools[rollout]["calculate"](expression=text))
    spares = factory.spares()
    for box in boxes:
        for connection in box._opened:
            connection.close()
    factory.close()
    return *measured, factory.stats["start_waits"], spares


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=8, help="rollouts per step (TRL's generation batch)")
    parser.add_argument("--calls", type=int, default=2, help="calls per rollout")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--generation_seconds", type=float, default=5.0)
    parser.add_argument("--startup_seconds", type=float, default=0.0)
    args = parser.parse_args()
    print(f"{args.rollouts} rollouts a step, {args.calls} calls each, {args.steps} steps, "
          f"{args.generation_seconds:g} s of generation between the resets and the calls, servers that start "
          f"{args.startup_seconds:g} s late")
    floor = pipe_floor(2000)
    print(f"{'floor: JSON-RPC over a pipe':>36}: {milliseconds(floor)}")
    rows = [("plain TRL tool (in process)", (*run_steps(args, lambda rollout: None, lambda rollout, text:
                                                          calculate(text)), 0, 0)),
            ("shared session", through_mcp(args, "shared")),
            ("rollout sessions, cold", through_mcp(args, "rollout", warm_pool=False)),
            ("rollout sessions, warm pool", through_mcp(args, "rollout"))]
    for name, (first_step, first, later, steps, start_waits, spares) in rows:
        print(f"{name:>36}: step 1 {steps[0]:5.2f} s, its first calls {milliseconds(first_step)}")
        print(f"{'':>36}  later steps {statistics.mean(steps[1:]):5.2f} s, their first calls {milliseconds(first)}, "
              f"other calls {milliseconds(later)}")
        if name.startswith(("shared", "rollout")):
            print(f"{'':>36}  {start_waits} calls waited for their server to start; {spares} spares at the end")


if __name__ == "__main__":
    main()
