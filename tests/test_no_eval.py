"""No reward runs model text as code in the trainer's process, read from the sources: every call that runs a string
(eval, exec, compile, sympy's parsers, math-verify's parse and verify) and every import of a library that evaluates
strings (sympy, math-verify, latex2sympy, numexpr) in what a user runs and in the package is one of the places listed
here, each of which runs in a child process or runs no model text. A new one fails until it is placed and listed.
(The reasoning-gym tasks' own scorers, which do call sympy, run in the sandbox: tests/test_reasoning_gym_grpo.py
checks the offered tasks with an audit hook and walks each of them with hostile answers.)"""

import ast

from conftest import ROOT

RUNS_STRINGS = {"eval", "exec", "compile", "sympify", "parse_expr", "parse_latex", "parse", "verify", "S"}
EVALUATING_LIBRARIES = {"sympy", "math_verify", "latex2sympy2_extended", "numexpr"}
SAFE = {("re", "compile"), ("ast", "parse"), ("ast", "literal_eval")}  # a pattern; a tree, never run; literals only
ALLOWED = {  # (file, function) -> where it runs, and on what
    ("grpo_recipes/zygote.py", "_warm_up"): "the sandbox's zygote: the recipe's own warm-up code",
    ("grpo_recipes/zygote.py", "_fork_session"): "a confined, forked child of the sandbox",
    ("grpo_recipes/zygote.py", "_execute"): "a confined, forked child of the sandbox",
    ("grpo_recipes/math_verify_process.py", "read_whole"): "math-verify's child process, killed past its timeout",
    ("grpo_recipes/math_verify_process.py", "serve"): "math-verify's child process, killed past its timeout",
    ("offline.py", "code_problem"): "the kit's own reference solutions, no model text",
}


def places() -> set[tuple[str, str]]:
    """(file, enclosing function) of each call that runs a string and each import of an evaluating library."""
    found = set()
    for path in sorted([*ROOT.glob("*.py"), *(ROOT / "grpo_recipes").glob("*.py")]):
        tree = ast.parse(path.read_text())
        function = {}  # node -> the name of the innermost function around it (ast.walk meets the outer ones first)
        for outer in ast.walk(tree):
            if isinstance(outer, ast.FunctionDef | ast.AsyncFunctionDef):
                function.update({node: outer.name for node in ast.walk(outer) if node is not outer})
        for node in ast.walk(tree):
            where = (str(path.relative_to(ROOT)), function.get(node, "<module>"))
            if isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
                owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
                if name in RUNS_STRINGS and (owner, name) not in SAFE:
                    found.add(where)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                modules = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                if any(module.split(".")[0] in EVALUATING_LIBRARIES for module in modules):
                    found.add(where)
    return found


def test_model_text_is_run_as_code_only_in_child_processes():
    unlisted = places() - set(ALLOWED)
    assert not unlisted, (f"{sorted(unlisted)} run a string or import a library that evaluates strings: run it where "
                          "the answer cannot reach the trainer (the sandbox, a child process) and list it in ALLOWED")
    assert set(ALLOWED) <= places(), "ALLOWED lists a place that no longer runs strings: take it out"
