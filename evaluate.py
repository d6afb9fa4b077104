"""Check a recipe's environment and rubric against any OpenAI-compatible model before paying for training.

    python evaluate.py gsm8k_grpo --base_url http://localhost:8000/v1 --model Qwen/Qwen2.5-1.5B-Instruct -n 100 -r 4
    python evaluate.py tool_use_grpo --base_url https://api.example.com/v1 --model some-model --out rollouts.jsonl

The server can be a hosted API, `vllm serve <model>`, or `transformers serve <model>`, including a checkpoint you just
trained (the before/after loop). The recipe module (`gsm8k_grpo`, `tool_use_grpo`, `search_agent_grpo`, `code_grpo`
or your fork) supplies everything through the contract in grpo_recipes/contract.py: `build_dataset`, `SYSTEM_PROMPT`
(inside its prompts), and `setup(script_args)`: the rubric, and a tool recipe's environment. The recipe's own flags
(its ScriptArguments: `--dataset_path`, `--corpus_path`, `--tool_timeout`, ...) are accepted here too. Tool calls go
through the OpenAI tools API with the schemas TRL builds from the same methods, and run locally in one environment per
rollout, as in training (the sandbox, the search index), up to the recipe's `max_tool_calling_iterations`.

Prints each reward's mean/std and the weighted total, strict accuracy (the recipe's first reward at full marks: right
AND in the recipe's format) beside lenient accuracy (the gold answer anywhere in the final message) so format
problems are told apart from skill problems, pass@1 and pass@r, turns, tool calls and tokens, and a few rollouts;
writes every conversation with its scores to --out (the input of `sft_warmstart.py --source rollouts`).
"""

import argparse
import dataclasses
import json
import math
import os
import re
import statistics
import sys
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from openai import APIConnectionError, APIResponseValidationError, APIStatusError, OpenAI
from tqdm import tqdm

import rewards
from grpo_recipes import contract, data, difficulty, row_checks
from grpo_recipes.console import quiet_bars_when_redirected, quiet_noise
from grpo_recipes.refusal import Refusal, run_script


def parse_args(argv=None) -> tuple[argparse.Namespace, list[str]]:
    """evaluate.py's own options, and the rest of the command line: the recipe's own flags."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     epilog="Any flag of the recipe's ScriptArguments (--dataset_path, --corpus_path, "
                                            "--index_dir, --tool_timeout, ...) is passed to the recipe.")
    parser.add_argument("recipe", help="recipe module: gsm8k_grpo, tool_use_grpo, search_agent_grpo, code_grpo, or a "
                                       "fork's path")
    parser.add_argument("--base_url", required=True, help="OpenAI-compatible endpoint, e.g. http://localhost:8000/v1")
    parser.add_argument("--model", required=True, help="model name the server knows")
    parser.add_argument("--api_key", default=None, help="default: OPENAI_API_KEY, or 'none' for local servers")
    parser.add_argument("-n", "--num_examples", type=int, default=50, help="examples from the split")
    parser.add_argument("-r", "--rollouts", type=int, default=1, help="rollouts per example (for pass@r)")
    parser.add_argument("--split", default="test")
    parser.add_argument("--concurrency", type=int, default=32, help="requests in flight")
    parser.add_argument("--max_tokens", type=int, default=1024, help="tokens per model turn")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max_turns", type=int, default=None, help="default: the recipe's max_tool_calling_iterations")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    parser.add_argument("--out", default="results.jsonl", help="JSONL of every rollout (an existing one is kept)")
    parser.add_argument("--overwrite_out", action="store_true", help="replace an existing --out (and --pass_rates)")
    parser.add_argument("--pass_rates", default=None, help="also write each prompt's pass rate over its --rollouts "
                        "(the recipe's first reward at full marks), the input of a recipe's --pass_rates")
    parser.add_argument("--show", type=int, default=2, help="rollouts to print")
    return parser.parse_known_args(argv)


AT_LEAST = {"num_examples": 1, "rollouts": 1, "concurrency": 1, "max_tokens": 1, "max_turns": 0, "show": 0,
            "temperature": 0}  # temperature 0: greedy


def check_options(args: argparse.Namespace) -> None:
    """An option out of range or a base URL without its scheme is one line, before any request is made."""
    for name, least in AT_LEAST.items():
        value = getattr(args, name)
        if value is not None and not value >= least:  # NaN fails too
            raise Refusal(f"--{name} {value:g}: must be at least {least}")
    if not args.timeout > 0:
        raise Refusal(f"--timeout {args.timeout:g}: must be a positive number of seconds per request")
    if not re.match(r"https?://", args.base_url):
        example = "http://" + args.base_url.rstrip("/") + ("" if args.base_url.rstrip("/").endswith("/v1") else "/v1")
        raise Refusal(f"--base_url {args.base_url}: needs its scheme, http:// or https:// (e.g. {example})")


def recipe_arguments(recipe, argv: list[str]):
    """The recipe's ScriptArguments from the flags evaluate.py does not know; a flag neither knows is one line."""
    from transformers import HfArgumentParser  # here, not at the top: --help waits on nothing it does not use

    parser = HfArgumentParser(recipe.ScriptArguments, allow_abbrev=False)
    script_args, unknown = parser.parse_args_into_dataclasses(argv, return_remaining_strings=True)
    if unknown:
        known = ", ".join(f"--{f.name}" for f in dataclasses.fields(recipe.ScriptArguments))
        raise Refusal(f"unknown option(s) {' '.join(unknown)}: not evaluate.py's (--help) nor {recipe.__name__}'s "
                      f"({known})")
    return script_args


