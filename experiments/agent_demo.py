"""A CPU-only demo that GRPO teaches the agent recipes to use their tools, from an imperfect teacher.

    python experiments/agent_demo.py --task tool --seeds 0 1 2      # tool_use_grpo.py: 13-15 minutes a seed on 2 cores
    python experiments/agent_demo.py --task search --seeds 0 1 2    # search_agent_grpo.py: 12 minutes a seed

The tasks can only be solved with the tool, and the teacher uses it wrongly in a way the reward can see:
- tool: "A crate holds 347 apples. How many apples are in 86 crates?" (and subtractions of the same sizes). A tiny
  model cannot multiply 3-digit by 2-digit numbers in its head; the teacher calls `python` for every problem, but on
  multiplications it writes `a + b` 60% of the time, and answers what the interpreter printed.
- search: "In which country was painter 4821 born?" over a corpus made fresh for each seed (painters, the towns they
  were born in, the towns' countries). The teacher searches for the painter, then 60% of the time answers the town
  it read there (one hop) instead of searching for the town and answering its country.

Stages, each training stage a subprocess through the recipe's own entry point, as a user would run it:
  1. data, and the teacher's conversations (its tool calls run by the recipe's own tools), scored by the recipe's
     rubric as an evaluate.py JSONL;
  2. a tiny model (offline.build_tiny_model) whose tokenizer learns the teacher's text, pre-trained to copy numbers
     and names from its context (copying.teach_copying), as any pretrained model can;
  3. SFT: sft_warmstart.py --source rollouts on every teacher conversation;
  4. GRPO with the recipe beside the SFT control (more SFT on the teacher, the same number of steps × the measured
     step-time ratio); then the ablation: GRPO where the tool is no use (tool: every call answers with an error,
     --tool_seconds_per_step 0; search: a corpus that names every painter and town but says nothing of where);
  5. held-out evaluation of the SFT start, GRPO, the control and the ablation on --n_test problems never seen in SFT
     or RL, greedy, through TRL's own multi-turn loop and the recipe's own tools and rubric.
Writes runs/agent_demo/<task>/results.json and results.png.
"""

