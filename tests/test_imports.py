"""The house's import rules, read from the sources: a recipe can be forked alone, and forking it changes no other.

A recipe imports the standard library, third-party libraries, rewards.py and the grpo_recipes package, never another
recipe nor a script; rewards.py imports only the package; the package imports rewards.py and itself, never a recipe
or a script; the files the sandbox's zygote runs import only each other (the sandbox shows it nothing else). The
scripts (evaluate.py, sft_warmstart.py, async_grpo.py, offline.py, experiments/, benchmarks/, notebooks/build.py) may
import recipes, through the contract. The notebook-only cells of a recipe (commented out in the script) are read too,
since they run in its notebook. Every public name the package defines is used somewhere outside the tests.
"""

import ast

import jupytext
import pytest

from conftest import ROOT
from grpo_recipes import contract, sandbox

SCRIPTS = {path.stem for path in ROOT.glob("*.py")} - {"rewards"}  # what a user runs or forks
PACKAGE = ROOT / "grpo_recipes"
MODULES = sorted(path.stem for path in PACKAGE.glob("*.py") if path.stem != "__init__")
SANDBOXED = {name.removesuffix(".py") for name in sandbox.SANDBOX_FILES} - {"__init__"}


def imported_modules(source: str) -> set[str]:
    """Every module a source imports, at any depth (functions included): top-level names, and `grpo_recipes.x` for
    the package's modules; plus dynamic imports."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
            names |= {alias.name for alias in node.names if alias.name.startswith("grpo_recipes.")}
        elif isinstance(node, ast.ImportFrom):
            module = "." if node.level else node.module
            names.add(module.split(".")[0])
            if module == "grpo_recipes":
                names |= {f"grpo_recipes.{alias.name}" for alias in node.names}
            elif module.startswith("grpo_recipes."):
                names.add(module)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in {
                "import_module", "__import__"}:
            names.add("<dynamic import>")
    return names


def notebook_code(module: str) -> str:
    """The script's code as its notebook runs it: the `active-ipynb` cells uncommented, magics left out."""
    notebook = jupytext.read(ROOT / f"{module}.py", fmt="py:percent")
    return "\n".join(line for cell in notebook.cells if cell.cell_type == "code"
                     for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))


@pytest.mark.parametrize("recipe", contract.RECIPES)
def test_a_recipe_imports_only_libraries_rewards_and_the_package(recipe):
    imported = imported_modules((ROOT / f"{recipe}.py").read_text()) | imported_modules(notebook_code(recipe))
    assert not imported & SCRIPTS, f"{recipe}.py imports {sorted(imported & SCRIPTS)}: fork it, don't import it"
    assert "." not in imported, f"{recipe}.py imports relatively"
    assert "<dynamic import>" not in imported, f"{recipe}.py imports a module by a computed name"


def test_the_recipe_list_is_every_recipe_at_the_root():
    found = {path.stem for path in ROOT.glob("*_grpo.py")} - {"async_grpo"}  # async_grpo.py runs a recipe
    assert set(contract.RECIPES) == found, (f"add {sorted(found - set(contract.RECIPES))} to RECIPES in "
                                            "grpo_recipes/contract.py, so that the suite covers it; "
                                            f"remove {sorted(set(contract.RECIPES) - found)}")


@pytest.mark.parametrize("module", ["rewards", *MODULES])
def test_the_library_imports_no_recipe_nor_script(module):
    path = ROOT / "rewards.py" if module == "rewards" else PACKAGE / f"{module}.py"
    imported = imported_modules(path.read_text())
    assert not imported & SCRIPTS, f"{path.name} imports {sorted(imported & SCRIPTS)}"
    if module == "rewards":
        assert {name for name in imported if name.startswith("grpo_recipes.")} <= {"grpo_recipes.answers",
                                                                                   "grpo_recipes.games"}
    if module in SANDBOXED:  # the zygote's files: the sandbox shows it these and nothing else of ours
        ours = {name for name in imported if name.startswith("grpo_recipes.") or name in ("grpo_recipes", "rewards")}
        assert ours <= {f"grpo_recipes.{name}" for name in SANDBOXED} | {"grpo_recipes"}, f"{module}.py imports {ours}"


def test_the_rule_catches_a_recipe_importing_another_one():
    # The checker itself: each way of importing a recipe is seen, including inside a function.
    for source in ("import tool_use_grpo", "from gsm8k_grpo import arg", "def f():\n    from gsm8k_grpo import x",
                   "import importlib\nimportlib.import_module('gsm8k_grpo')"):
        found = imported_modules(source)
        assert found & set(contract.RECIPES) or "<dynamic import>" in found
    assert imported_modules("from grpo_recipes import data, options") >= {"grpo_recipes.data", "grpo_recipes.options"}


def public_names(path) -> set[str]:
    """The functions, classes and constants a module defines at its top level, but the private ones."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return {name for name in names if not name.startswith("_")}


def used_names(source: str) -> set[str]:
    """Every name and attribute a source reads or imports, in its code and in the code it holds as strings (the
    programs it sends a sandbox)."""
    used = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            used.add(node.id)
        elif isinstance(node, ast.Attribute):
            used.add(node.attr)
        elif isinstance(node, ast.ImportFrom):
            used |= {alias.name for alias in node.names}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "\n" in node.value:
            try:
                used |= used_names(node.value)
            except SyntaxError:  # prose
                pass
    return used


def test_every_public_name_of_the_library_is_used_outside_the_tests():
    code = [path for folder in (ROOT, ROOT / "experiments", ROOT / "benchmarks", ROOT / "notebooks", PACKAGE)
            for path in folder.glob("*.py")]
    used = set().union(*(used_names(path.read_text()) for path in code),
                       *(used_names(notebook_code(recipe)) for recipe in [*contract.RECIPES, "sft_warmstart"]))
    unused = {module: sorted(public_names(PACKAGE / f"{module}.py") - used) for module in MODULES}
    assert {module: names for module, names in unused.items() if names} == {}


def test_evaluate_and_every_recipe_load_without_torch_or_trls_trainer():
    """evaluate.py reads a recipe's prompt, data and rubric (and builds its tools) before its first request: none of
    that needs torch, which costs seconds of start-up (benchmarks/bench_evaluate.py)."""
    import subprocess
    import sys

    probe = ("import sys, evaluate\nfrom grpo_recipes import contract\n"
             "for name in contract.RECIPES:\n"
             "    recipe = contract.load_recipe(name)\n"
             "    contract.checked_setup(recipe, recipe.ScriptArguments())\n"
             "heavy = ('torch', 'trl.trainer.grpo_trainer', 'transformers.trainer')\n"
             "print(sorted(module for module in heavy if module in sys.modules))")
    found = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "[]", found.stdout + found.stderr[-2000:]
    helped = subprocess.run([sys.executable, "-X", "importtime", "evaluate.py", "--help"], cwd=ROOT,
                            capture_output=True, text=True, check=True)
    assert "usage: evaluate.py" in helped.stdout
    assert not [line for line in helped.stderr.splitlines() if line.rstrip().endswith(("| torch", "| transformers",
                                                                                       "| datasets"))]