def run_tool(tools: dict, call) -> str:
    """Run one tool call locally; bad names or arguments become an error result, as in training."""
    try:
        arguments = json.loads(call.function.arguments or "{}")
        return str(tools[call.function.name](**arguments))
    except Exception as err:  # noqa: BLE001 - the model's mistake is the tool's answer
        return f"Error: {type(err).__name__}: {err}"


class Interrupted(Exception):
    """Ctrl-C: the rollout sends no further request."""


def rollout(client, args, environment_factory, example: dict, max_turns: int,
            stop: threading.Event | None = None) -> dict:
    """One conversation: the model's turns and, for tool recipes, the results of its environment's tools (one
    environment per rollout, reset with the example's row first, as TRL's loop does: the text reset returns, a game's
    first observation, is appended to the last prompt message), until it stops calling them. Once `stop` is set
    (Ctrl-C) it sends nothing more."""
    environment = environment_factory() if environment_factory is not None else None
    messages = list(example["prompt"])
    if environment is not None:
        observation = environment.reset(**example)
        if isinstance(observation, str) and isinstance(messages[-1].get("content"), str):
            messages[-1] = {**messages[-1], "content": messages[-1]["content"] + observation}
    tools = {f.__name__: f for f in contract.environment_tools(environment)} if environment is not None else {}
    schemas = tool_schemas(tools)
    completion, usage = [], {"prompt_tokens": 0, "completion_tokens": 0}
    sent = []  # the conversation as the API takes it back: a tool call's arguments as the JSON string it returned
    try:
        for _ in range(max_turns + 1):
            if stop is not None and stop.is_set():
                raise Interrupted
            response = chat(client, model=args.model, messages=messages + sent, tools=schemas,
                            max_tokens=args.max_tokens, temperature=args.temperature)
            usage["prompt_tokens"] += response.usage.prompt_tokens if response.usage else 0
            usage["completion_tokens"] += response.usage.completion_tokens if response.usage else 0
            message = response.choices[0].message
            calls = (message.tool_calls or []) if tools else []
            turn = {"role": "assistant", "content": message.content or ""}
            sent.append(dict(turn))
            if calls:  # kept with parsed arguments, as TRL's chat templates and the rubric read them
                turn["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                    "name": c.function.name, "arguments": _json_or_text(c.function.arguments)}} for c in calls]
                sent[-1]["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                    "name": c.function.name, "arguments": c.function.arguments}} for c in calls]
            completion.append(turn)
            if not calls or len([m for m in completion if m.get("tool_calls")]) > max_turns:
                break
            results = [{"role": "tool", "tool_call_id": c.id, "name": c.function.name,
                        "content": run_tool(tools, c)} for c in calls]
            completion += results
            sent += results
        error = None
    except Exception as err:  # noqa: BLE001 - counted and reported; one failed rollout never ends the run
        error = api_error(err, args.base_url)
    return {"prompt": messages, "completion": completion, "usage": usage, "error": error, "tools": schemas or []}


def tool_schemas(tools: dict) -> list[dict] | None:
    """The tools' JSON schemas as TRL builds them (transformers' get_json_schema), or None without tools."""
    if not tools:
        return None
    from transformers.utils import get_json_schema

    return [get_json_schema(f) for f in tools.values()]


class NotACompletion(ValueError):
    """The server answered 200 with something that is not an OpenAI chat completion."""


def chat(client, **request):
    """One chat completion; a 200 whose body is not a completion raises NotACompletion with what it was."""
    try:
        response = client.chat.completions.create(**request)
    except json.JSONDecodeError as err:
        raise NotACompletion(f"a body that is not JSON ({err.msg} at character {err.pos}: {err.doc[:120]!r})") from err
    except APIResponseValidationError as err:
        raise NotACompletion(f"a body that is not a chat completion ({err.message})") from err
    if not hasattr(response, "choices") or not response.choices:
        raise NotACompletion(f"a body that is not a chat completion ({str(response)[:120]!r})")
    return response


def api_error(err: Exception, base_url: str) -> str:
    """A failed request in one line, with the server's own error text and, for a 404, the likely fix."""
    if isinstance(err, APIStatusError):
        text = err.response.text if err.response is not None else str(err)
        try:  # OpenAI-style {"error": {"message": ...}}, FastAPI's {"detail": ...}, or the raw text
            body = json.loads(text)
            error = body.get("error", body) if isinstance(body, dict) else body
            text = str(error.get("message") or error.get("detail") or error) if isinstance(error, dict) else str(error)
        except ValueError:
            pass
        text = " ".join(text.split())[:300] or "(no error text)"
        hint = ("; does --base_url end in /v1 (e.g. http://localhost:8000/v1)?" if err.status_code == 404 else
                "; check --api_key (or OPENAI_API_KEY)" if err.status_code in (401, 403) else "")
        return f"HTTP {err.status_code} from {base_url}/chat/completions: {text}{hint}"
    if isinstance(err, APIConnectionError):
        return f"cannot reach {base_url} ({err.__cause__ or err})"
    if isinstance(err, NotACompletion):
        return f"{base_url}/chat/completions answered with {err}"
    return f"{type(err).__name__}: {err}"


def _json_or_text(arguments: str):
    try:
        return json.loads(arguments)
    except (TypeError, json.JSONDecodeError):
        return arguments


def score(task: contract.Setup, rows: list[dict], examples: list[dict], failures: list[str] | None = None) -> None:
    """Add each reward of the task's rubric, the weighted total, strict and lenient correctness to every rollout
    row. With `failures`, a reward that raises scores None everywhere and its error is appended there (evaluate.py
    keeps the rollouts it paid for); without, the error is raised."""
    columns = {key: [ex[key] for ex in examples] for key in examples[0] if key != "prompt"}
    completions = [row["completion"] for row in rows]
    kwargs = {**columns, "prompts": [row["prompt"] for row in rows],
              "completion_ids": [[0] * row["usage"]["completion_tokens"] for row in rows]}
    for func in task.reward_funcs:
        name = rewards.reward_name(func)
        try:
            values = func(completions=completions, **kwargs)
            if len(values) != len(rows):
                raise ValueError(f"returned {len(values)} scores for {len(rows)} completions")
        except Exception as err:
            if failures is None:
                raise
            failures.append(f"{name} ({type(err).__name__}: {err})")
            values = [None] * len(rows)
        for row, value in zip(rows, values, strict=True):
            row.setdefault("scores", {})[name] = value
    first = rewards.reward_name(task.reward_funcs[0])
    for row, example in zip(rows, examples, strict=True):
        row["total"] = sum(w * (row["scores"][rewards.reward_name(f)] or 0.0)
                           for f, w in zip(task.reward_funcs, task.reward_weights, strict=True))
        row["strict"] = (row["scores"][first] or 0.0) >= 1.0
        row["lenient"] = rewards.answer_anywhere(rewards.completion_text(row["completion"]), example.get("answer"))


def pass_at_k(n: int, correct: int, k: int) -> float:
    """The unbiased pass@k estimate from n attempted rollouts of which `correct` were right (Chen et al., 2021)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} attempts, not {n}")
    return 0.0 if correct == 0 else 1.0 if n - correct < k else 1.0 - math.comb(n - correct, k) / math.comb(n, k)


def warn_if_unsampled(args, rows: list[dict]) -> None:
    """Several rollouts per example at a temperature above 0 that all came back identical: pass@k and pass rates
    measure nothing then, and the usual cause is the server's (difficulty.unsampled)."""
    if args.rollouts > 1 and args.temperature > 0 and (problem := difficulty.unsampled(rows)):
        print(f"warning: {problem}", file=sys.stderr)


def summarize(task: contract.Setup, rows: list[dict], rollouts: int) -> str:
    """Reward means over the rollouts that got an answer; accuracy and pass@k over every attempted rollout, a failed
    request counting as a wrong answer (leaving it out would raise both)."""
    ok = [row for row in rows if row["error"] is None]
    lines = [f"{len(rows)} rollouts, {len(rows) - len(ok)} failed on API errors (counted as wrong below)"]
    for func, weight in zip(task.reward_funcs, task.reward_weights, strict=True):
        values = [row["scores"][rewards.reward_name(func)] for row in ok]
        values = [v for v in values if v is not None]
        spread = statistics.pstdev(values) if values else float("nan")
        mean = statistics.mean(values) if values else float("nan")
        lines.append(f"  {rewards.reward_name(func):<40} weight {weight:<5g} mean {mean:6.3f}  std {spread:6.3f}")
    total = statistics.mean(float(row["total"]) for row in ok) if ok else float("nan")
    lines.append(f"  {'weighted total':<40} {'':12} mean {total:6.3f}")
    attempted = lambda key: statistics.mean(float(row[key] and row["error"] is None) for row in rows)  # noqa: E731
    lenient = (f"   lenient accuracy {attempted('lenient'):.1%} (gold answer anywhere in the final message)"
               if any(row.get("answer") is not None for row in rows) else "")  # code_grpo's rows have tests instead
    lines.append(f"strict accuracy {attempted('strict'):.1%} (right, in the recipe's format){lenient}")
    by_example = {}
    for row in rows:
        by_example.setdefault(row["example"], []).append(row["strict"] and row["error"] is None)
    for k in sorted({1, rollouts}):
        estimate = statistics.mean(pass_at_k(len(v), sum(v), k) for v in by_example.values()) if by_example else 0.0
        lines.append(f"pass@{k} {estimate:.1%}")
    turns = [sum(m["role"] == "assistant" for m in row["completion"]) for row in ok]
    calls = [sum(len(m.get("tool_calls") or []) for m in row["completion"]) for row in ok]
    tokens = [row["usage"]["completion_tokens"] for row in ok]
    if ok:
        lines.append(f"mean turns {statistics.mean(turns):.2f}   tool calls {statistics.mean(calls):.2f}   "
                     f"completion tokens {statistics.mean(tokens):.0f}")
    return "\n".join(lines)


def show(row: dict) -> str:
    parts = [f"--- example {row['example']}, rollout {row['rollout']}, total {row['total']:.2f}"]
    for message in row["completion"]:
        text = message.get("content") or ""
        if message.get("tool_calls"):
            text += " ".join(f"[calls {c['function']['name']}({json.dumps(c['function']['arguments'])})]"
                             for c in message["tool_calls"])
        parts.append(f"{message['role'].upper():>9}: {text[:600]}")
    return "\n".join(parts)


def probe(client, args, example: dict) -> None:
    """One short request before the run: a server that refuses the request (a wrong path or key) or answers with
    something that is not a chat completion ends here in one line with its own error text, not in every rollout."""
    try:
        chat(client.with_options(max_retries=0), model=args.model, messages=list(example["prompt"]), max_tokens=1)
    except APIConnectionError:
        raise Refusal(f"cannot reach {args.base_url}: start a server (e.g. `transformers serve {args.model}` or "
                      f"`vllm serve {args.model}`) or fix --base_url.") from None
    except APIStatusError as err:
        # A wrong path or key ends here. Any other error may be the probe's own (transformers serve 5.25 answers 400
        # to a 1-token tool call it cannot parse; 500 before it) or one response's, and rate limits wait in the
        # rollouts' retries: if every rollout fails, main says so.
        if err.status_code in (401, 403, 404):
            raise Refusal(api_error(err, args.base_url)) from None
    except NotACompletion as err:
        raise Refusal(api_error(err, args.base_url)) from None


def check_out(out: Path, overwrite: bool, flag: str = "--out", lines: str = "rollouts") -> None:
    """Before any rollout: --out (or --pass_rates) never replaces what was paid for (unless --overwrite_out), and is
    writable (an unwritable one would lose it all at the end)."""
    if out.is_file() and out.stat().st_size and not overwrite:
        raise Refusal(f"{flag} {out} already holds {len(out.read_text().splitlines())} {lines}: pass another {flag} "
                      f"(e.g. {out.with_stem(out.stem + '-2')}) to keep both, or --overwrite_out to replace it")
    try:
        existed = out.exists()
        open(out, "a").close()
        if not existed:
            out.unlink()
    except OSError as err:
        raise Refusal(f"{flag} {out}: cannot write there ({err.strerror})") from None


def connect(args) -> OpenAI:
    """A client of the server at --base_url, once something answers there."""
    api_key = args.api_key or os.environ.get("OPENAI_API_KEY") or "none"  # local servers take any key
    client = OpenAI(base_url=args.base_url, api_key=api_key, timeout=args.timeout, max_retries=3)
    try:  # any HTTP answer means a server is there (transformers 5.17's serve fails /v1/models without a Hub cache)
        client.with_options(max_retries=0).models.list()
    except APIConnectionError:
        raise Refusal(f"cannot reach {args.base_url}: start a server (e.g. `transformers serve {args.model}` or "
                      f"`vllm serve {args.model}`) or fix --base_url.") from None
    except (APIStatusError, json.JSONDecodeError, APIResponseValidationError):
        pass  # the chat probe says what the server answers
    return client


def main(argv=None) -> list[dict]:
    args, rest = parse_args(argv)
    check_options(args)
    quiet_noise()
    quiet_bars_when_redirected()
    check_out(Path(args.out), args.overwrite_out)
    if args.pass_rates:
        check_out(Path(args.pass_rates), args.overwrite_out, "--pass_rates", "prompts' pass rates")
    recipe = contract.load_recipe(args.recipe)
    script_args = recipe_arguments(recipe, rest)
    task = contract.checked_setup(recipe, script_args)
    if models := [f for f in task.reward_funcs if isinstance(f, str)]:
        raise Refusal(f"{recipe.__name__} rewards with a reward model ({', '.join(models)}), which only the trainer "
                      "loads: evaluate with a rubric of functions (judge_grpo.py: --reward_mode group or pointwise)")
    contract.check_tools(task.environment_factory)  # a tool the model cannot be shown: one line, before any request
    task.start()  # the sandbox or index: a machine that cannot run them is one line, not an error in every rollout
    dataset = data.build_split(task.build_dataset, args.split, script_args.dataset_path)
    examples = [dataset[i] for i in range(min(args.num_examples, len(dataset)))]
    if not examples:
        raise Refusal(f"no examples to evaluate: the {args.split} split is empty")
    # before any request is paid for: the prompts a chat API takes, every reward called on the first rows
    row_checks.check_prompts(dataset, args.split)
    row_checks.check_rubric(task.reward_funcs, dataset, args.split, task.environment_factory)
    client = connect(args)
    probe(client, args, examples[0])
    max_turns = args.max_turns
    if max_turns is None:  # the recipe's own bound on tool-calling rounds; none without tools
        tools = task.environment_factory is not None
        max_turns = recipe.RECIPE_DEFAULTS.get("max_tool_calling_iterations", 0) if tools else 0
    jobs = [(i, r) for i in range(len(examples)) for r in range(args.rollouts)]
    rows = run_rollouts(client, args, task, examples, jobs, max_turns, Path(args.out))
    failed = [row["error"] for row in rows if row["error"] is not None]
    if len(failed) == len(rows):  # nothing to score or keep: --out goes
        Path(args.out).unlink()
        raise Refusal(f"all {len(rows)} requests failed, none written to --out; the first: {failed[0]}")
    failures = []
    score(task, rows, [examples[i] for i, _ in jobs], failures)
    print(summarize(task, rows, args.rollouts))
    warn_if_unsampled(args, rows)
    for row in rows[: args.show]:
        print(show(row))
    scored = Path(args.out).with_name(Path(args.out).name + ".scoring")
    with open(scored, "w") as f:
        f.writelines(json.dumps(row, default=str) + "\n" for row in rows)
    scored.replace(args.out)  # the unscored rollouts stay in --out until the scored ones are whole
    print(f"wrote {len(rows)} rollouts to {args.out}")
    if args.pass_rates:  # the input of a recipe's --pass_rates (grpo_recipes/difficulty.py)
        rates = difficulty.pass_rates(rows, examples)
        Path(args.pass_rates).write_text("".join(json.dumps(rate, default=str) + "\n" for rate in rates))
        print(f"wrote the pass rates of {len(rates)} prompts to {args.pass_rates}: {difficulty.describe(rates)}")
    if failed:
        print(f"{len(failed)} of {len(rows)} requests failed; the first: {failed[0]}", file=sys.stderr)
    if failures:
        raise Refusal(f"{'; '.join(failures)} raised while scoring: {'its' if len(failures) == 1 else 'their'} "
                      f"scores are null in {args.out}, which keeps all {len(rows)} rollouts; fix the reward")
    return rows


def run_rollouts(client, args, task, examples: list[dict], jobs: list[tuple[int, int]], max_turns: int,
                 out: Path) -> list[dict]:
    """Every job's rollout, each appended to `out` as it finishes (unscored), so that a crash or Ctrl-C keeps what
    was paid for; Ctrl-C sends no further request and says how many were written."""
    stop = threading.Event()
    rows: list[dict | None] = [None] * len(jobs)
    pool = ThreadPoolExecutor(args.concurrency)
    futures = {pool.submit(rollout, client, args, task.environment_factory, examples[i], max_turns, stop): k
               for k, (i, _) in enumerate(jobs)}
    written = 0
    try:
        with open(out, "w") as sink:
            for future in tqdm(as_completed(futures), total=len(futures), desc=f"{args.recipe} rollouts",
                               unit="rollout", disable=None):
                k = futures[future]
                i, r = jobs[k]
                rows[k] = {**future.result(), "example": i, "rollout": r, "answer": examples[i].get("answer")}
                sink.write(json.dumps(rows[k], default=str) + "\n")
                sink.flush()
                written += 1
    except KeyboardInterrupt:
        stop.set()
        pool.shutdown(wait=False, cancel_futures=True)
        raise Refusal(f"interrupted: {written} of {len(jobs)} rollouts are in {out}, unscored; no further request "
                      "was sent", exit_code=130) from None
    pool.shutdown()
    return rows


if __name__ == "__main__":
    run_script(main)
