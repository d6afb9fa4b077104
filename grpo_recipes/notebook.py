"""In a notebook, after a run: its curves and a few completions (`show_training`), and the trained model on a few
held-out prompts through the recipe's own generation, tools and rubric (`try_model`)."""

from pathlib import Path

from datasets import Dataset
from trl import GRPOTrainer

from grpo_recipes.logs import PLOT_FILE, completions_text


def show_training(output_dir: str | Path, trainer=None, n: int = 2) -> None:
    """In a notebook: the curves the run saved, then a few completions from its last step with their rewards."""
    from IPython.display import Image, display

    display(Image(filename=str(Path(output_dir) / PLOT_FILE)))
    if trainer is not None:
        print_completions(trainer, n, "of the last step")


def try_model(trainer: GRPOTrainer, dataset: Dataset | None = None, n: int = 3) -> dict:
    """The trained model on n held-out prompts (the trainer's eval_dataset unless given), through the recipe's own
    generation, tools and rubric (an evaluation of those prompts); prints one completion of each with its rewards."""
    dataset = trainer.eval_dataset if dataset is None else dataset
    if dataset is None:
        print("no held-out prompts: pass them, e.g. notebook.try_model(trainer, build_dataset('test', <dataset_path>))")
        return {}
    metrics = trainer.evaluate(eval_dataset=dataset.select(range(min(n, len(dataset)))))
    group = trainer.args.num_generations_eval or trainer.args.num_generations
    print(f"held-out total reward {metrics.get('eval_reward', float('nan')):.3f} (mean of {min(n, len(dataset))} "
          f"prompts × {group} completions)")
    print_completions(trainer, n, "on a held-out prompt", stride=group)
    return metrics


def print_completions(trainer: GRPOTrainer, n: int, where: str, stride: int = 1) -> None:
    """n completions (one per prompt group first, a group being stride completions) of the trainer's latest batch."""
    print(completions_text(trainer._logs, n, where, stride))  # GRPOTrainer keeps its latest batch in _logs

