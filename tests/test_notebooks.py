"""notebooks/: generated from the scripts, identical to what notebooks/build.py writes, and runnable headless on CPU
from the .ipynb alone, in an empty folder, as on Colab with no clone."""

import hashlib
import json
import re
import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from conftest import ROOT, shared_once
from grpo_recipes import contract, kit_judge, logs, sandbox

sys.path.insert(0, str(ROOT / "notebooks"))
import build  # noqa: E402  (notebooks/build.py)

# What importing each script loads of ours, with the files its modules need without importing them (the sandbox's
# zygote imports its own): what its notebook must carry. One interpreter reads every script in turn, each from none
# of ours loaded (third-party modules stay: they never import ours), which is what a fresh interpreter per script
# reads, in one torch import rather than nine.
LOADED = """
import json, sys
sys.path.insert(0, sys.argv[1])
import ast, importlib
root = sys.argv[1].rstrip("/") + "/"
def ours(module):  # a script beside the recipes, or a module of the package (not the .venv's)
    file = getattr(module, "__file__", None) or ""
    return file.startswith(root) and "/" not in file.removeprefix(root).removeprefix("grpo_recipes/")
loaded = {}
for group in sys.argv[2:]:
    for name in [name for name, module in sys.modules.items() if ours(module)]:
        del sys.modules[name]  # each script read as a fresh interpreter would: from nothing of ours
    for name in group.split(","):
        importlib.import_module(name)
    import grpo_recipes.notebook  # the notebook's own cells import it
    done = set()
    while todo := [m for m in list(sys.modules.values()) if ours(m) and m.__name__ not in done]:
        # and what our modules' functions import when they run (a recipe's main() imports the trainer's modules)
        for module in todo:
            done.add(module.__name__)
            for node in ast.walk(ast.parse(open(module.__file__).read())):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("grpo_recipes") \\
                        and not node.level:
                    importlib.import_module(node.module)
                    if node.module == "grpo_recipes":
                        for alias in node.names:
                            importlib.import_module(f"grpo_recipes.{alias.name}")
    files = [m.__file__[len(root):] for m in list(sys.modules.values())
             if (getattr(m, "__file__", None) or "").startswith(root)]
    loaded[group.split(",")[0]] = sorted(f for f in files if "/" not in f or f.startswith("grpo_recipes/"))
print(json.dumps(loaded))
"""


@pytest.fixture(scope="session")
def loaded_files(tmp_path_factory, worker_id) -> dict[str, list[str]]:
    """Each notebook's script: the files of ours that importing it loads (sft_warmstart imports the recipe --recipe
    names when it runs: its notebook carries them all)."""
    def read():
        groups = [",".join([recipe, *(contract.RECIPES if recipe == "sft_warmstart" else [])])
                  for recipe in build.RECIPES]
        proc = subprocess.run([sys.executable, "-c", LOADED, str(ROOT), *groups], capture_output=True, text=True,
                              timeout=600, check=False)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    return shared_once(tmp_path_factory, worker_id, "notebook-imports", read)


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
def test_each_notebook_carries_the_current_source_of_every_module_it_imports_and_no_other(recipe, loaded_files):
    notebook = build.build(recipe)
    loaded = set(loaded_files[recipe]) - {f"{recipe}.py"}
    sandboxed = {f"grpo_recipes/{name}" for name in sandbox.SANDBOX_FILES} if "grpo_recipes/sandbox.py" in loaded \
        else set()
    assert set(written_files(notebook)) == loaded | sandboxed
    assert recipe in ("tool_use_grpo", "code_grpo", "reasoning_gym_grpo", "sft_warmstart") or not sandboxed  # not gsm8k
    for cell in notebook.cells:
        if cell.source.startswith("%%writefile"):
            name, text = cell.source.split("\n", 1)[0].split()[1], cell.source.split("\n", 1)[1]
            assert text == (ROOT / name).read_text()
            assert cell.metadata["jupyter"]["source_hidden"] and cell.metadata["cellView"] == "form"  # collapsed


def test_notebooks_carry_the_scripts_text_the_setup_and_no_script_entry_point():
    notebook = build.build("gsm8k_grpo")
    sources = [cell.source for cell in notebook.cells]
    assert notebook.cells[0].cell_type == "markdown" and sources[0].startswith("# gsm8k_grpo.py: GRPO on GSM8K")
    assert sources[1].startswith("## What to expect") and "not yet timed on a T4" in sources[1] and "0.5B" in sources[1]
    assert sources[2].startswith("## Set-up") and "`rewards.py`" in sources[2] and "notebooks/build.py" in sources[2]
    install = next(s for s in sources if s.startswith("%pip install"))
    rubric = next(s for s in sources if s.startswith("%%writefile rewards.py"))
    assert sources.index(install) == sources.index(rubric) + 1
    assert "'trl>=1.16,<1.17'" in install and "-r requirements.txt" not in install
    # nothing it never imports
    assert "[serving]" not in install and "tokenizers" not in install and "bm25s" not in install
    assert any(s.startswith("notebook.try_model(trainer") for s in sources) and "## Try it" in sources[-2]
    assert not any("git clone" in s for s in sources)  # no repository to fetch: the notebook carries what it needs
    assert any("## Rewards" in s and "farm" in s for s in sources)  # the script's markdown cells, as text
    assert any(s.startswith("REWARD_FUNCS, REWARD_WEIGHTS") or "\nREWARD_FUNCS, REWARD_WEIGHTS" in s for s in sources)
    assert not any('if __name__ == "__main__"' in s for s in sources if not s.startswith("%%writefile"))
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


