"""A run's first rows, checked before the model loads: the prompts as the chat template renders them, and every
reward of the rubric called on them as TRL will call it, with a few test completions (one in the system prompt's own
format). A fork's mistake then costs one line, not a model load and a generated batch and then a traceback:

- prompts: a `prompt` column of conversations (text skips the chat template), roles the template knows, and every
  message present in what the template renders (a `"System"` role is dropped by Qwen's, which puts its own in);
- each reward: `**kwargs` (TRL passes every column), the columns it names present in the rows, no exception, one
  number (or None) per completion;
- warnings for what trains on nothing: every reward None or NaN, and a reward that pays a common format but not the
  one the system prompt asks for (`<final>` in the prompt, `<answer>` in the reward).

The test completions are an empty one, the system prompt's tags around the row's answer, the row's
`gold_completion` where it has one, and a few common formats; they never reach the model or the logs.
"""

import asyncio
import inspect
import math
import re
import warnings
from numbers import Number

import rewards
from grpo_recipes.console import logger
from grpo_recipes.refusal import Refusal

ROLES = ("system", "developer", "user", "assistant", "tool")  # the roles of OpenAI's chat API, that templates know
TRL_ARGUMENTS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric",
                 "environments")  # what TRL passes every reward beside the data's columns
ROWS = 2  # rows the rubric is called on (a judge is asked about each test completion: a few requests)
PROMPT_ROWS = 16  # rows whose prompts are rendered
WORKING = "First I work out each step."
COMMON_FORMATS = {  # description -> a completion in that format, `{answer}` the row's answer
    "<reasoning>/<answer> tags": "<reasoning>\n" + WORKING + "\n</reasoning>\n<answer>\n{answer}\n</answer>",
    "<think>/<answer> tags": "<think>\n" + WORKING + "\n</think>\n<answer>\n{answer}\n</answer>",
    "an <answer> tag": "<answer>{answer}</answer>",
    r"\boxed{}": WORKING + "\n\\boxed{{{answer}}}",
    "the answer in words": WORKING + "\nThe answer is {answer}.",
}


def check_prompts(dataset, split: str = "train", tokenizer=None, model_name: str = "the model") -> None:
    """The first rows' prompts are conversations in roles chat templates know; with a tokenizer, its chat template
    renders every message of them (a message it drops, a role it does not know, is one line)."""
    columns = list(dataset[0]) if len(dataset) else []  # as rows read (a transform, as reasoning_gym's, adds some)
    if columns and "prompt" not in columns:
        raise Refusal(f"the {split} rows have no `prompt` column (they have {', '.join(columns)}): "
                      "build_dataset must return the conversation each rollout starts from as `prompt`")
    for i in range(min(PROMPT_ROWS, len(dataset))):
        prompt = dataset[i]["prompt"]
        if not isinstance(prompt, list) or not all(isinstance(m, dict) and "role" in m for m in prompt):
            raise Refusal(f"the {split} rows' prompt is {type(prompt).__name__}, not a conversation: TRL would train "
                          "it without the chat template (and a chat API refuses it); build it as [{'role': 'system', "
                          "'content': SYSTEM_PROMPT}, {'role': 'user', 'content': question}]")
        if unknown := [m["role"] for m in prompt if m["role"] not in ROLES]:
            raise Refusal(f"the {split} rows' prompt has the role {unknown[0]!r}: chat templates know "
                          f"{', '.join(ROLES)} (lower case) and drop or reject others")
        if tokenizer is not None:
            check_rendered(prompt, tokenizer, model_name, split)


def check_rendered(prompt: list[dict], tokenizer, model_name: str, split: str) -> None:
    """Every text message of the prompt is in what the tokenizer's chat template renders from it."""
    try:
        rendered = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    except Exception as err:  # noqa: BLE001 - a template's own error (roles that must alternate, ...) names the rule
        raise Refusal(f"{model_name}'s chat template cannot render the {split} rows' prompt: "
                      f"{str(err).splitlines()[0] if str(err) else type(err).__name__}") from None
    for message in prompt:
        content = message.get("content")
        if isinstance(content, str) and content.strip() and content.strip() not in rendered:
            raise Refusal(f"{model_name}'s chat template drops the {message['role']} message of the {split} rows' "
                          f"prompt ({content.strip()[:40]!r}...): it renders the roles it knows, in the order it "
                          "expects (one system message first, then user and assistant turns)")