import argparse
import importlib
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from cpu_demo import run, say  # the same stages' runner: a subprocess per stage, one thread, a log each

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the package
from grpo_recipes.refusal import Refusal, run_script  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent  # the repository: the recipes these experiments run
TEACHER_ERROR = 0.6  # how often the teacher uses the tool wrongly where it can go wrong
SEARCH_FLAGS = ["--search_top_k", "1", "--snippet_chars", "80"]  # a search shows one whole passage
# Tool: at temperature 1.0 a third of the tiny model's samples broke the tool-call format and seed 2 did not move in
# 50 steps at 2e-5 (+0.0); from that start 0.7 and 5e-5 gave +19.8, 0.7 and 1e-4 broke the copying of numbers (-3.0).
# Search: its conversations are 2.2x the tool task's tokens (450: two tool schemas, two searches), so it takes half the
# prompts per GRPO step (a step measured 7.5 -> 3.3 s), an SFT control as long as GRPO (2.5 steps a step), and its
# copying and SFT run on both cores, the only process then (SFT: 1.9 -> 1.1 s a step); the tool task was measured with
# one. At SFT batch 16 seed 1 stalled at loss 0.34 for 250
# steps (it never learned to copy the town from the search result: SFT start 0.0%, GRPO +6.4); at 32, 0.063 by 200.
TASK_DEFAULTS = {"tool": {"grpo_lr": 5e-5, "temperature": 0.7, "sft_batch": 32, "grpo_prompts": 8, "solo_threads": 1,
                          "control_ratio": 3.0},
                 "search": {"grpo_lr": 2e-5, "temperature": 1.0, "sft_batch": 32, "grpo_prompts": 4, "solo_threads": 2,
                            "control_ratio": 2.5}}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--task", choices=["tool", "search"], required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="one full pipeline per seed")
    parser.add_argument("--out_dir", default="runs/agent_demo", help="a folder per task and seed, results.json/png")
    parser.add_argument("--overwrite_output_dir", action="store_true", help="replace an earlier demo")
    parser.add_argument("--n_sft", type=int, default=2000, help="teacher conversations for SFT")
    parser.add_argument("--n_rl", type=int, default=800, help="RL problems (true answers only)")
    parser.add_argument("--n_test", type=int, default=500, help="held-out problems, never seen in SFT or RL")
    parser.add_argument("--copy_steps", type=int, default=800, help="steps of copying.teach_copying, batch 32")
    parser.add_argument("--sft_steps", type=int, default=250, help="SFT steps, lr 1e-3 cosine")
    parser.add_argument("--sft_batch", type=int, default=argparse.SUPPRESS, help="SFT (and control) batch size "
                        "(default: 32)")
    parser.add_argument("--solo_threads", type=int, default=argparse.SUPPRESS, help="torch threads of copying and SFT, "
                        "the stages that run alone (default: tool 1, search 2)")
    parser.add_argument("--grpo_steps", type=int, default=50, help="GRPO steps, --grpo_prompts x 8 completions each")
    parser.add_argument("--grpo_prompts", type=int, default=argparse.SUPPRESS, help="prompts per GRPO step, 8 "
                        "completions each (default: tool 8, search 4)")
    parser.add_argument("--grpo_lr", type=float, default=argparse.SUPPRESS, help="GRPO learning rate, constant "
                        "(default: tool 5e-5, search 2e-5)")
    parser.add_argument("--temperature", type=float, default=argparse.SUPPRESS, help="GRPO sampling temperature "
                        "(default: tool 0.7, search 1.0)")
    parser.add_argument("--control_ratio", type=float, default=argparse.SUPPRESS,
                        help="SFT control steps per GRPO step: about their step times' ratio on a 2-core CPU (0: "
                        "no control, as in the slow tests; default: tool 3.0, search 2.5)")
    parser.add_argument("--turn_credit", type=float, default=None, help="weight of the recipe's turn-level credit "
                        "reward (search: new_evidence_reward, tool: used_output_reward) in every GRPO run; default: "
                        "the recipe's own")
    args = parser.parse_args(argv)
    if args.turn_credit is not None and not 0 <= args.turn_credit < 1:
        parser.error(f"--turn_credit {args.turn_credit}: must be in [0, 1), so that it can never outweigh a correct "
                     "answer (the recipes' rubrics are probe-tested for weights below 1)")
    for name, value in TASK_DEFAULTS[args.task].items():
        if not hasattr(args, name):  # not given
            setattr(args, name, value)
    return args


# -------------------------------------------------------------------------------------------------------------- tool
def tool_problem(rng: random.Random, mistaken: tuple[str, ...] = ("multiply",)) -> dict:
    """One word problem in GSM8K form, its kind, and the code the teacher writes for it: `a + b` in 60% of the kinds
    it gets wrong (multiplies here; merge_demo.py's teacher gets subtractions wrong too).

    One wording per kind keeps the numbers at fixed places, so that a tiny model learns to copy them in minutes."""
    a, b = rng.randint(100, 999), rng.randint(11, 99)
    if rng.random() < 0.5:
        question, right, operator = f"A crate holds {a} apples. How many apples are in {b} crates?", a * b, "*"
        kind = "multiply"
    else:
        question, right, operator = f"A shop had {a} apples and sold {b}. How many apples are left?", a - b, "-"
        kind = "subtract"
    if kind in mistaken and rng.random() < TEACHER_ERROR:
        operator = "+"
    return {"question": question, "answer": f"#### {right}", "kind": kind, "teacher": f"print({a} {operator} {b})"}


def tool_conversation(tools, problem: dict) -> list[dict]:
    call = {"type": "function", "function": {"name": "python", "arguments": {"code": problem["teacher"]}}}
    result = tools.python(problem["teacher"])  # the recipe's own tool, as in training (outside a run: no budget)
    return [{"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "name": "python",
            "content": result}, {"role": "assistant", "content": f"<answer>{result}</answer>"}]


