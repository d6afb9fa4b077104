"""reasoning-gym's tasks as rows a trainer can read and any process can score: each prompt is the address of a
generated item (task, level, split, index), regenerated from its seed wherever it is needed; the tasks this project
refuses, each for a reason measured on reasoning-gym 0.1.25; and the levels each task can generate. The recipe
(reasoning_gym_grpo.py) holds what a user edits: the tasks, the curriculum, the rubric."""

import random
import zlib

from grpo_recipes.gym_scorer import GymScorer
from grpo_recipes.refusal import Refusal

# Tasks that cannot teach through reasoning_gym_grpo.py, each for the reason measured on reasoning-gym 0.1.25 (every
# other task's gold earns full marks and wrong answers none, at its easiest and hardest level:
# tests/test_reasoning_gym_grpo.py checks each).
REFUSED = {
    **dict.fromkeys(("boxnet", "graph_color", "propositional_logic", "rubiks_cube", "rush_hour"),
                    "its scorer gives its own gold answer 0"),
    "puzzle24": "its scorer pays any expression equal to 24, whatever numbers it uses",
    "coin_flip": "its scorer pays a prefix of the gold in full (0 for 0.125)",
    "game_of_life_halting": "its scorer pays every answer where the gold is False",
    "knight_swap": "its easiest level fails its own config check (min_nodes must be >= 6)",
    "jugs": "its scorer rejects some of its own golds at level 1, and its generator runs on for minutes at levels 2-3",
    "number_sequence": "its generator never returns for some items (level 2, item 3 of --task_seed 0)",
}
# Levels beyond these take over 7 s an item to generate (zebra_puzzles' level 5 ran past 30 s for 4 items), which
# would leave the GPU waiting on the CPU.
LEVEL_CAPS = {"zebra_puzzles": 4}
SPLIT_SEEDS = {"train": 0, "test": 2**31}  # added to a level's base seed (below 2**29): the splits never share one
STRIDE, ATTEMPTS = 2**22, 32  # where a prompt's item cannot be used, the next tried is index + STRIDE (32 times)


