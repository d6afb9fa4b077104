"""notebooks/: generated from the scripts, identical to what notebooks/build.py writes, and runnable headless on CPU."""

import sys
import types

import nbformat
import pytest
from nbclient import NotebookClient
from trl import ModelConfig, TrlParser

import gsm8k_grpo
import rewards
from conftest import ROOT

sys.path.insert(0, str(ROOT / "notebooks"))
import build  # noqa: E402  (notebooks/build.py)

CONFIGS = {"gsm8k_grpo": "gsm8k_grpo.yaml", "tool_use_grpo": "tool_use_grpo.yaml",
           "search_agent_grpo": "search_agent_grpo.yaml", "sft_warmstart": "sft_warmstart.yaml"}


@pytest.mark.parametrize("recipe", build.RECIPES)
def test_each_committed_notebook_is_exactly_what_its_script_generates(recipe):
    committed = (ROOT / "notebooks" / f"{recipe}.ipynb").read_text()
    assert committed == build.render(recipe), f"notebooks/{recipe}.ipynb is stale: run `python notebooks/build.py`"


def test_notebooks_carry_the_scripts_text_the_colab_setup_and_no_script_entry_point():
    notebook = build.build("gsm8k_grpo")
    sources = [cell.source for cell in notebook.cells]
    assert notebook.cells[0].cell_type == "markdown" and sources[0].startswith("# gsm8k_grpo.py: GRPO on GSM8K")
    assert "!pip install -q -r grpo-recipes/requirements.txt" in sources[1]
    assert any("## Rewards" in s and "farm" in s for s in sources)  # the script's markdown cells, as text
    assert any(s.startswith("REWARD_FUNCS, REWARD_WEIGHTS") or "\nREWARD_FUNCS, REWARD_WEIGHTS" in s for s in sources)
    assert not any('if __name__ == "__main__"' in s for s in sources)
    assert notebook.metadata["colab"]["gpuType"] == "T4" and notebook.metadata["accelerator"] == "GPU"


@pytest.mark.parametrize("recipe", build.RECIPES)
def test_each_notebook_runs_headless_on_cpu_and_plots_its_training(recipe, kit, tmp_path):
    notebook = nbformat.read(ROOT / "notebooks" / f"{recipe}.ipynb", as_version=4)
    output_dir = tmp_path / "run"
    # papermill's convention: the values for this run go in a cell right after the one tagged "parameters"
    parameters = next(i for i, cell in enumerate(notebook.cells) if "parameters" in cell.metadata.get("tags", []))
    argv = ["--config", str(kit / CONFIGS[recipe]), "--output_dir", str(output_dir)]
    notebook.cells.insert(parameters + 1, nbformat.v4.new_code_cell(f"NOTEBOOK_ARGS = {argv!r}"))
    NotebookClient(notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()

    assert (output_dir / rewards.PLOT_FILE).stat().st_size > 10_000
    last = notebook.cells[-1].outputs
    assert any("image/png" in output.get("data", {}) for output in last), "the plot was not displayed"
    printed = "".join(output.get("text", "") for output in last)
    if recipe != "sft_warmstart":  # an RL run also shows completions of its last step with their rewards
        assert "completion 1 of the last step" in printed and ("correctness_reward" in printed or "match" in printed)


def test_plot_training_draws_every_reward_component_the_total_and_the_length(tmp_path):
    history = [{"step": s, "loss": 0.1, "reward": s / 10, "completions/mean_length": 30 - s,
                "rewards/correctness_reward/mean": s / 20, "rewards/strict_format_reward/mean": 0.5} for s in (1, 2, 3)]
    history.append({"step": 3, "eval_reward": 0.2, "eval_rewards/correctness_reward/mean": 0.1})
    path = rewards.plot_training(history, tmp_path / "curves.png")
    assert path.read_bytes().startswith(b"\x89PNG") and path.stat().st_size > 10_000
    sft = rewards.plot_training([{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.0}], tmp_path / "sft.png")
    assert sft.stat().st_size > 5_000


@pytest.mark.parametrize("recipe", build.RECIPES)
def test_on_colab_the_t4_defaults_go_first_are_printed_and_parse(recipe, monkeypatch, capsys):
    import importlib

    module = importlib.import_module(recipe)
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))  # what Colab's runtime imports
    argv = gsm8k_grpo.notebook_argv(["--max_steps", "7"], module.COLAB_ARGS)
    assert argv == module.COLAB_ARGS + ["--max_steps", "7"] and "T4-sized defaults" in capsys.readouterr().out
    config = module.RecipeSFTConfig if recipe == "sft_warmstart" else module.RecipeGRPOConfig
    parser = TrlParser((module.ScriptArguments, config, ModelConfig))
    parser.set_defaults_with_config(**module.RECIPE_DEFAULTS)
    _, training_args, model_args = parser.parse_args_and_config(argv)  # the batch checks pass on the T4 defaults
    assert training_args.max_steps == 7 and model_args.use_peft  # the notebook's own flags win
    if recipe != "sft_warmstart":
        assert "0.5B" in model_args.model_name_or_path


def test_outside_colab_the_notebook_flags_are_used_as_they_are():
    assert gsm8k_grpo.notebook_argv(["--max_steps", "7"], gsm8k_grpo.COLAB_ARGS) == ["--max_steps", "7"]