# ------------------------------------------------------------------------------------------------------------ search
def search_world(rng: random.Random, n_people: int) -> tuple[list[dict], list[dict]]:
    """A corpus of painters, towns and countries made up for this seed, and the two-hop question about each painter.

    Everything is numbered ("painter 4821", "town 37", "country-5"), so that the tiny model copies names digit by
    digit, as it copies the tool task's numbers (with one-token country names, it answered a random one of the 12).
    "country-5" is one word to the token-F1 reward: a wrong "country 6" would otherwise earn half of F1's credit.
    Which painter was born where, and which town lies in which country, is drawn anew for every seed."""
    countries = [f"country-{n}" for n in rng.sample(range(1, 100), 12)]
    towns = {f"town {n}": rng.choice(countries) for n in rng.sample(range(10, 100), 48)}
    people = [f"painter {n}" for n in rng.sample(range(1000, 10000), n_people)]
    born = {person: rng.choice(sorted(towns)) for person in people}
    corpus = [{"title": person, "text": f"{person} was born in {town}."} for person, town in born.items()]
    corpus += [{"title": town, "text": f"{town} is a town in {country}."} for town, country in towns.items()]
    questions = [{"question": f"In which country was {person} born?", "answer": towns[town],
                  "supporting_titles": [person, town], "town": town} for person, town in born.items()]
    return corpus, questions


def search_conversation(tools, question: dict, rng: random.Random) -> list[dict]:
    person = question["supporting_titles"][0]
    messages = []
    queries = [person] if rng.random() < TEACHER_ERROR else [person, question["town"]]
    for query in queries:  # " painter 4821", " town 37": a leading space, as in the question and the passages
        call = {"type": "function", "function": {"name": "search", "arguments": {"query": f" {query}"}}}
        messages += [{"role": "assistant", "content": "", "tool_calls": [call]},
                     {"role": "tool", "name": "search", "content": tools.search(query)}]
    answer = question["answer"] if len(queries) == 2 else question["town"]  # one hop: the town, not its country
    return messages + [{"role": "assistant", "content": f"<answer> {answer}</answer>"}]


# -------------------------------------------------------------------------------------------------------------- data
def write_data(out: Path, seed: int, args, mistaken: tuple[str, ...] = ("multiply",)):
    """rl/{train,test}.jsonl, teacher.jsonl (evaluate.py's format, scored by the recipe's rubric); the recipe module.

    No problem or person is in two of SFT, RL and held-out. mistaken: the tool problems the teacher gets wrong."""
    import evaluate
    from transformers.utils import get_json_schema

    from grpo_recipes import contract

    rng = random.Random(seed)
    (out / "rl").mkdir(parents=True, exist_ok=True)
    if args.task == "tool":
        import tool_use_grpo as recipe

        script_args = recipe.ScriptArguments()
        seen, rows = set(), []
        while len(rows) < args.n_test + args.n_rl + args.n_sft:
            problem = tool_problem(rng, mistaken)
            if problem["question"] not in seen:
                seen.add(problem["question"])
                rows.append(problem)
    else:
        import search_agent_grpo as recipe

        corpus, rows = search_world(rng, args.n_test + args.n_rl + args.n_sft)
        (out / "corpus.jsonl").write_text("".join(json.dumps(p) + "\n" for p in corpus))
        # The ablation's corpus: the same titles, so searches find them, but no passage says where or in which country.
        useless = [{"title": p["title"], "text": f"{p['title']} is a {p['title'].split()[0]}."} for p in corpus]
        (out / "useless_corpus.jsonl").write_text("".join(json.dumps(p) + "\n" for p in useless))
        script_args = recipe.ScriptArguments(corpus_path=str(out / "corpus.jsonl"), index_dir=str(out / "index"),
                                             search_top_k=int(SEARCH_FLAGS[1]), snippet_chars=int(SEARCH_FLAGS[3]))
    task = contract.checked_setup(recipe, script_args)  # the tools and rubric as the model will meet them in training
    tools = task.environment_factory()
    test, rl, sft = rows[:args.n_test], rows[args.n_test:args.n_test + args.n_rl], rows[args.n_test + args.n_rl:]
    kinds = [{"question": r["question"], "kind": r.get("kind", "two-hop"), "town": r.get("town")} for r in test]
    (out / "rl" / "kinds.jsonl").write_text("".join(json.dumps(k) + "\n" for k in kinds))  # for the held-out figures
    keep = ("question", "answer", "supporting_titles")
    for name, part in (("test", test), ("train", rl)):
        (out / "rl" / f"{name}.jsonl").write_text("".join(json.dumps({k: r[k] for k in keep if k in r}) + "\n"
                                                          for r in part))
    examples = [{"prompt": [{"role": "system", "content": recipe.SYSTEM_PROMPT},
                            {"role": "user", "content": r["question"]}],
                 "answer": r["answer"].removeprefix("#### "),
                 **({"supporting_titles": r["supporting_titles"]} if "supporting_titles" in r else {})} for r in sft]
    teacher = [tool_conversation(tools, r) if args.task == "tool" else search_conversation(tools, r, rng)
               for r in sft]
    schemas = [get_json_schema(tool) for tool in contract.environment_tools(tools)]
    logs = [{"prompt": e["prompt"], "completion": c, "usage": {"completion_tokens": 0}, "error": None,
             "tools": schemas} for e, c in zip(examples, teacher, strict=True)]
    evaluate.score(task, logs, examples)  # the recipe's own rubric: the teacher's mistakes score low, not zero
    (out / "teacher.jsonl").write_text("".join(json.dumps(row) + "\n" for row in logs))
    return recipe, rl, logs


