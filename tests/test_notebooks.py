"""notebooks/: generated from the scripts, identical to what notebooks/build.py writes, and runnable headless on CPU
from the .ipynb alone, in an empty folder, as on Colab with no clone."""

import hashlib
import re
import sys

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

import plumbing
from conftest import ROOT

sys.path.insert(0, str(ROOT / "notebooks"))
import build  # noqa: E402  (notebooks/build.py)

CONFIGS = {"gsm8k_grpo": "gsm8k_grpo.yaml", "tool_use_grpo": "tool_use_grpo.yaml",
           "search_agent_grpo": "search_agent_grpo.yaml", "code_grpo": "code_grpo.yaml",
           "sft_warmstart": "sft_warmstart.yaml"}
# What each notebook must carry: the modules its code imports, and what those import in turn.
CARRIED = {"gsm8k_grpo": ["plumbing.py", "preflight.py", "rewards.py"],
           "tool_use_grpo": ["plumbing.py", "preflight.py", "rewards.py", "sandbox.py"],
           "search_agent_grpo": ["plumbing.py", "preflight.py", "rewards.py"],
           "code_grpo": ["plumbing.py", "preflight.py", "rewards.py", "sandbox.py"],
           "sft_warmstart": ["code_grpo.py", "gsm8k_grpo.py", "harness.py", "plumbing.py", "preflight.py", "rewards.py",
                             "sandbox.py", "search_agent_grpo.py", "tool_use_grpo.py"]}
# What each notebook's install cell must name: the packages its modules import, and no other.
INSTALLED = {"gsm8k_grpo": {"trl", "math-verify"}, "tool_use_grpo": {"trl", "math-verify", "landlockpy"},
             "search_agent_grpo": {"trl", "math-verify", "bm25s"}, "code_grpo": {"trl", "math-verify", "landlockpy"},
             "sft_warmstart": {"trl", "bm25s", "landlockpy"}}


def written_files(notebook) -> list[str]:
    return [cell.source.split("\n", 1)[0].split()[1] for cell in notebook.cells
            if cell.cell_type == "code" and cell.source.startswith("%%writefile")]


def with_arguments(notebook, argv: list[str]):
    """papermill's convention: the values for this run go in a cell right after the one tagged "parameters"."""
    parameters = next(i for i, cell in enumerate(notebook.cells) if "parameters" in cell.metadata.get("tags", []))
    notebook.cells.insert(parameters + 1, nbformat.v4.new_code_cell(f"NOTEBOOK_ARGS = {argv!r}"))
    return notebook


@pytest.mark.parametrize("recipe", build.RECIPES)
def test_each_committed_notebook_is_exactly_what_its_script_generates(recipe):
    committed = (ROOT / "notebooks" / f"{recipe}.ipynb").read_text()
    assert committed == build.render(recipe), f"notebooks/{recipe}.ipynb is stale: run `python notebooks/build.py`"


@pytest.mark.parametrize("recipe", build.RECIPES)
def test_each_notebook_carries_the_current_source_of_every_module_it_imports(recipe):
    notebook = build.build(recipe)
    assert written_files(notebook) == CARRIED[recipe]
    for cell in notebook.cells:
        if cell.source.startswith("%%writefile"):
            name, text = cell.source.split("\n", 1)[0].split()[1], cell.source.split("\n", 1)[1]
            assert text == (ROOT / name).read_text()
            assert cell.metadata["jupyter"]["source_hidden"] and cell.metadata["cellView"] == "form"  # collapsed


def test_notebooks_carry_the_scripts_text_the_setup_and_no_script_entry_point():
    notebook = build.build("gsm8k_grpo")
    sources = [cell.source for cell in notebook.cells]
    assert notebook.cells[0].cell_type == "markdown" and sources[0].startswith("# gsm8k_grpo.py: GRPO on GSM8K")
    assert "What to expect." in sources[0] and "not yet timed on a T4" in sources[0] and "0.5B" in sources[0]
    assert sources[1].startswith("## Set-up") and "`rewards.py`" in sources[1] and "notebooks/build.py" in sources[1]
    install = next(s for s in sources if s.startswith("%pip install"))
    assert sources.index(install) == sources.index(next(s for s in sources if s.startswith("%%writefile rewards.py"))) + 1
    assert "'trl>=1.16,<1.17'" in install and "-r requirements.txt" not in install
    assert "[serving]" not in install and "tokenizers" not in install and "bm25s" not in install  # nothing it never imports
    assert any(s.startswith("plumbing.try_model(trainer") for s in sources) and "## Try it" in sources[-2]
    assert not any("git clone" in s for s in sources)  # no repository to fetch: the notebook carries what it needs
    assert any("## Rewards" in s and "farm" in s for s in sources)  # the script's markdown cells, as text
    assert any(s.startswith("REWARD_FUNCS, REWARD_WEIGHTS") or "\nREWARD_FUNCS, REWARD_WEIGHTS" in s for s in sources)
    assert not any('if __name__ == "__main__"' in s for s in sources)
    assert notebook.metadata["colab"]["gpuType"] == "T4" and notebook.metadata["accelerator"] == "GPU"


# These two run as a Colab user would: google.colab imported and the config cell edited in place (model, LoRA learning
# rate, completion length), NOTEBOOK_ARGS naming only the data and a short CPU run; the edits must be what runs.
AS_COLAB_USER = {"gsm8k_grpo": "tiny-qwen2", "tool_use_grpo": "tiny-qwen2-tools"}