def check_rubric(reward_funcs: list, dataset, split: str = "train", environment_factory=None,
                 trainer_state=None) -> None:
    """Call every reward on the first rows with the test completions, as TRL calls it; refuse in one line what would
    fail in training, warn in one line about what would train on nothing."""
    rows = [dataset[i] for i in range(min(ROWS, len(dataset)))]
    if not rows:
        return
    columns = [c for c in rows[0] if c != "prompt"]
    probes = [test_completions(row) for row in rows]
    scores = {}
    for func in reward_funcs:
        if isinstance(func, str) or hasattr(func, "forward"):
            continue  # a reward model: the trainer loads it
        name = rewards.reward_name(func)
        check_signature(func, name, columns, split)
        if (values := call(func, name, rows, probes, split, environment_factory, trainer_state)) is not None:
            scores[name] = values
    if scores and all(not is_number(v) for values in scores.values() for v in values):
        logger.warning(f"every reward gave None or NaN to all {sum(map(len, probes))} test completions on the first "
                       f"{split} rows: TRL counts None as no opinion, so these rows would train on nothing; check "
                       "that the rewards read the columns the rows have")
    mismatched = {name: found for name, values in scores.items() if (found := format_mismatch(values, probes))}
    if mismatched:
        tags, _, paid = next(iter(mismatched.values()))
        logger.warning(f"{'the reward' if len(mismatched) == 1 else 'the rewards'} {', '.join(mismatched)} "
                       f"{'pays' if len(mismatched) == 1 else 'pay'} nothing for a completion in the system prompt's "
                       f"format ({tags}, the answer inside) but {'pays' if len(mismatched) == 1 else 'pay'} for "
                       f"{paid}: do the tags the system prompt asks for match the ones the rewards read?")


def check_signature(func, name: str, columns: list[str], split: str) -> None:
    """A reward takes **kwargs (TRL passes every column and its own arguments) and names only columns the rows have."""
    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return  # a builtin or C callable: its call below says what it takes
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        raise Refusal(f"the reward {name} takes no **kwargs: TRL calls every reward with prompts, completions, "
                      f"completion_ids and each column of the rows ({', '.join(columns)}); add **kwargs to its "
                      "parameters")
    needed = [p.name for p in parameters if p.default is inspect.Parameter.empty and p.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY) and p.name not in TRL_ARGUMENTS]
    if missing := [n for n in needed if n not in columns]:
        raise Refusal(missing_column(name, missing[0], columns, split))


def missing_column(name: str, column: str, columns: list[str], split: str) -> str:
    return (f"the reward {name} reads the column {column!r}, which the {split} rows lack (they have "
            f"{', '.join(columns) or 'only prompt'}): return it from build_dataset, or drop the reward")


