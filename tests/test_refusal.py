"""grpo_recipes/refusal.py: library code raises one error for a refusal, and only an entry point exits: read from the
tree (a test), and seen from a script (the line and the exit status) and from a notebook (the line, no traceback)."""

import ast
import subprocess
import sys

import pytest

from conftest import ROOT

TREE = [path for folder in (ROOT, ROOT / "grpo_recipes", ROOT / "experiments", ROOT / "benchmarks",
                            ROOT / "notebooks") for path in sorted(folder.glob("*.py"))]
ENTRY = ("grpo_recipes/refusal.py", "run_script")  # the one place a Refusal becomes an exit


def exits_outside_entry_points(source: str, path: str = "") -> list[int]:
    """Lines that call sys.exit, exit or quit, or raise SystemExit, outside an `if __name__ == "__main__":` block
    (and run_script)."""
    tree = ast.parse(source)
    main_blocks = [node for node in tree.body if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)]
    allowed = {id(n) for block in main_blocks for n in ast.walk(block)}
    allowed |= {id(n) for node in tree.body if isinstance(node, ast.FunctionDef) and (path, node.name) == ENTRY
                for n in ast.walk(node)}
    found = []
    for node in ast.walk(tree):
        if id(node) in allowed:
            continue
        calls_exit = isinstance(node, ast.Call) and ast.unparse(node.func) in ("sys.exit", "exit", "quit")
        raises_exit = isinstance(node, ast.Raise) and node.exc is not None and "SystemExit" in ast.unparse(node.exc)
        if calls_exit or raises_exit:
            found.append(node.lineno)
    return found


@pytest.mark.parametrize("path", TREE, ids=lambda path: str(path.relative_to(ROOT)))
def test_nothing_exits_outside_an_entry_point(path):
    relative = str(path.relative_to(ROOT))
    assert exits_outside_entry_points(path.read_text(), relative) == [], f"{relative}: raise a Refusal instead"


def test_the_tree_check_finds_every_way_of_exiting():
    for source in ("import sys\ndef f():\n    sys.exit('no')", "def f():\n    raise SystemExit(1)", "exit(1)",
                   "class C:\n    def m(self):\n        quit()"):
        assert exits_outside_entry_points(source), source
    assert exits_outside_entry_points("import sys\nif __name__ == '__main__':\n    sys.exit(main())") == []


SCRIPT = """
import sys
sys.path.insert(0, sys.argv[1])
from grpo_recipes.refusal import Refusal, run_script

def main(code):
    raise Refusal("the one line that names the fix" if code else "help text", exit_code=code)

run_script(main, int(sys.argv[2]))
"""


def test_a_script_ends_a_refusal_with_its_line_and_its_exit_status():
    refused = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT), "1"], capture_output=True, text=True)
    assert (refused.returncode, refused.stdout, refused.stderr) == (1, "", "the one line that names the fix\n")
    interrupted = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT), "130"], capture_output=True, text=True)
    assert interrupted.returncode == 130 and interrupted.stderr == "the one line that names the fix\n"
    helped = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT), "0"], capture_output=True, text=True)
    assert (helped.returncode, helped.stdout, helped.stderr) == (0, "help text\n", "")
