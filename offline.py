"""The offline kit: toy data and a tiny Qwen2 model built locally, so every recipe runs on a CPU with no Hub.

    python offline.py                    # ~8 s: toy data, the tiny model, gsm8k_grpo.yaml and sft_warmstart.yaml
    python offline.py --tools --search   # + warm starts that call the tools (~30 s each) and their configs
    python offline.py --code             # + toy code problems, a tiny model warm-started to write code, its config
    python offline.py --games            # + a tiny model warm-started to play game_grpo.py's game
    python offline.py --mcp              # + a tiny model warm-started to call the MCP example server's calculator
    python gsm8k_grpo.py --config offline/gsm8k_grpo.yaml
    python offline.py --serve_judge &    # the stand-in judge judge_grpo.yaml names (grpo_recipes/kit_judge.py)

offline/gsm8k_toy/{train,test}.jsonl    toy word problems in GSM8K form (`question`, `answer` ending "#### n")
offline/search_toy/                     a generated corpus (corpus.jsonl) and two-hop questions for the search agent
offline/code_toy/{train,test}.jsonl     toy function-writing problems in MBPP's form (text, code, test_list)
offline/passage_toy/{train,test}.jsonl  toy passage questions for judge_grpo.py (context, question, reference)
offline/tiny-qwen2/                     a random Qwen2ForCausalLM (~0.17M parameters) with a byte-level BPE tokenizer
                                        trained on the kit's text and TRL's bundled Qwen2.5 chat template
offline/tiny-qwen2-{tools,search}/      the same model after a short SFT on tool-call conversations (--tools, --search)
offline/tiny-qwen2-games/               with --games: after a short SFT on guess-the-number games played by halving
offline/tiny-qwen2-mcp/                 with --mcp: after a short SFT on calls to grpo_recipes/mcp_example_server.py
offline/tiny-qwen2-code*/               with --code: a tiny model with a tokenizer trained on code, and its warm start
offline/tiny-qwen3*/                    with --thinking, instead: Qwen3's chat template (enable_thinking), warm starts
                                        that think before each turn, and configs with `thinking: true`
offline/<recipe>.yaml                   a `--config` for each recipe that trains on the above on CPU (its paths
                                        relative to it); a rerun keeps a config you edited, writing <recipe>.new.yaml

Your fork of a recipe gets a config too: `python offline.py --recipe my_recipe.py --dataset_path my_data/` writes
offline/my_recipe.yaml (the tiny model, your data, runs/my_recipe; a tool recipe's needs --tools for a model that
calls tools).

The base model is untrained, so its completions are noise and its rewards near zero: the kit exercises every code
path of a recipe (data, chat template, generation, tools, rewards, GRPO loss, evaluation, checkpoints), not learning.
"""

import argparse
import hashlib
import json
import os
import random
import re
import time
from pathlib import Path