def call(func, name: str, rows: list[dict], probes: list[list[tuple[str, str]]], split: str, environment_factory,
         trainer_state) -> list | None:
    """The reward's scores for every row's test completions, called as TRL's GRPOTrainer calls it (None: an async
    reward inside a running event loop, left unchecked)."""
    pairs = [(row, text) for row, texts in zip(rows, probes, strict=True) for _, text in texts]
    columns = [key for key in rows[0] if key != "prompt"]
    kwargs = {key: [row[key] for row, _ in pairs] for key in columns}
    kwargs.update(prompts=[row["prompt"] for row, _ in pairs],
                  completions=[[{"role": "assistant", "content": text}] for _, text in pairs],
                  completion_ids=[[0] * max(1, len(text) // 4) for _, text in pairs],
                  trainer_state=trainer_state, log_extra=lambda *args: None, log_metric=lambda *args: None)
    if environment_factory is not None and "environments" in signature_names(func):
        kwargs["environments"] = [environment(environment_factory, row) for row, _ in pairs]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", rewards.ScorerFailed)
        try:
            values = func(**kwargs)
            values = awaited(values)
        except KeyError as err:
            if err.args and isinstance(err.args[0], str) and err.args[0] not in kwargs:
                raise Refusal(missing_column(name, err.args[0], columns, split)) from None
            raise Refusal(failed(name, err, split, len(pairs))) from None
        except Exception as err:  # noqa: BLE001 - any error here would end the first training step
            raise Refusal(failed(name, err, split, len(pairs))) from None
    if values is UNCHECKED:
        return None
    if not isinstance(values, list | tuple) or len(values) != len(pairs):
        listed = isinstance(values, list | tuple)
        count = f"{len(values)} value{'s' * (len(values) != 1)}" if listed else f"a {type(values).__name__}"
        raise Refusal(f"the reward {name} returned {count} for {len(pairs)} completions: a reward returns one "
                      "number (or None) per completion, in their order")
    if wrong := [v for v in values if v is not None and not isinstance(v, Number)]:
        raise Refusal(f"the reward {name} returned {type(wrong[0]).__name__} {wrong[0]!r}: a reward returns a "
                      "number (or None, no opinion) per completion")
    broke = [w for w in caught if issubclass(w.category, rewards.ScorerFailed)]
    if len(broke) >= len(pairs):
        raise Refusal(f"the reward {name} failed on all {len(pairs)} test completions of the first {split} rows "
                      f"and would give 0 to every answer: {str(broke[0].message).split(': ', 1)[-1]}")
    return list(values)


def awaited(values):
    """An async reward's values, run here; in a notebook's running loop (where TRL awaits it) left unchecked."""
    if not inspect.isawaitable(values):
        return values
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(values)
    values.close()
    return UNCHECKED


def failed(name: str, err: Exception, split: str, count: int) -> str:
    return (f"the reward {name} raised {type(err).__name__} on the first {split} rows ({count} test completions, "
            f"an empty one among them): {str(err).splitlines()[0] if str(err) else repr(err)}; fix it before "
            "training, where it would end the first step")


def signature_names(func) -> set[str]:
    try:
        return set(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        return set()


def environment(factory, row: dict):
    """A fresh environment for the row, reset as TRL resets it (a dict of factories: the row's `environment`)."""
    made = factory[row["environment"]]() if isinstance(factory, dict) else factory()
    made.reset(**{k: v for k, v in row.items() if not (isinstance(factory, dict) and k == "environment")})
    return made


def test_completions(row: dict) -> list[tuple[str, str]]:
    """(description, text) of the completions every reward is called with for this row: the first is empty, the
    second the system prompt's own format (when it names tags), the rest what a reward may pay instead."""
    answer = row.get("answer")
    answer = str(answer[0] if isinstance(answer, list) and answer else answer if answer is not None else 42)
    tests = [("an empty completion", "")]
    system = next((m.get("content") for m in row.get("prompt") or [] if isinstance(m, dict)
                   and m.get("role") == "system"), None)
    if isinstance(system, str) and (tags := prompt_tags(system)):
        blocks = [f"<{tag}>\n{WORKING}\n</{tag}>" for tag in tags[:-1]] + [f"<{tags[-1]}>\n{answer}\n</{tags[-1]}>"]
        tests.append((FORMAT + "".join(f"<{t}>" for t in tags), "\n".join(blocks)))
    if isinstance(row.get("gold_completion"), str):
        tests.append(("the row's gold_completion", row["gold_completion"]))
    tests += [(description, text.format(answer=answer)) for description, text in COMMON_FORMATS.items()]
    return tests


FORMAT = "the system prompt's tags "
UNCHECKED = object()  # awaited's answer for an async reward it cannot run here


def prompt_tags(system_prompt: str) -> list[str]:
    """The tags the system prompt asks for, in order: `<name>` with its `</name>` present too."""
    names = dict.fromkeys(re.findall(r"<([A-Za-z_][\w-]*)>", system_prompt))
    return [name for name in names if f"</{name}>" in system_prompt]


def is_number(value) -> bool:
    return isinstance(value, Number) and not (isinstance(value, float) and math.isnan(value))


def format_mismatch(values: list, probes: list[list[tuple[str, str]]]) -> tuple[str, float, str] | None:
    """(the system prompt's tags, the most the reward paid, for what) when on every row the reward paid a test
    completion more than the empty one but paid the system prompt's format nothing more; else None."""
    found, start = None, 0
    for tests in probes:
        scored = values[start:start + len(tests)]
        start += len(tests)
        if len(tests) < 2 or not tests[1][0].startswith(FORMAT):
            return None  # the system prompt names no tags: nothing to compare
        empty, own = scored[0] if is_number(scored[0]) else 0.0, scored[1]
        best = max(((v, d) for (d, _), v in zip(tests[2:], scored[2:], strict=True) if is_number(v)), default=None)
        if not is_number(own) or best is None or best[0] <= empty or own > empty:
            return None
        found = (tests[1][0].removeprefix(FORMAT), best[0], best[1])
    return found