# ------------------------------------------------------------------------------------------------------- the pipeline
def sft_argv(model: Path, rollouts: Path, out: Path, recipe: str, steps: int, seed: int, learning_rate: float,
             overwrite: bool, batch: int) -> list[str]:
    return ["--recipe", recipe, "--source", "rollouts", "--rollouts", str(rollouts), "--min_reward", "0",
            "--best_of", "1", "--model_name_or_path", str(model), "--output_dir", str(out), "--max_steps", str(steps),
            "--learning_rate", str(learning_rate), "--per_device_train_batch_size", str(batch),
            "--gradient_accumulation_steps", "1", "--warmup_steps", "0.05", "--use_cpu", "--gradient_checkpointing",
            "false", "--logging_steps", "25", "--seed", str(seed), *(["--overwrite_output_dir"] * overwrite)]


def environment(args, out: Path, useless: bool, data: str = "rl") -> list[str]:
    """The recipe flags that make the environment: the task's data (the out/<data> folder) and tools, or the
    ablation's useless tool."""
    if args.task == "tool":
        return ["--dataset_path", str(out / data), "--max_tool_calling_iterations", "1",
                "--max_completion_length", "64",
                *(["--tool_seconds_per_step", "0"] if useless else [])]  # no time for code: every call is an error
    corpus = out / ("useless_corpus.jsonl" if useless else "corpus.jsonl")
    return ["--dataset_path", str(out / data), "--corpus_path", str(corpus), "--index_dir", str(out / "index"),
            "--max_tool_calling_iterations", "2", "--max_completion_length", "160", *SEARCH_FLAGS]


TURN_CREDIT = {"tool": ("tool_use_grpo", "used_output_reward"), "search": ("search_agent_grpo", "new_evidence_reward")}


def reward_weights(args) -> list[str]:
    """--reward_weights: the recipe's, with its turn-level credit reward weighted --turn_credit (none: the recipe's)."""
    if getattr(args, "turn_credit", None) is None:
        return []
    import rewards

    module, credit = TURN_CREDIT[args.task]
    recipe = importlib.import_module(module)
    weights = [args.turn_credit if rewards.reward_name(func) == credit else weight
               for func, weight in zip(recipe.REWARD_FUNCS, recipe.REWARD_WEIGHTS, strict=True)]
    return ["--reward_weights", *map(str, weights)]