class TaskSet:
    """The run's tasks and weights: generates their items and scores answers with each task's own scorer. Pickles
    without its caches (TRL's async trainer spawns a process)."""

    def __init__(self, tasks: str, data_seed: int, system_prompt: str, scorer: GymScorer | None = None):
        from reasoning_gym.factory import CURRICULA

        self.data_seed, self.system_prompt, self.weights = data_seed, system_prompt, {}
        self.scorer = scorer or GymScorer()  # the tasks' scorers, behind the sandbox
        for part in filter(None, (p.strip() for p in tasks.split(","))):
            name, _, weight = part.partition(":")
            if name not in CURRICULA or name in REFUSED:
                why = (f"{REFUSED[name]} (reasoning-gym 0.1.25)" if name in REFUSED
                       else "reasoning-gym has no such task with a curriculum")
                raise Refusal(f"--tasks {name}: {why}; choose from {', '.join(offered_tasks())}")
            try:
                self.weights[name] = float(weight or 1)
            except ValueError:
                raise Refusal(f"--tasks {part}: the weight after ':' must be a number") from None
        if not self.weights or min(self.weights.values()) <= 0:
            raise Refusal(f"--tasks {tasks!r}: name at least one task, each weight above 0 (countdown:2,chain_sum)")
        self._datasets, self._items, self._generates = {}, {}, {}
        self.held_out: set[str] = set()  # the held-out questions, which training never asks (set by datasets())

    def __getstate__(self):
        return {**self.__dict__, "_datasets": {}, "_items": {}}

    def top_level(self, task: str) -> int:
        """The task's hardest curriculum level: its longest attribute's last (set_global_level caps the others), or
        its LEVEL_CAPS entry."""
        from reasoning_gym.factory import create_curriculum

        top = max((len(a.levels) - 1 for a in create_curriculum(task).attributes.values()), default=0)
        return min(top, LEVEL_CAPS.get(task, top))

    def generates(self, task: str, level: int) -> bool:
        """Whether the task generates at `level`: some levels' configs fail reasoning-gym's own checks (caesar_cipher's
        and survo's top two, modulo_grid's level 1). Asked once a run."""
        if (task, level) not in self._generates:
            try:
                self.row(task, level, "train", 0)
                self._generates[task, level] = True
            except Refusal:
                self._generates[task, level] = False
        return self._generates[task, level]

    def next_level(self, task: str, level: int, step: int) -> int:
        """The nearest level above (step 1) or below (step -1) that generates; `level` itself where none does."""
        ahead = range(level + step, self.top_level(task) + 1) if step > 0 else range(level + step, -1, -1)
        return next((other for other in ahead if self.generates(task, other)), level)

    def max_level(self, task: str) -> int:
        """The hardest level the task generates at."""
        return self.next_level(task, self.top_level(task) + 1, -1)

    def dataset(self, task: str, level: int, split: str):
        """The task's reasoning-gym dataset at `level` for `split`, seeded by the run, the task and the level; the
        held-out split's seeds never meet training's. Its nominal size is unused: rows are addressed by index."""
        key = (task, level, split)
        if key not in self._datasets:
            from reasoning_gym.factory import DATASETS, create_curriculum

            curriculum = create_curriculum(task)
            curriculum.set_global_level(level)  # each attribute capped at its own last level
            seed = self.seed(task, level, split)
            try:
                self._datasets[key] = DATASETS[task][0](curriculum.generate_configuration({"seed": seed,
                                                                                          "size": 10_000}))
            except (AssertionError, ValueError) as err:  # reasoning-gym's configs validate with assert
                raise Refusal(f"--tasks {task}: reasoning-gym cannot generate it at level {level} ({err}); try a "
                              "lower --level") from None
        return self._datasets[key]

    def seed(self, task: str, level: int, split: str) -> int:
        """The seed of the task's dataset at `level` for `split`: item i is seeded by seed + i, and numpy's seeds stop
        at 2**32: train's seeds lie below 2**30 (a base below 2**29, indices below 2**29), held-out's 2**31 above."""
        return zlib.crc32(f"{self.data_seed}/{task}/{level}".encode()) % 2**29 + SPLIT_SEEDS[split]

    def pick(self, index: int) -> str:
        """The task of prompt `index`, drawn by weight (the same draw for the same index, in every process)."""
        rng = random.Random(f"{self.data_seed}/{index}")
        return rng.choices(list(self.weights), weights=list(self.weights.values()))[0]

    def row(self, task: str, level: int, split: str, index: int) -> dict:
        """Prompt `index` of the split: item `index` of the task's dataset, or where that item fails to generate or
        (training) asks a held-out question, the next of index + k * STRIDE that does not. The row keeps the index
        it used, so the scorer regenerates the same item."""
        failure = None
        for attempt in range(index, index + ATTEMPTS * STRIDE, STRIDE):
            try:
                item = self.item(task, level, split, attempt)
            except Exception as err:  # noqa: BLE001 - a generator that gives up on this seed (jugs, ...)
                failure = err
                continue
            if split == "train" and item["question"] in self.held_out:
                continue
            return {"prompt": [{"role": "system", "content": self.system_prompt},
                               {"role": "user", "content": item["question"]}],
                    "task": task, "level": level, "split": split, "index": attempt, "answer": str(item["answer"]),
                    "gold_completion": f"<answer>{item['answer']}</answer>"}
        why = f"its generator failed ({failure})" if failure else "every item tried is a held-out question"
        raise Refusal(f"--tasks {task}: no prompt {index} at level {level} after {ATTEMPTS} tries: {why}; try "
                      "another --level, or fewer --num_eval_examples")

    def item(self, task: str, level: int, split: str, index: int) -> dict:
        """Item `index` of the task's dataset at `level`, generated once (sokoban's take seconds) and kept for the
        group's other completions."""
        key = (task, level, split, index)
        if key not in self._items:
            if len(self._items) >= 4096:
                self._items.clear()
            self._items[key] = self.dataset(task, level, split)[index]
        return self._items[key]

    def score(self, answer: str | None, task: str, level: int, split: str, index: int) -> float:
        """The task's own score of `answer` for the row's item, 0-1 (some pay partial credit), scored in a confined
        child (gym_scorer.py); 0.0 for an answer the rubric refuses or that runs out of time."""
        return self.scorer.score(self.dataset(task, level, split), self.item(task, level, split, index), answer,
                                 task, (task, level, self.seed(task, level, split)))


def offered_tasks() -> list[str]:
    """Every reasoning-gym task with a curriculum (its difficulty levels), less those REFUSED."""
    from reasoning_gym.factory import CURRICULA

    return sorted(set(CURRICULA) - set(REFUSED))


def render(tasks: TaskSet, levels: dict[str, int], batch: dict) -> dict:
    """A batch of training indices as prompts, each task at its level in `levels` when the batch is read (the
    curriculum's, which it moves during the run)."""
    rows = [tasks.row((task := tasks.pick(i)), levels[task], "train", i) for i in batch["index"]]
    return {key: [row[key] for row in rows] for key in rows[0]}
