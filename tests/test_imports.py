"""The house's import rules, read from the sources: a recipe can be forked alone, and forking it changes no other.

A recipe imports the standard library, third-party libraries, rewards.py, plumbing.py and (tool_use_grpo.py only)
sandbox.py, never another recipe; rewards.py imports nothing of ours; plumbing.py only rewards.py and its pre-flight
checks (preflight.py). The harness (evaluate.py, sft_warmstart.py, offline.py, experiments/, benchmarks/,
notebooks/build.py) may import recipes, through harness.py's contract. The notebook-only cells of a recipe
(commented out in the script) are read too, since they run in its notebook.
"""

import ast

import jupytext
import pytest

from conftest import ROOT

RECIPES = ["gsm8k_grpo", "tool_use_grpo", "search_agent_grpo"]
OURS = {path.stem for path in ROOT.glob("*.py")}
ALLOWED = {"gsm8k_grpo": {"rewards", "plumbing"}, "tool_use_grpo": {"rewards", "plumbing", "sandbox"},
           "search_agent_grpo": {"rewards", "plumbing"}, "rewards": set(), "plumbing": {"rewards", "preflight"},
           "preflight": {"rewards"}, "sandbox": set(), "harness": set()}


def imported_modules(source: str) -> set[str]:
    """Top-level names of every module a source imports, at any depth (functions included), plus dynamic imports."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add("." if node.level else node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in {
                "import_module", "__import__"}:
            names.add("<dynamic import>")
    return names


def notebook_code(module: str) -> str:
    """The script's code as its notebook runs it: the `active-ipynb` cells uncommented, magics left out."""
    notebook = jupytext.read(ROOT / f"{module}.py", fmt="py:percent")
    return "\n".join(line for cell in notebook.cells if cell.cell_type == "code"
                     for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))


@pytest.mark.parametrize("module", sorted(ALLOWED))
def test_each_shared_module_and_recipe_imports_only_what_the_house_allows(module):
    imported = imported_modules((ROOT / f"{module}.py").read_text())
    if module in RECIPES:
        imported |= imported_modules(notebook_code(module))
    ours = imported & OURS
    assert ours <= ALLOWED[module], f"{module}.py imports {sorted(ours - ALLOWED[module])}"
    assert "." not in imported, f"{module}.py imports relatively"
    if module in RECIPES:  # a computed name could be another recipe (sandbox.py preloads libraries this way)
        assert "<dynamic import>" not in imported, f"{module}.py imports a module by a computed name"


def test_the_rule_catches_a_recipe_importing_another_one():
    # The checker itself: each way of importing a recipe is seen, including inside a function.
    for source in ("import tool_use_grpo", "from gsm8k_grpo import arg", "def f():\n    from gsm8k_grpo import x",
                   "import importlib\nimportlib.import_module('gsm8k_grpo')"):
        found = imported_modules(source)
        assert found & set(RECIPES) or "<dynamic import>" in found



SHARING = RECIPES + ["sft_warmstart"]  # the scripts that plumbing.py serves (and their notebooks' cells)


def plumbing_names_used(source: str) -> set[str]:
    """The names a source takes from plumbing: `plumbing.X` and `from plumbing import X`."""
    used = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "plumbing":
            used.add(node.attr)
        elif isinstance(node, ast.ImportFrom) and node.module == "plumbing":
            used |= {alias.name for alias in node.names}
    return used


def test_plumbing_holds_only_what_several_recipes_use_or_its_own_shared_functions_call():
    tree = ast.parse((ROOT / "plumbing.py").read_text())
    defined = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    defined |= {target.id for node in tree.body if isinstance(node, ast.Assign) for target in node.targets
                if isinstance(target, ast.Name)}
    # A name plumbing itself uses (outside its own definition) serves every caller of that function.
    internal = {name for node in tree.body for name in
                {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} - {getattr(node, "name", None)}}
    users = {name: [m for m in SHARING if name in plumbing_names_used(notebook_code(m))] for name in defined}
    lonely = {name: who for name, who in users.items() if name not in internal and len(who) < 2}
    assert not lonely, f"plumbing.py names that one script alone uses (move them into it): {lonely}"


def test_the_plumbing_rule_catches_a_name_one_recipe_uses():
    assert plumbing_names_used("import plumbing\nplumbing.bm25_index(x)\nfrom plumbing import arg") == {
        "bm25_index", "arg"}