def grpo_argv(args, out: Path, model: Path, output: Path, seed: int, useless: bool = False, data: str = "rl",
              steps: int | None = None) -> list[str]:
    steps = str(steps or args.grpo_steps)
    return [*environment(args, out, useless, data), *reward_weights(args),
            "--model_name_or_path", str(model), "--output_dir", str(output),
            "--max_steps", steps, "--learning_rate", str(args.grpo_lr), "--lr_scheduler_type", "constant",
            "--warmup_steps", "0", "--max_grad_norm", "1.0", "--beta", "0", "--temperature", str(args.temperature),
            "--num_generations", "8", "--per_device_train_batch_size", str(8 * args.grpo_prompts),
            "--gradient_accumulation_steps", "1",
            "--eval_strategy", "no", "--save_steps", steps, "--save_only_model",
            "--logging_steps", str(min(5, args.grpo_steps)),
            "--report_to", "none", "--use_cpu", "--use_peft", "false", "--gradient_checkpointing", "false",
            "--seed", str(seed), *(["--overwrite_output_dir"] * args.overwrite_output_dir)]


class Recorder:
    """A reward of weight 0 that keeps every completion it is shown, with the columns TRL passes beside it."""
    __name__ = "recorder"

    def __init__(self):
        self.rows = []

    def __call__(self, prompts, completions, completion_ids, answer, **kwargs):
        titles = kwargs.get("supporting_titles") or [None] * len(prompts)
        self.rows += [{"prompt": p, "completion": c, "usage": {"completion_tokens": len(ids)}, "answer": a,
                       "supporting_titles": t} for p, c, ids, a, t in zip(prompts, completions, completion_ids,
                                                                           answer, titles, strict=True)]
        return [0.0] * len(prompts)


def held_out(recipe, model: Path, args, out: Path, useless: bool = False) -> dict:
    """Greedy held-out figures through TRL's own multi-turn loop (GRPOTrainer.evaluate) with the recipe's tools, each
    episode scored by evaluate.py with the recipe's rubric."""
    import evaluate
    import rewards
    from grpo_recipes import contract, options, training
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    argv = [*environment(args, out, useless), "--model_name_or_path", str(model), "--output_dir", tempfile.mkdtemp(),
            "--use_cpu", "--use_peft", "false", "--report_to", "none", "--per_device_train_batch_size", "8",
            "--num_generations", "8", "--per_device_eval_batch_size", "50", "--num_generations_eval", "1",
            "--generation_kwargs", json.dumps({"do_sample": False}), "--gradient_checkpointing", "false"]
    recorder = Recorder()
    script_args, training_args, _ = options.parse_args(recipe.ScriptArguments, recipe.RECIPE_DEFAULTS, argv)
    task = contract.checked_setup(recipe, script_args)  # the tools and rubric the recipe's main() builds
    task.start()
    training_args.reward_weights = [*task.reward_weights, 0.0]
    test = recipe.build_dataset("test", str(out / "rl"))
    tokenizer = AutoTokenizer.from_pretrained(model, padding_side="left")
    trainer = GRPOTrainer(model=str(model), reward_funcs=[*task.reward_funcs, recorder], args=training_args,
                          train_dataset=test, eval_dataset=test, processing_class=tokenizer,
                          environment_factory=task.environment_factory,
                          callbacks=training.trainer_callbacks(task.callbacks))
    metrics = trainer.evaluate()
    rows = recorder.rows
    evaluate.score(task, rows, [{key: row[key] for key in ("prompt", "answer", "supporting_titles")
                                   if row[key] is not None} for row in rows])
    calls = [rewards.tool_calls_and_results(row["completion"]) for row in rows]
    n_calls = sum(map(len, calls))
    kinds = {r["question"]: r for r in map(json.loads, (out / "rl" / "kinds.jsonl").read_text().splitlines())}
    rows_by_kind = {}
    for row in rows:
        rows_by_kind.setdefault(kinds[row["prompt"][-1]["content"]]["kind"], []).append(row)
    final = lambda row: rewards.completion_text(row["completion"])  # noqa: E731  the last assistant message
    if args.task == "tool":  # the teacher's mistake: adding where the problem multiplies
        multiplies = [c for c, row in zip(calls, rows, strict=True)
                      if kinds[row["prompt"][-1]["content"]]["kind"] == "multiply"]
        mistake = sum(bool(c) and " + " in c[0][0] for c in multiplies) / max(len(multiplies), 1)
    else:  # the teacher's mistake: answering the birth town, one hop short
        mistake = statistics.mean(rewards.extract_xml_answer(final(row)) == kinds[row["prompt"][-1]["content"]]["town"]
                                  for row in rows)
    figures = {"accuracy": statistics.mean(row["strict"] for row in rows),
               **{f"accuracy_{kind}": statistics.mean(row["strict"] for row in part)
                  for kind, part in sorted(rows_by_kind.items()) if len(rows_by_kind) > 1},
               "teacher_mistake": mistake,
               "tool_calls": n_calls / len(rows),
               "tool_errors": sum(rewards.tool_failed(result) for c in calls for _, result in c) / max(n_calls, 1),
               "turns": statistics.mean(sum(m["role"] == "assistant" for m in row["completion"]) for row in rows),
               "truncated": metrics["eval_completions/clipped_ratio"], "episodes": len(rows),
               "example": rows[0]["completion"]}
    if args.task == "search":
        figures["retrieved"] = statistics.mean(row["scores"]["new_evidence_reward"] == 1.0 for row in rows)
    return figures


