"""Expressions the policy writes, read without running them: a grammar that admits only what a task asks for, and a
bound on the size of every intermediate result, estimated from the digits alone (nothing is computed to check it).

    tree = arithmetic.admit("6*(67 - 3) + 43", ("+", "-", "*", "/"))  # an ast.Expression, or NotAllowed
    arithmetic.evaluate(tree)                                        # 427, every step within MAX_DIGITS

The MCP example server's calculator evaluates with it, and reasoning-gym's expression tasks (gym_scorer.py) admit an
answer through it before their scorer, which parses it with sympy's eval, sees it.
"""

import ast
import math
import operator

MAX_DIGITS = 1000  # no intermediate result beyond 10**1000: 9**9**9 or (((9**64)**64)**64)**64 is refused unread
MAX_CHARS = 20_000  # a longer expression is refused before it is parsed (golds reach 10,000)
MAX_EXPONENT = 10_000  # the largest exponent of a power with a symbol in its base (x**10000)

BINARY = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**"}
UNARY = {ast.USub: "-", ast.UAdd: "+"}
FUNCTIONS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
             ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow, ast.USub: operator.neg,
             ast.UAdd: operator.pos}


class NotAllowed(ValueError):
    """The text is not an expression of the grammar asked for, or a step of it would be too large."""


def admit(text: str, operators: tuple[str, ...] = ("+", "-", "*", "/"), names: frozenset | set = frozenset(),
          functions: frozenset | set = frozenset(), integers_only: bool = False) -> ast.Expression:
    """The expression `text` as a tree, if it holds only numbers (finite; whole ones where `integers_only`), the
    `names`, calls of the `functions` by name, parentheses and the `operators` (of + - * / // % **; + and - also as
    signs); and if no numeric step can exceed 10**MAX_DIGITS. Raises NotAllowed saying why."""
    if not isinstance(text, str) or len(text) > MAX_CHARS:
        raise NotAllowed(f"an expression of at most {MAX_CHARS} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        raise NotAllowed(f"not an expression ({type(err).__name__})") from None
    try:
        _digits(tree.body, set(operators), set(names), set(functions), integers_only)
    except RecursionError:
        raise NotAllowed("nested too deeply") from None
    return tree


def _digits(node: ast.AST, operators: set, names: set, functions: set, integers_only: bool) -> float | None:
    """An upper bound on log10 of the node's magnitude where it is a number; None where a name is in it."""
    if isinstance(node, ast.Constant):
        value = node.value
        if type(value) is not int and (integers_only or type(value) is not float):
            raise NotAllowed(f"{ast.unparse(node)} is not a {'whole ' if integers_only else ''}number")
        if not math.isfinite(value):
            raise NotAllowed(f"{value} is not a finite number")
        return _log10(value)
    if isinstance(node, ast.Name):
        if node.id not in names:
            raise NotAllowed(f"the name {node.id!r} is not part of this answer's form")
        return None
    if isinstance(node, ast.UnaryOp) and UNARY.get(type(node.op)) in operators:
        return _digits(node.operand, operators, names, functions, integers_only)
    if isinstance(node, ast.BinOp) and BINARY.get(type(node.op)) in operators:
        left = _digits(node.left, operators, names, functions, integers_only)
        right = _digits(node.right, operators, names, functions, integers_only)
        return _combine(type(node.op), left, right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in functions \
            and not node.keywords and node.args and not any(isinstance(a, ast.Starred) for a in node.args):
        for argument in node.args:
            _digits(argument, operators, names, functions, integers_only)
        return None  # a function's value is no number this bound follows
    raise NotAllowed(f"{ast.unparse(node)[:60]!r} is not part of this answer's form")


def _log10(value: int | float) -> float:
    if isinstance(value, int):
        return len(str(abs(value))) if abs(value) > 1 else 0.0  # exact, without a float for huge integers
    return abs(math.log10(abs(value))) + 1 if value else 0.0  # 1e-300 counts too: 1 / 1e-300 is 1e300


def _combine(op: type, left: float | None, right: float | None) -> float | None:
    """The bound of `left op right` (None: a name is in it), refusing a step beyond MAX_DIGITS."""
    if op is ast.Pow:
        if right is None:
            return None  # 2**x: sympy keeps it symbolic
        if right > math.log10(MAX_EXPONENT) + 1:
            raise NotAllowed(f"an exponent above {MAX_EXPONENT}")
        exponent = 10 ** right
        if left is None:
            return None
        digits = max(left, 1.0) * exponent
    elif left is None or right is None:
        return None
    elif op in (ast.Mult, ast.Div, ast.FloorDiv):
        digits = left + right  # |a / b| for a rational b = p/q is at most |a| * |q|
    else:
        digits = max(left, right) + 1
    if digits > MAX_DIGITS:
        raise NotAllowed(f"a step of it would exceed 10**{MAX_DIGITS}")
    return digits


def evaluate(tree: ast.Expression) -> int | float:
    """The value of an admitted tree of numbers and operators (no names or calls), in Python's arithmetic."""
    def value(node):
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.UnaryOp):
            return FUNCTIONS[type(node.op)](value(node.operand))
        if isinstance(node, ast.BinOp):
            return FUNCTIONS[type(node.op)](value(node.left), value(node.right))
        raise NotAllowed(f"{ast.unparse(node)!r} has no value here")

    return value(tree.body)
