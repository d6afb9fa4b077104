"""notebooks/: generated from the scripts, identical to what notebooks/build.py writes, and runnable headless on CPU
from the .ipynb alone, in an empty folder, as on Colab with no clone."""

import hashlib
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
           "search_agent_grpo": "search_agent_grpo.yaml", "sft_warmstart": "sft_warmstart.yaml"}
# What each notebook must carry: the modules its code imports, and what those import in turn.
CARRIED = {"gsm8k_grpo": ["plumbing.py", "rewards.py"],
           "tool_use_grpo": ["plumbing.py", "rewards.py", "sandbox.py"],
           "search_agent_grpo": ["plumbing.py", "rewards.py"],
           "sft_warmstart": ["gsm8k_grpo.py", "plumbing.py", "rewards.py", "sandbox.py", "search_agent_grpo.py",
                             "tool_use_grpo.py"]}


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
    assert written_files(notebook) == CARRIED[recipe] + ["requirements.txt"]
    for cell in notebook.cells:
        if cell.source.startswith("%%writefile"):
            name, text = cell.source.split("\n", 1)[0].split()[1], cell.source.split("\n", 1)[1]
            assert text == (ROOT / name).read_text()
            assert cell.metadata["jupyter"]["source_hidden"] and cell.metadata["cellView"] == "form"  # collapsed


def test_notebooks_carry_the_scripts_text_the_setup_and_no_script_entry_point():
    notebook = build.build("gsm8k_grpo")
    sources = [cell.source for cell in notebook.cells]
    assert notebook.cells[0].cell_type == "markdown" and sources[0].startswith("# gsm8k_grpo.py: GRPO on GSM8K")
    assert sources[1].startswith("## Set-up") and "`rewards.py`" in sources[1] and "notebooks/build.py" in sources[1]
    assert "%pip install -q -r requirements.txt" in sources[sources.index(next(
        s for s in sources if s.startswith("%%writefile requirements.txt"))) + 1]
    assert not any("git clone" in s for s in sources)  # no repository to fetch: the notebook carries what it needs
    assert any("## Rewards" in s and "farm" in s for s in sources)  # the script's markdown cells, as text
    assert any(s.startswith("REWARD_FUNCS, REWARD_WEIGHTS") or "\nREWARD_FUNCS, REWARD_WEIGHTS" in s for s in sources)
    assert not any('if __name__ == "__main__"' in s for s in sources)
    assert notebook.metadata["colab"]["gpuType"] == "T4" and notebook.metadata["accelerator"] == "GPU"


@pytest.mark.parametrize("recipe", build.RECIPES)
def test_each_notebook_runs_headless_on_cpu_from_an_empty_folder_and_plots_its_training(recipe, kit, tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    (folder / f"{recipe}.ipynb").write_bytes((ROOT / "notebooks" / f"{recipe}.ipynb").read_bytes())
    (folder / "offline").symlink_to(kit)  # the only other thing in the folder: the offline kit
    notebook = nbformat.read(folder / f"{recipe}.ipynb", as_version=4)
    argv = ["--config", f"offline/{CONFIGS[recipe]}", "--output_dir", "run"]
    notebook = with_arguments(notebook, argv)
    # The modules came from the folder's copies, not from this repository (which is not on the kernel's path).
    notebook.cells.append(nbformat.v4.new_code_cell(
        "import pathlib, rewards, plumbing\n"
        "assert {pathlib.Path(m.__file__).parent for m in (rewards, plumbing)} == {pathlib.Path.cwd()}"))
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(folder)}}).execute()

    for name in CARRIED[recipe] + ["requirements.txt"]:
        assert (folder / name).read_bytes() == (ROOT / name).read_bytes()
    assert (folder / "run" / plumbing.PLOT_FILE).stat().st_size > 10_000
    last = notebook.cells[-2].outputs
    assert any("image/png" in output.get("data", {}) for output in last), "the plot was not displayed"
    printed = "".join(output.get("text", "") for output in last)
    if recipe != "sft_warmstart":  # an RL run also shows completions of its last step with their rewards
        assert "completion 1 of the last step" in printed and ("correctness_reward" in printed or "match" in printed)
    installing = next(cell for cell in notebook.cells if "%pip install" in cell.source)
    assert "every requirement is already installed" in "".join(o.get("text", "") for o in installing.outputs)


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