def sft_start(out: Path, seed: int, args, mistaken: tuple[str, ...] = ("multiply",)):
    """Stages 1-3: the data and the teacher, the tiny model that can copy, SFT on the teacher (out/sft).

    Returns the recipe module, the RL problems and the stages' seconds."""
    import torch
    from transformers.utils.chat_template_utils import render_jinja_template
    from trl.chat_template_utils import qwen2_5_chat_template

    import copying
    import offline

    say(f"seed {seed}: data, the teacher's conversations and the tiny model in {out}")
    recipe, rl, teacher = write_data(out, seed, args, mistaken)
    conversations = [row["prompt"] + row["completion"] for row in teacher[:800]]
    corpus = render_jinja_template(conversations, tools=teacher[0]["tools"],  # the text the model will read
                                   chat_template=qwen2_5_chat_template)[0]
    if args.task == "search":
        corpus += [json.loads(line)["text"] for line in (out / "corpus.jsonl").read_text().splitlines()]
    offline.build_tiny_model(out / "tiny", corpus, vocab_size=800, seed=seed,
                             hidden_size=128, num_layers=3, single_digits=True, added_tokens=("<answer>", "</answer>"))
    say(f"seed {seed}: the tiny model learns to copy from its context ({args.copy_steps} steps)")
    copy_start = time.time()
    torch.set_num_threads(args.solo_threads)
    copying.teach_copying(out / "tiny", out / "base", sorted(set(re.findall(r"[A-Za-z]+", " ".join(corpus)))),
                          steps=args.copy_steps, seed=seed)
    torch.set_num_threads(1)  # the held-out figures share the machine with training
    name = recipe.__name__
    times = {"copying": time.time() - copy_start}
    sft = sft_argv(out / "base", out / "teacher.jsonl", out / "sft", name, args.sft_steps, seed, 1e-3,
                   args.overwrite_output_dir, args.sft_batch)
    times["sft"] = run("sft_warmstart.py", *sft, log=out / "sft.log", threads=args.solo_threads)
    return recipe, rl, times


