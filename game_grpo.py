"""Multi-turn GRPO in a stateful game: the model plays by calling the game's moves as tools, the game answers each
move, ends the episode, and owns the reward. The template for your own environment (a simulator, an API with state).

One GPU:                          python game_grpo.py
A textarena game (offline):       python game_grpo.py --game textarena:TowerOfHanoi-v0 --turn_limit 12
Check it against an API first:    python evaluate.py game_grpo --base_url ... --model ... -r 4
Offline on CPU, tiny model:       python offline.py --tools && python game_grpo.py --config offline/game_grpo.yaml
Jupyter or Colab (free T4):       notebooks/game_grpo.ipynb, generated from this file

TRL's `environment_factory` makes one game per rollout and calls its `reset(seed=...)`, whose first observation is
appended to the prompt; the game's public methods are the tools. Each call is one turn: TRL runs it, appends the
game's answer as a `tool` message (masked out of the loss: the model is trained on its moves, never on the game's
text), and lets the model go on, until the game says it is over, the model stops calling moves, or the budget
(`max_tool_calling_iterations` turns, `max_completion_length` tokens for the whole episode) runs out. The rubric replays
each episode's moves in a fresh game (grpo_recipes/games.py says why) and reads the game's own record: won or not,
turns, invalid moves, and its turn-level credit.
"""

# %% [markdown]
# ## What to expect
# The curves to watch are `rewards/game_won_reward/mean` (the win rate), `game/turns` and `game/invalid_moves`:
# wins should rise while turns and invalid moves fall. `game/unfinished` is the share of episodes the budget cut
# before the game ended them; above a few percent, raise `--max_completion_length`.

# %%
import functools
import random
from dataclasses import dataclass

from datasets import Dataset

import rewards
from grpo_recipes import data, games, options
from grpo_recipes.contract import Setup
from grpo_recipes.options import arg
from grpo_recipes.refusal import Refusal, run_script

# %% [markdown]
# ## Config
# The same GRPO as tool_use_grpo.py. Games are generated from seeds, so `max_steps` sets the run's length.

# %%
ON_COLAB = options.on_colab()
MODEL_NAME = "Qwen/Qwen2.5-0.5B-Instruct" if ON_COLAB else "Qwen/Qwen2.5-1.5B-Instruct"  # TRL parses its tool calls

RECIPE_DEFAULTS = {
    "model_name_or_path": MODEL_NAME, "output_dir": "runs/game_grpo",
    "learning_rate": 1e-6,  # a full fine-tune's rate (--use_peft false)
    "lora_learning_rate": 2e-5 if ON_COLAB else 1e-5,  # LoRA needs ~10x (Schulman et al., "LoRA Without Regret")
    "lr_scheduler_type": "cosine", "warmup_steps": 0.05, "max_grad_norm": 1.0,
    "gradient_checkpointing": True,
    "num_generations": 8, "scale_rewards": "none",  # as gsm8k_grpo.py, measured there
    "per_device_train_batch_size": 16 if ON_COLAB else 8,
    "gradient_accumulation_steps": 1 if ON_COLAB else 4,  # 4 games × 8 episodes per optimizer step
    "max_completion_length": 1024 if ON_COLAB else 2048,  # the whole episode: every move and every answer
    "max_tool_calling_iterations": 10,  # turns TRL runs, at least --turn_limit (checked): the game ends the episode
    "mask_truncated_completions": True,  # an episode cut mid-turn by the token budget is left out of the loss
    "max_steps": 100 if ON_COLAB else 300,  # generated games: the steps, not an epoch, end the run
    "logging_steps": 1, "num_completions_to_print": 2,
    "save_steps": 50 if ON_COLAB else 100, "save_total_limit": 3,
    "eval_strategy": "steps", "eval_steps": 50 if ON_COLAB else 100, "num_generations_eval": 4,
    "per_device_eval_batch_size": 16 if ON_COLAB else 64,
    "use_peft": True, "lora_r": 16, "lora_alpha": 32, "lora_target_modules": ["all-linear"],  # LoRA: one 24 GB GPU
    "lora_dropout": 0.0,  # TRL's 0.05: trained log-probs differ from what vLLM sampled (read as off-policy)
}