NAMES = ["Ava", "Ben", "Chidi", "Dana", "Elif", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kemi", "Luca"]
ITEMS = ["marbles", "stickers", "apples", "pencils", "stamps", "shells"]
THINGS = ["kite", "bike", "scarf", "door", "boat", "mug"]


def _problem(rng: random.Random) -> dict:
    """One word problem with a worked solution in GSM8K's style (calculator annotations, '#### answer')."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    kind = rng.randrange(4)
    if kind == 0:
        have, packs, per_pack = rng.randint(2, 40), rng.randint(2, 9), rng.randint(2, 12)
        bought = packs * per_pack
        answer = have + bought
        question = (f"{name} has {have} {item}. {name} buys {packs} packs with {per_pack} {item} in each. "
                    f"How many {item} does {name} have now?")
        steps = [f"{name} buys {packs} * {per_pack} = <<{packs}*{per_pack}={bought}>>{bought} {item}.",
                 f"{name} now has {have} + {bought} = <<{have}+{bought}={answer}>>{answer} {item}."]
    elif kind == 1:
        price, count = rng.randint(2, 9), rng.randint(2, 9)
        bill = rng.choice([50, 100])
        cost = price * count
        answer = bill - cost
        question = (f"A shop sells {item} for ${price} each. {name} buys {count} {item} and pays with a ${bill} "
                    f"bill. How much change does {name} get, in dollars?")
        steps = [f"The {item} cost {count} * ${price} = $<<{count}*{price}={cost}>>{cost}.",
                 f"The change is ${bill} - ${cost} = $<<{bill}-{cost}={answer}>>{answer}."]
    elif kind == 2:
        friends, each = rng.randint(2, 8), rng.randint(3, 15)
        total = friends * each
        answer = each
        question = (f"{name} has {total} {item} and shares them equally among {friends} friends. "
                    f"How many {item} does each friend get?")
        steps = [f"Each friend gets {total} / {friends} = <<{total}/{friends}={answer}>>{answer} {item}."]
    else:
        per_day, weeks = rng.randint(120, 990), rng.randint(2, 6)
        days = 7 * weeks
        answer = per_day * days
        question = (f"A farm collects {per_day} {item} every day. How many {item} does it collect in {weeks} weeks?")
        steps = [f"{weeks} weeks have 7 * {weeks} = <<7*{weeks}={days}>>{days} days.",
                 f"The farm collects {per_day} * {days} = <<{per_day}*{days}={answer}>>{answer} {item}."]
    # GSM8K writes some large gold answers with a thousands separator; keep a few so the parser is exercised.
    gold = f"{answer:,}" if answer >= 1000 and rng.random() < 0.5 else str(answer)
    return {"question": question, "answer": "\n".join(steps) + f"\n#### {gold}"}


def write_toy_gsm8k(out_dir: str | Path, n_train: int = 48, n_test: int = 16, seed: int = 0) -> Path:
    """Write `train.jsonl` and `test.jsonl` of toy problems to out_dir (a folder `load_dataset` reads as two splits)."""
    return write_splits(out_dir, _problem, n_train, n_test, seed)


def write_toy_passages(out_dir: str | Path, n_train: int = 48, n_test: int = 16, seed: int = 0) -> Path:
    """Write toy passage questions for judge_grpo.py: a passage of four facts ("Ava's kite is red."), a question about
    one ("What colour is Ava's kite?") and its `reference` colour, for your own checks: the recipe never reads it, and
    the kit's judge reads the passage, as a model judge would (grpo_recipes/kit_judge.py)."""
    from grpo_recipes.kit_judge import COLOURS

    def passage(rng: random.Random) -> dict:
        facts = [(name, rng.choice(THINGS), rng.choice(COLOURS)) for name in rng.sample(NAMES, 4)]
        name, thing, colour = rng.choice(facts)
        return {"context": " ".join(f"{n}'s {t} is {c}." for n, t, c in facts),
                "question": f"What colour is {name}'s {thing}?", "reference": colour}

    return write_splits(out_dir, passage, n_train, n_test, seed)


def write_splits(out_dir: str | Path, make_row, n_train: int, n_test: int, seed: int) -> Path:
    """`train.jsonl` and `test.jsonl` in out_dir, of rows `make_row(rng)` draws from one seeded generator."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    for split, n in (("train", n_train), ("test", n_test)):
        with open(out_dir / f"{split}.jsonl", "w") as f:
            for _ in range(n):
                f.write(json.dumps(make_row(rng)) + "\n")
    return out_dir


# Toy functions, each family a template: (name, what the text asks for, the body, how to draw an argument).
CODE_FAMILIES = [
    ("add_{k}", "returns x plus {k}", "return x + {k}", lambda rng: rng.randint(-50, 50)),
    ("times_{k}", "returns x times {k}", "return x * {k}", lambda rng: rng.randint(-20, 20)),
    ("minus_{k}", "returns x minus {k}", "return x - {k}", lambda rng: rng.randint(-50, 50)),
    ("repeat_{k}", "returns the string s repeated {k} times", "return s * {k}",
     lambda rng: "".join(rng.choice("abcxyz") for _ in range(rng.randint(1, 3)))),
]


def code_problem(rng: random.Random, task_id: int) -> dict:
    """One function-writing problem in MBPP's form: text, the reference code, three assert tests."""
    name, asks, body, draw = rng.choice(CODE_FAMILIES)
    k = rng.randint(2, 9)
    name, asks, body = name.format(k=k), asks.format(k=k), body.format(k=k)
    param = "s" if "s *" in body else "x"
    code = f"def {name}({param}):\n    {body}"
    function = {}
    exec(code, function)  # the reference itself, to write the expected values
    args = []
    while len(args) < 3:
        if (arg := draw(rng)) not in args and function[name](arg) != arg:
            args.append(arg)
    return {"task_id": task_id, "text": f"Write a function that {asks}.", "code": code, "test_setup_code": "",
            "test_list": [f"assert {name}({a!r}) == {function[name](a)!r}" for a in args], "challenge_test_list": []}


def write_toy_code(out_dir: str | Path, n_train: int = 48, n_test: int = 16, seed: int = 0) -> Path:
    """Toy code problems in MBPP's form (train.jsonl, test.jsonl) for code_grpo.py."""
    rng, out = random.Random(seed), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("test", n_test)):
        rows = [code_problem(rng, i) for i in range(n)]
        (out / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return out


def code_conversations(data_dir: str | Path, split: str = "train") -> list[dict]:
    """The toy code problems as code_grpo.py prompts them, answered with the reference in one code block."""
    import code_grpo

    conversations = []
    for line in (Path(data_dir) / f"{split}.jsonl").read_text().splitlines():
        row = json.loads(line)
        prompt = code_grpo.mbpp_problem(row)["prompt"]
        conversations.append({"messages": prompt + [{"role": "assistant",
                                                     "content": f"```python\n{row['code']}\n```"}]})
    return conversations


def write_toy_search(out_dir: str | Path, n_people: int = 64, n_test: int = 16, seed: int = 0) -> Path:
    """A generated corpus (corpus.jsonl) and two-hop questions (questions/{train,test}.jsonl) for the search agent.

    Each person's passage names the city they were born in, and each city's passage names its country: "In which
    country was X born?" needs a search for X, then one for the city.
    """
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ren", "ta", "vo", "shi", "ban", "del", "ru", "no", "pe", "zar", "qui", "fen"]

    def name(parts: int) -> str:
        return "".join(rng.choice(syllables) for _ in range(parts)).capitalize()

    countries = sorted({name(3) + "ia" for _ in range(8)})
    cities = {name(2) + rng.choice(["ton", "burg", "ville", "port"]): rng.choice(countries) for _ in range(24)}
    jobs = ["painter", "engineer", "poet", "chemist", "sailor", "architect", "composer", "botanist"]
    people = {f"{name(2)} {name(3)}": (rng.choice(sorted(cities)), rng.choice(jobs)) for _ in range(n_people)}
    corpus = [{"title": person, "text": f"{person} is a {job} who was born in {city}. {person.split()[0]} later "
               f"moved abroad and became known for work as a {job}."} for person, (city, job) in people.items()]
    corpus += [{"title": city, "text": f"{city} is a city in {country}. It has a harbour, a market and an old "
                f"university."} for city, country in cities.items()]
    city_counts = {country: list(cities.values()).count(country) for country in countries}
    corpus += [{"title": country, "text": f"{country} is a country with {count} large cities."}
               for country, count in city_counts.items()]
    out_dir = Path(out_dir)
    (out_dir / "questions").mkdir(parents=True, exist_ok=True)
    (out_dir / "corpus.jsonl").write_text("".join(json.dumps(p) + "\n" for p in corpus))
    questions = [{"question": f"In which country was {person} born?", "answer": cities[city],
                  "supporting_titles": [person, city]} for person, (city, _) in people.items()]
    for split, rows in (("train", questions[n_test:]), ("test", questions[:n_test])):
        (out_dir / "questions" / f"{split}.jsonl").write_text("".join(json.dumps(q) + "\n" for q in rows))
    return out_dir


def search_conversations(questions_file: str | Path, tools, system_prompt: str) -> list[dict]:
    """Two-hop questions solved with two real searches (the person, then the city their passage names), through the
    search recipe's tools."""
    conversations = []
    for line in Path(questions_file).read_text().splitlines():
        question = json.loads(line)
        person, city = question["supporting_titles"]
        messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": question["question"]}]
        for query in (person, city):
            call = {"type": "function", "function": {"name": "search", "arguments": {"query": query}}}
            messages += [{"role": "assistant", "content": "", "tool_calls": [call]},
                         {"role": "tool", "name": "search", "content": tools.search(query)}]
        messages.append({"role": "assistant", "content": f"<answer>{question['answer']}</answer>"})
        conversations.append({"messages": messages})
    return conversations


def build_tiny_model(out_dir: str | Path, corpus: list[str], vocab_size: int = 2048, seed: int = 0,
                     hidden_size: int = 64, num_layers: int = 2, single_digits: bool = False,
                     added_tokens: tuple[str, ...] = (), thinking: bool = False) -> Path:
    """Train a byte-level BPE tokenizer on `corpus`, build a small random Qwen2ForCausalLM, save both to out_dir.

    single_digits: every digit its own token (arithmetic is learnable digit by digit); added_tokens: kept whole;
    thinking: Qwen3's chat template (it reads enable_thinking and drops earlier turns' thinking when it re-renders a
    conversation) and its <think></think> tokens, instead of Qwen2.5's. 4 attention heads (2 for keys and values), so
    head_dim = hidden_size / 4: vLLM's CPU attention needs 32 or more (`offline.py --vllm`: hidden size 128).
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    from trl.chat_template_utils import qwen2_5_chat_template, qwen3_chat_template

    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if single_digits:
        bpe.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), bpe.pre_tokenizer])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(corpus, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                        chat_template=qwen3_chat_template if thinking else qwen2_5_chat_template)
    # Qwen keeps its tool-call (and thinking) markers as single added tokens; so does the tiny tokenizer.
    tokenizer.add_tokens(["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
                          *(["<think>", "</think>"] if thinking else []), *added_tokens])

    torch.manual_seed(seed)
    im_end, pad = tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.pad_token_id
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                         num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=32768,
                         rope_theta=1_000_000.0, tie_word_embeddings=True, bos_token_id=None,
                         eos_token_id=im_end, pad_token_id=pad)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = [im_end, pad]
    model.generation_config.pad_token_id = pad
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def tool_call_conversations(data_dir: str | Path, system_prompt: str, split: str = "train",
                            tool: str = "python") -> list[dict]:
    """Toy problems solved with one tool call each: the last calculator annotation of the solution, as code for
    tool_use_grpo's `python`, or as the expression of the MCP example server's `calculate` (mcp_grpo.py)."""
    conversations = []
    for line in (Path(data_dir) / f"{split}.jsonl").read_text().splitlines():
        problem = json.loads(line)
        expression, result = re.findall(r"<<([^=]+)=([^>]+)>>", problem["answer"])[-1]
        arguments = {"code": f"print({expression})"} if tool == "python" else {"expression": expression}
        call = {"type": "function", "function": {"name": tool, "arguments": arguments}}
        conversations.append({"messages": [
            {"role": "system", "content": system_prompt},
            {"role": "user", "content": problem["question"]},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": tool, "content": result},
            {"role": "assistant", "content": f"<answer>{result}</answer>"},
        ]})
    return conversations


def game_conversations(seeds, max_number: int, max_turns: int, off_by_one: float = 0.0, seed: int = 0) -> list[dict]:
    """game_grpo's guess_the_number played by halving what the hints allow, one guess a turn, as TRL's loop renders an
    episode: the game's first observation appended to the prompt, each guess a tool call, each answer a tool message,
    a one-line reply after the game's end.

    off_by_one: the share of "higher" hints after which the player keeps its own guess among the candidates (the flawed
    teacher of experiments/game_demo.py: on some branches it guesses the same number again and runs out of guesses)."""
    import game_grpo

    rng = random.Random(seed)
    conversations = []
    for seed in seeds:
        game = game_grpo.GuessTheNumber(max_number, max_turns)
        prompt = game_grpo.build_dataset("train", train_size=1)[0]["prompt"]
        messages = [*prompt[:-1], {**prompt[-1], "content": prompt[-1]["content"] + game.reset(seed=seed)}]
        low, high = 1, max_number
        while not game.done:
            number = (low + high) // 2
            answer = game.guess(number)
            if "higher" in answer:
                low = number + (rng.random() >= off_by_one)
            elif "lower" in answer:
                high = number - 1
            call = {"type": "function", "function": {"name": "guess", "arguments": {"number": number}}}
            messages += [{"role": "assistant", "content": "", "tool_calls": [call]},
                         {"role": "tool", "name": "guess", "content": answer}]
        messages.append({"role": "assistant", "content": "I won." if game.won else "I lost."})
        conversations.append({"messages": messages})
    return conversations


def with_thinking(conversations: list[dict]) -> list[dict]:
    """The same conversations from a thinking model: a short <think> block (reasoning_content) before every
    assistant turn, as Qwen3 writes with enable_thinking."""
    thoughts = {True: "I need a tool for this.", False: "I have what I need."}
    return [{"messages": [{**m, "reasoning_content": thoughts[bool(m.get("tool_calls"))]} if m["role"] == "assistant"
                          else m for m in c["messages"]]} for c in conversations]


def warm_start(model_dir: str | Path, out_dir: str | Path, conversations: list[dict], tools: list,
                          steps: int = 150, seed: int = 0) -> Path:
    """SFT the tiny model on tool-call conversations (loss on assistant turns only) so that it calls the tools.

    An untrained model never emits a parseable tool call, so without this an offline run of a tool recipe never
    exercises the tool path.
    """
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import get_json_schema
    from trl import SFTConfig, SFTTrainer

    from grpo_recipes.console import redirected
    from grpo_recipes.logs import use_compact_logs

    schemas = json.dumps([get_json_schema(tool) for tool in tools])
    dataset = Dataset.from_list([{**c, "tools": schemas} for c in conversations])
    args = SFTConfig(output_dir=str(Path(out_dir) / "sft-run"), max_steps=steps, per_device_train_batch_size=8,
                     learning_rate=5e-3, lr_scheduler_type="cosine", warmup_steps=10, assistant_only_loss=True,
                     use_cpu=True, bf16=False, gradient_checkpointing=False, logging_steps=50, save_strategy="no",
                     report_to="none", seed=seed, dataloader_num_workers=0, disable_tqdm=redirected())
    trainer = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), args=args, train_dataset=dataset,
                         processing_class=AutoTokenizer.from_pretrained(model_dir))
    use_compact_logs(trainer)
    print(f"offline.py: warm-starting {Path(out_dir).name} on {len(conversations)} conversations, {steps} SFT steps",
          flush=True)
    started = time.perf_counter()
    trainer.train()
    trainer.save_model(str(out_dir))
    print(f"offline.py: {Path(out_dir).name} warm-started in {time.perf_counter() - started:.0f} s", flush=True)
    return Path(out_dir)


OFFLINE_GRPO_CONFIG = {
    # Small enough for a laptop CPU in well under a minute; every other field keeps the recipe's default.
    "use_cpu": True,
    "gradient_checkpointing": False,
    "use_peft": False,  # the tiny model trains whole; LoRA is the recipes' default for billion-parameter models
    "num_generations": 4,
    "per_device_train_batch_size": 4,
    "gradient_accumulation_steps": 1,
    "max_completion_length": 32,
    "max_steps": 4,
    "logging_steps": 1,
    "save_steps": 2,
    "eval_steps": 2,
    "num_eval_examples": 8,
    "per_device_eval_batch_size": 8,
    "num_generations_eval": 2,
    "report_to": "none",
    "seed": 0,
    # On small shared CPUs one thread is many times faster than two for a model this size.
    "env": {"OMP_NUM_THREADS": "1"},
}


CONFIG_HEADER = ("# written by `python offline.py`; paths are relative to this file. Edit freely: a rerun keeps an "
                 "edited\n# file and writes its new config beside it (<name>.new.yaml). Unedited digest: ")
CONFIG_PATH_KEYS = ("model_name_or_path", "dataset_path", "output_dir", "corpus_path", "index_dir")


def write_config(path: Path, config: dict) -> Path:
    """Write a kit config, its paths relative to its folder, unless the file there was edited since offline.py wrote
    it (its digest line no longer matches): then keep it, write <name>.new.yaml beside it, and say so."""
    import yaml

    config = {key: os.path.relpath(value, path.parent) if key in CONFIG_PATH_KEYS else value
              for key, value in config.items()}
    body = yaml.safe_dump(config, sort_keys=False)
    text = f"{CONFIG_HEADER}{hashlib.sha256(body.encode()).hexdigest()[:16]}\n{body}"
    if path.is_file() and path.read_text() != text and not written_unedited(path.read_text()):
        beside = path.with_suffix(".new.yaml")
        beside.write_text(text)
        print(f"kept {path}: it was edited since offline.py wrote it; the new config is {beside}")
        return beside
    path.write_text(text)
    return path


def written_unedited(text: str) -> bool:
    """Whether a config's text is what offline.py wrote: the digest in its header matches the rest."""
    digest, _, body = text[len(CONFIG_HEADER):].partition("\n")
    return text.startswith(CONFIG_HEADER) and digest == hashlib.sha256(body.encode()).hexdigest()[:16]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out_dir", default="offline", help="where to write the kit")
    parser.add_argument("--tools", action="store_true", help="also warm-start a model for tool_use_grpo.py")
    parser.add_argument("--search", action="store_true", help="also a search corpus and a model for search_agent_grpo")
    parser.add_argument("--code", action="store_true", help="also toy code problems and a model for code_grpo.py")
    parser.add_argument("--mcp", action="store_true", help="also a model warm-started to call the MCP example "
                        "server's calculator, for mcp_grpo.py")
    parser.add_argument("--games", action="store_true", help="also a model warm-started to play game_grpo.py's game")
    parser.add_argument("--thinking", action="store_true", help="a thinking model instead (tiny-qwen3*): Qwen3's chat "
                        "template, warm starts that think before each turn, and configs with thinking: true")
    parser.add_argument("--vllm", action="store_true", help="models vLLM's CPU build accepts: hidden size 128, so "
                        "their 4 attention heads have 32 dimensions (vLLM's CPU attention refuses the default's 16)")
    parser.add_argument("--recipe", help="also a config for your fork of a recipe (its file): <out_dir>/<name>.yaml")
    parser.add_argument("--dataset_path", help="with --recipe: your fork's local data (default: its own)")
    parser.add_argument("--sft_steps", type=int, default=150, help="SFT steps of each warm start")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--serve_judge", action="store_true", help="only serve the kit's stand-in judge for "
                        "judge_grpo.yaml (grpo_recipes/kit_judge.py) until Ctrl-C")
    parser.add_argument("--judge_port", type=int, default=8011, help="with --serve_judge: its port on 127.0.0.1")
    args = parser.parse_args(argv)
    if args.serve_judge:
        from grpo_recipes import kit_judge

        return kit_judge.serve(args.judge_port)
    from trl.chat_template_utils import qwen2_5_chat_template, qwen3_chat_template

    import gsm8k_grpo
    import search_agent_grpo
    import tool_use_grpo
    from grpo_recipes.contract import environment_tools
    from grpo_recipes.console import quiet_bars_when_redirected

    quiet_bars_when_redirected()  # into a file: the warm starts' log lines, without their bars' frames
    started = time.perf_counter()
    out = Path(args.out_dir)
    data_dir = write_toy_gsm8k(out / "gsm8k_toy", seed=args.seed)
    search_dir = write_toy_search(out / "search_toy", seed=args.seed)
    conversations = tool_call_conversations(data_dir, tool_use_grpo.SYSTEM_PROMPT)
    think = with_thinking if args.thinking else lambda conversations: conversations
    conversations = think(conversations)
    name = "tiny-qwen3" if args.thinking else "tiny-qwen2"
    # The tokenizer learns the text it will see: the data, the system prompts, the chat template's tool header.
    corpus = [line for split in ("train", "test") for line in (data_dir / f"{split}.jsonl").read_text().splitlines()]
    corpus += (search_dir / "corpus.jsonl").read_text().splitlines()
    corpus += [gsm8k_grpo.SYSTEM_PROMPT, tool_use_grpo.SYSTEM_PROMPT, search_agent_grpo.SYSTEM_PROMPT,
               qwen3_chat_template if args.thinking else qwen2_5_chat_template, json.dumps(conversations[:8]),
               "<reasoning>\nStep by step.\n</reasoning>\n<answer>\n42\n</answer>"]
    model_dir = build_tiny_model(out / name, corpus, seed=args.seed, thinking=args.thinking,
                                 hidden_size=128 if args.vllm else 64)
    written = [data_dir, search_dir, model_dir]
    config = {"model_name_or_path": str(model_dir), "dataset_path": str(data_dir),
              "output_dir": str(out / "runs" / "gsm8k_grpo"), **OFFLINE_GRPO_CONFIG,
              **({"thinking": True} if args.thinking else {})}
    written.append(write_config(out / "gsm8k_grpo.yaml", config))
    sft_config = {"recipe": "gsm8k_grpo", "source": "gold", "dataset_path": str(data_dir),
                  "model_name_or_path": str(model_dir), "output_dir": str(out / "runs" / "sft_warmstart"),
                  "use_cpu": True, "gradient_checkpointing": False, "max_steps": 50, "learning_rate": 1e-3,
                  "env": {"OMP_NUM_THREADS": "1"}}
    written.append(write_config(out / "sft_warmstart.yaml", sft_config))
    passages = write_toy_passages(out / "passage_toy", seed=args.seed)
    judge_config = {**config, "dataset_path": str(passages), "output_dir": str(out / "runs" / "judge_grpo"),
                    "judge_base_url": f"http://127.0.0.1:{args.judge_port}/v1", "judge_model": "kit-judge"}
    written += [passages, write_config(out / "judge_grpo.yaml", judge_config)]
    # reasoning-gym generates its own prompts: sums of two one-digit numbers at level 0, a tiny model's size of task.
    gym_config = {**{k: v for k, v in config.items() if k != "dataset_path"}, "tasks": "chain_sum",
                  "output_dir": str(out / "runs" / "reasoning_gym_grpo")}
    written.append(write_config(out / "reasoning_gym_grpo.yaml", gym_config))
    tools_dir = None
    if args.tools:
        interpreter = tool_use_grpo.setup(tool_use_grpo.ScriptArguments()).environment_factory()  # (not started)
        tools_dir = warm_start(model_dir, out / f"{name}-tools", conversations, environment_tools(interpreter),
                               steps=args.sft_steps, seed=args.seed)
        tool_config = {**config, "model_name_or_path": str(tools_dir), "max_completion_length": 96,
                       "max_tool_calling_iterations": 2, "output_dir": str(out / "runs" / "tool_use_grpo")}
        written += [tools_dir, write_config(out / "tool_use_grpo.yaml", tool_config)]
    # game_grpo generates its games: 1..8 in 4 guesses. Its model: with --games, one warm-started on games played by
    # halving; else with --tools the interpreter's (its calls reach the game as invalid moves), else the base model.
    game_model = tools_dir or model_dir
    if args.games:
        import game_grpo

        game_model = warm_start(model_dir, out / f"{name}-games", think(game_conversations(range(400), 8, 4)),
                                environment_tools(game_grpo.GuessTheNumber()), steps=args.sft_steps, seed=args.seed)
        written.append(game_model)
    game_config = {**{k: v for k, v in config.items() if k != "dataset_path"}, "max_number": 8, "turn_limit": 4,
                   "max_tool_calling_iterations": 4, "max_completion_length": 320,
                   "model_name_or_path": str(game_model), "output_dir": str(out / "runs" / "game_grpo")}
    written.append(write_config(out / "game_grpo.yaml", game_config))
    if args.search:
        search_options = {"corpus_path": str(search_dir / "corpus.jsonl"), "index_dir": str(out / "bm25_index"),
                          "search_top_k": 2, "snippet_chars": 90}
        search = search_agent_grpo.setup(search_agent_grpo.ScriptArguments(**search_options)).environment_factory()
        search_model = warm_start(model_dir, out / f"{name}-search",
                                  think(search_conversations(search_dir / "questions" / "train.jsonl", search,
                                                             search_agent_grpo.SYSTEM_PROMPT)),
                                  environment_tools(search), steps=args.sft_steps, seed=args.seed)
        search_config = {**config, **search_options, "model_name_or_path": str(search_model),
                         "dataset_path": str(search_dir / "questions"), "max_completion_length": 192,
                         "max_tool_calling_iterations": 3, "output_dir": str(out / "runs" / "search_agent_grpo")}
        written += [search_model, write_config(out / "search_agent_grpo.yaml", search_config)]
    # mcp_grpo's model: with --mcp, one warm-started to call the example server's calculator; else with --tools the
    # interpreter's (its calls to `python` reach the server as a tool it does not offer), else the base model.
    mcp_model = write_mcp_model(out, config, name, model_dir, think, args) if args.mcp else tools_dir or model_dir
    written += [*([mcp_model] if args.mcp else []), write_config(out / "mcp_grpo.yaml", {
        **config, "model_name_or_path": str(mcp_model), "mcp_tools": ["calculate"], "max_completion_length": 96,
        "max_tool_calling_iterations": 2, "output_dir": str(out / "runs" / "mcp_grpo")})]
    if args.code:
        written += write_code_kit(out, config, args)
    if args.recipe:
        written.append(write_fork_config(out, config, args, out / f"{name}-tools"))
    print("wrote " + ", ".join(map(str, written)) + f" in {time.perf_counter() - started:.0f} s")