def edit_config_cell_on_colab(notebook, model) -> list[str]:
    """The config cell edited as a user would, google.colab imported first; the flags for a short CPU run."""
    config = next(cell for cell in notebook.cells if cell.source.startswith("# In a notebook on Colab"))
    edited = re.sub(r"^MODEL_NAME = .*$", f"MODEL_NAME = {str(model)!r}", config.source, flags=re.M)
    edited = re.sub(r"(\"?lora_learning_rate\"?[=:] ?)[^,\n]*", r"\g<1>3e-4", edited)
    edited = re.sub(r"(\"?max_completion_length\"?[=:] ?)[^,\n]*", r"\g<1>24", edited)
    assert edited.count("3e-4") == 1 and edited != config.source
    config.source = edited
    notebook.cells.insert(0, nbformat.v4.new_code_cell(  # what Colab's runtime has imported: google.colab, with a spec
        "import importlib.machinery, sys, types\n"
        "sys.modules['google.colab'] = colab = types.ModuleType('google.colab')\n"
        "colab.__spec__ = importlib.machinery.ModuleSpec('google.colab', None)"))
    notebook.cells.append(nbformat.v4.new_code_cell(
        "assert ON_COLAB and trainer.args.learning_rate == 3e-4 and trainer.args.max_completion_length == 24\n"
        f"assert trainer.model.base_model.model.name_or_path == {str(model)!r}"))
    return ["--dataset_path", "offline/gsm8k_toy", "--use_cpu", "--max_steps", "2", "--report_to", "none"]


@pytest.mark.parametrize("recipe", build.RECIPES)
def test_each_notebook_runs_headless_on_cpu_from_an_empty_folder_and_plots_its_training(recipe, request, tmp_path):
    kit = request.getfixturevalue("code_kit" if recipe == "code_grpo" else "kit")
    folder = tmp_path / "empty"
    folder.mkdir()
    (folder / f"{recipe}.ipynb").write_bytes((ROOT / "notebooks" / f"{recipe}.ipynb").read_bytes())
    (folder / "offline").symlink_to(kit)  # the only other thing in the folder: the offline kit
    notebook = nbformat.read(folder / f"{recipe}.ipynb", as_version=4)
    if recipe in AS_COLAB_USER:
        argv = edit_config_cell_on_colab(notebook, kit / AS_COLAB_USER[recipe])
    else:
        argv = ["--config", f"offline/{CONFIGS[recipe]}"]
    notebook = with_arguments(notebook, [*argv, "--output_dir", "run"])
    # The modules came from the folder's copies, not from this repository (which is not on the kernel's path).
    notebook.cells.append(nbformat.v4.new_code_cell(
        "import pathlib, rewards, plumbing\n"
        "assert {pathlib.Path(m.__file__).parent for m in (rewards, plumbing)} == {pathlib.Path.cwd()}"))
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(folder)}}).execute()

    for name in CARRIED[recipe]:
        assert (folder / name).read_bytes() == (ROOT / name).read_bytes()
    assert (folder / "run" / plumbing.PLOT_FILE).stat().st_size > 10_000
    shown = next(cell for cell in notebook.cells if "\nplumbing.show_training(" in cell.source)
    last = shown.outputs
    assert any("image/png" in output.get("data", {}) for output in last), "the plot was not displayed"
    printed = "".join(output.get("text", "") for output in last)
    if recipe != "sft_warmstart":  # an RL run also shows completions of its last step with their rewards
        assert "completion 1 of the last step" in printed and (any(name in printed for name in ("correctness_reward", "match", "tests_passed")))
    installing = next(cell for cell in notebook.cells if "%pip install" in cell.source)
    assert "Successfully installed" not in "".join(o.get("text", "") for o in installing.outputs)  # all were there
    if recipe != "sft_warmstart":  # the last cell: the trained model on held-out prompts, with their rewards
        tried = "".join(o.get("text", "") for o in next(
            c for c in notebook.cells if c.source.startswith("plumbing.try_model(")).outputs)
        assert "held-out total reward" in tried and "completion 1 on a held-out prompt" in tried
    if recipe in AS_COLAB_USER:  # the config cell's edits, in the run's own log line (and the kernel's asserts)
        run = next(cell for cell in notebook.cells if cell.source.startswith("trainer = main("))
        logged = "".join(o.get("text", "") for o in run.outputs)
        assert f"model {kit / AS_COLAB_USER[recipe]} | LoRA r=16 | learning_rate 0.0003 (lora_learning_rate" in logged
        assert "max_completion_length 24 | max_steps 2" in logged


def test_a_notebook_never_overwrites_a_file_someone_edited(tmp_path):
    edited = b"# my own rubric\n"
    (tmp_path / "rewards.py").write_bytes(edited)
    notebook = build.build("gsm8k_grpo")
    guard = next(i for i, cell in enumerate(notebook.cells) if "COPIES = {" in cell.source)
    notebook.cells = notebook.cells[:guard + 2]  # up to the first file it would write
    with pytest.raises(CellExecutionError, match="rewards.py here differ"):
        NotebookClient(notebook, timeout=60, kernel_name="python3",
                       resources={"metadata": {"path": str(tmp_path)}}).execute()
    assert (tmp_path / "rewards.py").read_bytes() == edited
    copies = notebook.cells[guard].source
    assert hashlib.sha256((ROOT / "rewards.py").read_bytes()).hexdigest() in copies