@dataclass
class ScriptArguments:
    game: str = arg("guess_the_number", "guess_the_number (this file's game), or textarena:<GameId> for one of "
                                        "textarena's single-player games that run offline (textarena:TowerOfHanoi-v0).")
    max_number: int = arg(100, "guess_the_number: the secret is a whole number from 1 to this.")
    turn_limit: int = arg(7, "Moves per episode; the game ends the episode as a loss after the last one (7: enough to "
                             "halve 1..100 down to one number). Not evaluate.py's --max_turns, its rounds of calls.")
    train_size: int = arg(100_000, "Training games (each a seed) per epoch.")
    dataset_path: str | None = arg(None, "Games to play, rows with a `seed` column: a file or a folder with train.* "
                                         "and test.* files. Default: generated seeds.")
    num_eval_examples: int = arg(64 if ON_COLAB else 200, "Held-out games (seeds training never plays), scored with "
                                                          "the same rubric at each evaluation.")


# %% [markdown]
# ## System prompt
# The rules of a game come with its first observation; the system prompt says how to play any of them.

# %%
SYSTEM_PROMPT = """You are playing a game. Make one move per turn by calling a tool, then read what the game answers. \
Keep playing until the game says it is over; then reply in one line without calling a tool."""


# %% [markdown]
# ## Data
# A game is its seed: rows carry it, and the game's `reset(seed=...)` deals the episode. Held-out games use seeds
# training never reaches.

# %%
HELD_OUT_SEEDS = 1_000_000_000  # held-out seeds start here; training's are 0 .. train_size - 1


def build_dataset(split: str = "train", dataset_path: str | None = None, train_size: int = 100_000,
                  test_size: int = 200) -> Dataset:
    """Games as rows: the conversational `prompt` (the game's first observation is added by its reset) and `seed`."""
    if dataset_path:
        raw = data.load_split(split, dataset_path, None, None)
        if "seed" not in raw.column_names:
            raise ValueError(f"{dataset_path} ({split}) lacks column 'seed': it has {raw.column_names}")
        seeds = [int(seed) for seed in raw["seed"]]
    else:
        seeds = range(train_size) if split == "train" else range(HELD_OUT_SEEDS, HELD_OUT_SEEDS + test_size)
    prompt = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "A new game."}]
    return Dataset.from_dict({"prompt": [prompt] * len(seeds), "seed": list(seeds)})


# %% [markdown]
# ## Environment
# The game in plain sight: its state, `reset`, its move (a typed, documented method: TRL shows the model its name,
# docstring and `Args:`), what each move answers, when the episode ends, and the record the rubric reads
# (grpo_recipes/games.py lists it). Your own environment keeps the same shape.