# The two Colab users' runs in the default suite; the other notebooks' (10-20 s each) with the learning checks, which
# keeps the default suite inside its 10 minutes.
@pytest.mark.parametrize("recipe", [recipe if recipe in AS_COLAB_USER else pytest.param(recipe, marks=pytest.mark.slow)
                                    for recipe in build.RECIPES])
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
        argv = ["--config", f"offline/{recipe}.yaml"]
    if recipe == "judge_grpo":  # the kit's stand-in judge, here on a free port
        judge_server, judge_url = kit_judge.start()
        request.addfinalizer(judge_server.shutdown)
        argv += ["--judge_base_url", judge_url]
    notebook = with_arguments(notebook, [*argv, "--output_dir", "run"])
    # The modules came from the folder's copies, not from this repository (which is not on the kernel's path).
    notebook.cells.append(nbformat.v4.new_code_cell(
        "import pathlib, rewards, grpo_recipes.training\n"
        "assert pathlib.Path(rewards.__file__).parent == pathlib.Path(grpo_recipes.__file__).parent.parent == "
        "pathlib.Path.cwd()"))
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(folder)}}).execute()

    for name in written_files(notebook):
        assert (folder / name).read_bytes() == (ROOT / name).read_bytes()
    assert (folder / "run" / logs.PLOT_FILE).stat().st_size > 10_000
    shown = next(cell for cell in notebook.cells if "\nnotebook.show_training(" in cell.source)
    last = shown.outputs
    assert any("image/png" in output.get("data", {}) for output in last), "the plot was not displayed"
    printed = "".join(output.get("text", "") for output in last)
    if recipe != "sft_warmstart":  # an RL run also shows completions of its last step with their rewards
        assert "completion 1 of the last step" in printed
        assert any(name in printed for name in ("correctness", "match", "tests_passed", "judge", "game_won"))
    installing = next(cell for cell in notebook.cells if "%pip install" in cell.source)
    assert "Successfully installed" not in "".join(o.get("text", "") for o in installing.outputs)  # all were there
    if recipe != "sft_warmstart":  # the last cell: the trained model on held-out prompts, with their rewards
        tried = "".join(o.get("text", "") for o in next(
            c for c in notebook.cells if c.source.startswith("notebook.try_model(")).outputs)
        assert "held-out total reward" in tried and "completion 1 on a held-out prompt" in tried
    if recipe in AS_COLAB_USER:  # the config cell's edits, in the run's own log line (and the kernel's asserts)
        run = next(cell for cell in notebook.cells if "\ntrainer = main(" in cell.source)
        logged = "".join(o.get("text", "") for o in run.outputs)
        assert f"model {kit / AS_COLAB_USER[recipe]} | LoRA r=16 | learning_rate 0.0003 (lora_learning_rate" in logged
        assert "max_completion_length 24 | max_steps 2" in logged


def test_build_never_overwrites_a_notebook_edited_since_it_was_built(tmp_path):
    """A script that changed rebuilds its notebook; a notebook edited or run and saved since is left as it is, in one
    line naming --force, which replaces it."""
    from grpo_recipes.refusal import Refusal

    fork, out = tmp_path / "my_recipe.py", tmp_path / "notebooks"
    fork.write_text((ROOT / "gsm8k_grpo.py").read_text())
    path = out / "my_recipe.ipynb"
    build.main([str(fork), "--out_dir", str(out)])
    fork.write_text(fork.read_text() + "\n# %%\nprint('my change')\n")
    build.main([str(fork), "--out_dir", str(out)])  # not edited since: the script's change reaches it
    assert "print('my change')" in path.read_text() and not build.edited_since_built(path)
    for edit in ("source", "outputs"):
        notebook = nbformat.read(path, as_version=4)
        cell = notebook.cells[-1]
        if edit == "source":
            cell.source += "\n# my note"
        else:
            cell.outputs = [nbformat.v4.new_output("stream", text="my change\n")]
        nbformat.write(notebook, path)
        mine = path.read_bytes()
        with pytest.raises(Refusal, match=r"my_recipe.ipynb: edited since notebooks/build.py wrote it .*--force") as no:
            build.main([str(fork), "--out_dir", str(out)])
        assert "\n" not in str(no.value) and path.read_bytes() == mine
    build.main([str(fork), "--out_dir", str(out), "--force"])
    assert path.read_text() == build.render(str(fork)) and not build.edited_since_built(path)


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


def test_a_notebook_shows_a_refusal_as_its_one_line_not_a_traceback(tmp_path):
    notebook = with_arguments(build.build("gsm8k_grpo"), ["--num_generations", "3"])  # a batch TRL would reject
    notebook.cells = [cell for cell in notebook.cells if not cell.source.startswith("%pip")]  # installed here
    with pytest.raises(CellExecutionError):
        NotebookClient(notebook, timeout=300, kernel_name="python3",
                       resources={"metadata": {"path": str(tmp_path)}}).execute()
    run = next(cell for cell in notebook.cells if "\ntrainer = main(NOTEBOOK_ARGS)" in cell.source)
    assert [(output.output_type, output.get("name"), output.get("text")) for output in run.outputs] == [
        ("stream", "stderr", "per_device_train_batch_size × processes × steps_per_generation = 8 × 1 × 4 is not a "
         "multiple of num_generations=3: pass --per_device_train_batch_size 9 or a smaller --num_generations.\n")]