def write_fork_config(out: Path, config: dict, args, tools_model: Path) -> Path:
    """--recipe: a config for a fork on the kit's model (the tool warm start for a recipe with tools), with its own
    data (--dataset_path) and output folder."""
    from grpo_recipes.contract import load_recipe
    from grpo_recipes.refusal import Refusal

    recipe = load_recipe(args.recipe)
    name = Path(args.recipe).stem
    fork = {**config, "output_dir": str(out / "runs" / name)}
    if args.dataset_path:
        fork["dataset_path"] = str(Path(args.dataset_path).resolve())
    else:
        fork.pop("dataset_path")  # the fork's own data
    if "max_tool_calling_iterations" in recipe.RECIPE_DEFAULTS:  # a tool recipe (grpo_recipes/contract.py)
        if not tools_model.is_dir():
            raise Refusal(f"{args.recipe} calls tools: add --tools, which warm-starts the kit's model to call them")
        fork.update(model_name_or_path=str(tools_model), max_completion_length=96, max_tool_calling_iterations=2)
    return write_config(out / f"{name}.yaml", fork)


def write_mcp_model(out: Path, config: dict, name: str, model_dir: Path, think, args) -> Path:
    """--mcp: the tiny model warm-started to call the MCP example server's `calculate`, the one tool the toy problems
    need (the server listed for real, so the model learns the schema mcp_grpo.py shows it)."""
    import mcp_grpo
    from grpo_recipes.contract import environment_tools

    tools = mcp_grpo.setup(mcp_grpo.ScriptArguments(mcp_tools=["calculate"])).environment_factory
    tools.start()
    conversations = think(tool_call_conversations(config["dataset_path"], mcp_grpo.SYSTEM_PROMPT, tool="calculate"))
    return warm_start(model_dir, out / f"{name}-mcp", conversations, environment_tools(tools()), steps=args.sft_steps,
                      seed=args.seed)