# %%
class GuessTheNumber:
    """I think of a whole number from 1 to max_number; each guess is answered higher, lower or correct. The episode ends
    with a win, or as a loss after max_turns guesses. Turn-level credit: how close a guess comes to halving the numbers
    the hints still allow (1.0 for the middle one; 0.0 for a number they rule out, a repeat, or an invalid guess)."""

    def __init__(self, max_number: int = 100, max_turns: int = 7):
        self.max_number, self.max_turns = max_number, max_turns

    def reset(self, seed: int, **row) -> str:
        self.secret = random.Random(seed).randint(1, self.max_number)
        self.low, self.high = 1, self.max_number  # the numbers the hints so far allow
        self.turns = self.invalid_moves = 0
        self.done = self.won = False
        self.credits = []
        return (f"\n\nI am thinking of a whole number from 1 to {self.max_number}. You have {self.max_turns} guesses; "
                "call guess(number) for each.")

    def guess(self, number: int) -> str:
        """Guess the secret number.

        Args:
            number: A whole number in the game's range.
        """
        if self.done:  # an invalid move, not a turn: the game's record stays what it was at its end
            self.invalid_moves += 1
            return "Error: the game is over; reply in one line without calling guess."
        if isinstance(number, str) and number.strip().isascii() and number.strip().isdecimal():  # "42", quoted
            number = int(number)
        if not isinstance(number, int) or isinstance(number, bool) or not 1 <= number <= self.max_number:
            return self._invalid(f"guess a whole number from 1 to {self.max_number}, not {number!r}")
        self.turns += 1
        size, worst = self.high - self.low + 1, max(number - self.low, self.high - number)
        allowed = self.low <= number <= self.high
        self.credits.append((size - worst) / (size - size // 2) if allowed else 0.0)
        if number == self.secret:
            self.done = self.won = True
            return f"Correct! {number} is the number: you won in {self.turns} guesses. Game over."
        if number < self.secret:
            self.low = max(self.low, number + 1)
        else:
            self.high = min(self.high, number - 1)
        hint = "higher" if number < self.secret else "lower"
        return self._turn_over(f"{number} is wrong: the number is {hint}.")

    def _invalid(self, reason: str) -> str:
        self.turns += 1
        self.invalid_moves += 1
        self.credits.append(0.0)
        return self._turn_over(f"Error: {reason}. That cost a guess.")

    def _turn_over(self, answer: str) -> str:
        if not self.done and self.turns >= self.max_turns:
            self.done = True
            return f"{answer} No guesses left: the number was {self.secret}. You lost. Game over."
        left = self.max_turns - self.turns
        return answer if self.done else f"{answer} {left} guess{'es' if left > 1 else ''} left."


def new_game(script_args: ScriptArguments):
    """The factory of the game the flags choose: TRL calls it once per rollout (and the rubric once per replay)."""
    if script_args.game == "guess_the_number":
        return functools.partial(GuessTheNumber, script_args.max_number, script_args.turn_limit)
    if script_args.game.startswith(games.TEXTARENA_PREFIX):
        game_id = script_args.game.removeprefix(games.TEXTARENA_PREFIX)
        games.open_textarena(game_id)  # a game that cannot run here is one line now, not an error in every rollout
        return functools.partial(games.TextArenaGame, game_id, script_args.turn_limit)
    raise Refusal(f"--game {script_args.game}: use guess_the_number or textarena:<GameId> (textarena:TowerOfHanoi-v0)")


# %% [markdown]
# ## Rewards
# The game's record, after a replay of the episode's moves: a win (1.0), a fast win (up to 0.5 more), and the game's
# turn-level credit (up to 0.25). The best a lost or unfinished episode can total is 0.25; a win totals at least 1.0.

# %%
REWARD_WEIGHTS = {rewards.game_won_reward: 1.0, rewards.game_efficiency_reward: 0.5, rewards.game_progress_reward: 0.25}


def setup(script_args: ScriptArguments) -> Setup:
    """The game the flags choose, one per rollout, and the rubric bound to the same game for its replays."""
    if script_args.turn_limit < 1 or script_args.max_number < 1:
        raise Refusal("--turn_limit and --max_number: at least 1")
    factory = games.refereed(new_game(script_args))  # a move that raises is an invalid move, live and in replay
    funcs, weights = rewards.combine({functools.partial(reward, new_game=factory): weight
                                      for reward, weight in REWARD_WEIGHTS.items()})
    games_to_play = functools.partial(build_dataset, train_size=script_args.train_size,
                                      test_size=script_args.num_eval_examples)
    return Setup(funcs, weights, environment_factory=factory, build_dataset=games_to_play)


# %% [markdown]
# ## Trainer
# The shared pre-flight checks (and that TRL's turn limit lets the game end its episodes), then TRL's `GRPOTrainer`
# with one game per rollout.

# %%
def main(argv: list[str] | None = None):
    from trl import GRPOTrainer, get_peft_config, get_quantization_config

    from grpo_recipes import training

    script_args, training_args, model_args = options.parse_args(ScriptArguments, RECIPE_DEFAULTS, argv)
    if training_args.max_tool_calling_iterations < script_args.turn_limit:
        raise Refusal(f"--max_tool_calling_iterations {training_args.max_tool_calling_iterations} is below "
                      f"--turn_limit {script_args.turn_limit}: TRL would stop long episodes before the game ends them")
    task = setup(script_args)  # the game and its rubric
    tokenizer = training.prepare(training_args, model_args, task)
    train_dataset, eval_dataset = data.load_splits(task.build_dataset, training_args, script_args.dataset_path,
                                                   script_args.num_eval_examples)
    training.check_rows(task, train_dataset, tokenizer)  # prompts rendered, each reward called on real rows
    trainer = GRPOTrainer(
        model=model_args.model_name_or_path,
        reward_funcs=task.reward_funcs,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        quantization_config=get_quantization_config(model_args),
        environment_factory=task.environment_factory,  # one game per rollout, reset with the row's seed
    )
    return training.run(trainer)


# %% [markdown]
# ## Run
# Watch the win rate with `game/turns` and `game/invalid_moves`.

# %% tags=["parameters", "active-ipynb"]
# NOTEBOOK_ARGS = []  # command-line flags, e.g. ["--max_steps", "50"] or ["--config", "offline/game_grpo.yaml"]

# %% tags=["active-ipynb"]
# from grpo_recipes import notebook
#
# trainer = main(NOTEBOOK_ARGS)
# notebook.show_training(trainer.args.output_dir, trainer)

# %% [markdown]
# ## Try it
# The trained model on a few held-out games, playing through the same tools, scored by the same rubric.

# %% tags=["active-ipynb"]
# notebook.try_model(trainer, n=3)

# %% tags=["active-py"]
if __name__ == "__main__":
    run_script(main)
