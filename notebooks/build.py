"""Regenerate every notebook from its recipe script:  python notebooks/build.py

The scripts are the source: their `# %%` cells become notebook cells, `# %% [markdown]` comments become text, and
cells tagged `active-ipynb` (commented out in the script: the run-and-plot cells) become code, and cells tagged
`active-py` (the script's `if __name__ == "__main__"`) are left out. One Colab set-up cell, the same for every
notebook, is added after the introduction. tests/test_notebooks.py fails when a
committed notebook differs from what this writes, and runs each one on CPU with the offline kit.
"""

import re
from pathlib import Path

import jupytext
import nbformat

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ["gsm8k_grpo", "tool_use_grpo", "search_agent_grpo", "sft_warmstart"]
# Colab opens the notebook on a GPU runtime (the free T4) instead of asking the user to switch.
# Every notebook's first code cell: on Colab, fetch the recipes (they import rewards.py) and install their requirements.
REPO_URL = "https://github.com/grpo-recipes/grpo-recipes"
COLAB_SETUP = f"""# On Colab: fetch the recipes, install their requirements. Elsewhere: run this in a clone.
import sys
if "google.colab" in sys.modules:
    !git clone --depth 1 {REPO_URL}
    !pip install -q -r grpo-recipes/requirements.txt
    %cd grpo-recipes"""
METADATA = {"accelerator": "GPU", "colab": {"gpuType": "T4", "provenance": []},
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"}}


def docstring_as_markdown(docstring: str, recipe: str) -> str:
    """The module docstring as the notebook's introduction: a title, its text, and its commands as code blocks."""
    title, *paragraphs = docstring.strip().strip('"').strip().split("\n\n")
    parts = [f"# {recipe}.py: {title}"]
    for paragraph in paragraphs:
        is_commands = any(re.search(r"\bpython \S+\.py", line) for line in paragraph.splitlines())
        parts.append(f"```\n{paragraph}\n```" if is_commands else paragraph)
    return "\n\n".join(parts)


def build(recipe: str) -> nbformat.NotebookNode:
    notebook = jupytext.read(ROOT / f"{recipe}.py", fmt="py:percent")
    notebook.cells[0] = nbformat.v4.new_markdown_cell(docstring_as_markdown(notebook.cells[0].source, recipe))
    notebook.cells = [cell for cell in notebook.cells if "active-py" not in cell.metadata.get("tags", [])]
    notebook.cells.insert(1, nbformat.v4.new_code_cell(COLAB_SETUP))
    for i, cell in enumerate(notebook.cells):
        cell.id = f"{recipe}-{i}"  # stable ids, so a rebuild of an unchanged script is byte-identical
        cell.metadata.pop("lines_to_next_cell", None)
        cell.source = cell.source.strip("\n")
    notebook.metadata = METADATA
    return notebook


def render(recipe: str) -> str:
    return nbformat.writes(build(recipe)) + "\n"


def main() -> None:
    for recipe in RECIPES:
        path = ROOT / "notebooks" / f"{recipe}.ipynb"
        path.write_text(render(recipe))
        print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