def write_code_kit(out: Path, config: dict, args) -> list[Path]:
    """--code: toy problems, a tiny model whose tokenizer learned code, its warm start and code_grpo.yaml."""
    from trl.chat_template_utils import qwen2_5_chat_template

    code_dir = write_toy_code(out / "code_toy", seed=args.seed)
    conversations = code_conversations(code_dir)
    corpus = [json.dumps(c) for c in conversations] + [qwen2_5_chat_template] + [
        line for split in ("train", "test") for line in (code_dir / f"{split}.jsonl").read_text().splitlines()]
    base = build_tiny_model(out / "tiny-qwen2-code", corpus, vocab_size=1024, seed=args.seed,
                            hidden_size=128 if args.vllm else 64)
    model = warm_start(base, out / "tiny-qwen2-code-sft", conversations, [], steps=args.sft_steps, seed=args.seed)
    code_config = {**config, "model_name_or_path": str(model), "dataset_path": str(code_dir),
                   "max_completion_length": 48, "test_workers": 1, "output_dir": str(out / "runs" / "code_grpo")}
    code_config.pop("thinking", None)  # the code model is Qwen2.5's template
    return [code_dir, base, model, write_config(out / "code_grpo.yaml", code_config)]


if __name__ == "__main__":
    from grpo_recipes.refusal import run_script

    run_script(main)