def pipeline(seed: int, args) -> dict:
    out = Path(args.out_dir).resolve() / args.task / f"seed{seed}"
    start = time.time()
    recipe, _, times = sft_start(out, seed, args)
    name = recipe.__name__
    control = sft_argv(out / "sft", out / "teacher.jsonl", out / "control", name, round(args.control_ratio *
                       args.grpo_steps), seed, 3e-4, args.overwrite_output_dir, args.sft_batch)
    result = {"seed": seed}
    # Two training processes, a core each: GRPO beside the control, then the ablation on the first core free. The
    # held-out figures are taken in this process meanwhile, each as soon as its model is ready.
    with ThreadPoolExecutor(2) as pool:
        stages = {pool.submit(run, f"{name}.py", *grpo_argv(args, out, out / "sft", out / "grpo", seed),
                              log=out / "grpo.log"): "grpo"}
        if args.control_ratio > 0:
            stages[pool.submit(run, "sft_warmstart.py", *control, log=out / "control.log")] = "control"
        stages[pool.submit(run, f"{name}.py", *grpo_argv(args, out, out / "sft", out / "ablation", seed, useless=True),
                           log=out / "ablation.log")] = "ablation"
        say(f"seed {seed}: held-out figures of the SFT start, with its tool and with the useless one")
        result["sft_start"] = held_out(recipe, out / "sft", args, out)
        result["ablation_start"] = held_out(recipe, out / "sft", args, out, useless=True)
        say(f"seed {seed}: SFT start {json.dumps(result['sft_start'])}")
        for future in as_completed(stages):
            stage = stages[future]
            times[stage] = future.result()
            say(f"seed {seed}: held-out figures of {stage}")
            arm = {"control": "sft_control"}.get(stage, stage)
            result[arm] = held_out(recipe, out / stage, args, out, useless=stage == "ablation")
    result["gain"] = result["grpo"]["accuracy"] - result["sft_start"]["accuracy"]
    result["seconds"] = {**times, "total": time.time() - start}
    say(f"seed {seed}: {json.dumps(result)}")
    return result


def plot(results: list[dict], args, path: Path) -> None:
    """Held-out accuracy per seed: SFT start, after GRPO, SFT control, ablation; and the tool use behind them."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(13, 3.6), layout="constrained")
    accuracy, calls, extra = figure.subplots(1, 3)
    arms = {"sft_start": "SFT start", "grpo": "after GRPO", "sft_control": "SFT control", "ablation": "ablation"}
    arms = {key: label for key, label in arms.items() if key in results[0]}
    width = 0.8 / len(arms)
    for i, (key, label) in enumerate(arms.items()):
        offset = (i - (len(arms) - 1) / 2) * width
        seeds = [r["seed"] + offset for r in results]
        accuracy.bar(seeds, [100 * r[key]["accuracy"] for r in results], width, label=label)
        calls.bar(seeds, [r[key]["tool_calls"] for r in results], width, label=label)
        second = "retrieved" if args.task == "search" else "tool_errors"
        extra.bar(seeds, [100 * r[key][second] for r in results], width, label=label)
    ticks = [r["seed"] for r in results]
    accuracy.set(title=f"{args.task}: held-out greedy accuracy", xlabel="seed", ylabel="%", xticks=ticks)
    calls.set(title="tool calls per episode", xlabel="seed", xticks=ticks)
    extra.set(title="supporting passages retrieved (%)" if args.task == "search" else "tool calls that failed (%)",
              xlabel="seed", xticks=ticks)
    accuracy.legend(fontsize=7)
    figure.savefig(path, dpi=90)


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    out = Path(args.out_dir) / args.task
    if (out / "results.json").exists() and not args.overwrite_output_dir:
        raise Refusal(f"{out} already holds a demo (results.json): pass --overwrite_output_dir to replace it, or "
                      "another --out_dir")
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")  # everything is built here
    sys.path.insert(0, str(ROOT))
    import torch

    torch.set_num_threads(1)  # the in-process stages (copying, held-out figures): one thread is fastest at this size
    results = [pipeline(seed, args) for seed in args.seeds]
    (out / "results.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    plot(results, args, out / "results.png")
    print("seed  SFT start  after GRPO  gain    SFT control  ablation (start)  minutes")
    for r in results:
        print(f"{r['seed']:>4}  {r['sft_start']['accuracy']:>9.1%}  {r['grpo']['accuracy']:>10.1%}  {r['gain']:+6.1%}  "
              f"{r['sft_control']['accuracy'] if 'sft_control' in r else float('nan'):>11.1%}  "
              f"{r['ablation']['accuracy']:>7.1%} "
              f"({r['ablation_start']['accuracy']:.1%})  {r['seconds']['total'] / 60:>7.1f}")
    print(f"wrote {out / 'results.json'} and {out / 'results.png'}")
    return results


if __name__ == "__main__":
    run_script(main)
