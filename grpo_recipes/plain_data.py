"""Inside the sandbox: what crosses between a function and its tests (function_tester.py) as plain data. A value is
encoded to JSON from exact builtin types only (None, bool, int, float, complex, str, bytes, and lists, tuples, sets,
frozensets and dicts of them), and decoded from JSON into those builtins only: no object of the candidate's crosses,
nothing is unpickled. An exception crosses as its name and message.

This module runs inside the sandbox (the function tester's sandboxes preload it): it imports only the standard library.
"""

import builtins
import sys
import traceback


class CandidateError(Exception):
    """In a test: the candidate raised something other than a builtin exception, exited, crashed or timed out."""


def candidate_exception(name, message: str) -> Exception:
    """The exception a test sees for one the candidate raised (its name and message are all that cross)."""
    kind = getattr(builtins, name, None) if isinstance(name, str) else None
    if isinstance(kind, type) and issubclass(kind, Exception) and kind not in (StopIteration, StopAsyncIteration):
        try:
            return kind(message)
        except Exception:  # noqa: BLE001 - e.g. UnicodeDecodeError wants five arguments
            pass
    return CandidateError(f"{name}: {message}")


_PLAIN_DEPTH, _PLAIN_ITEMS = 100, 200_000
_TAGGED = {tuple: "tuple", set: "set", frozenset: "frozenset"}


def encode_plain(value, _budget: list | None = None, _depth: int = 0):  # noqa: C901 - a branch per plain type
    """A JSON-ready copy of plain data, exact types only (a subclass of int or str could bring its own __eq__);
    numpy scalars become the Python numbers they equal. Anything else raises TypeError."""
    budget = [_PLAIN_ITEMS] if _budget is None else _budget
    budget[0] -= 1
    if budget[0] < 0 or _depth > _PLAIN_DEPTH:
        raise TypeError(f"the value is bigger than {_PLAIN_ITEMS} items or deeper than {_PLAIN_DEPTH} levels")
    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        if kind is int and abs(value) > 10**4000:
            raise TypeError("an integer over 4000 digits")
        return value
    if kind is list:
        return [encode_plain(item, budget, _depth + 1) for item in value]
    if kind in _TAGGED:
        return {"t": _TAGGED[kind], "v": [encode_plain(item, budget, _depth + 1) for item in value]}
    if kind is dict:
        return {"t": "dict", "v": [[encode_plain(k, budget, _depth + 1), encode_plain(v, budget, _depth + 1)]
                                   for k, v in value.items()]}
    if kind is bytes:
        return {"t": "bytes", "v": value.hex()}
    if kind is complex:
        return {"t": "complex", "v": [value.real, value.imag]}
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.generic) and kind.__module__ == "numpy":
        item = value.item()
        if type(item) in (bool, int, float, complex, str, bytes):
            return encode_plain(item, budget, _depth)
    raise TypeError(f"a {kind.__name__} is not plain data (None, bool, int, float, complex, str, bytes, or lists, "
                    "tuples, sets and dicts of them)")


def decode_plain(data, _depth: int = 0):
    """The value encode_plain encoded, rebuilt from builtins only; anything else raises ValueError."""
    if _depth > _PLAIN_DEPTH:
        raise ValueError("too deep")
    if data is None or type(data) in (bool, int, float, str):
        return data
    if type(data) is list:
        return [decode_plain(item, _depth + 1) for item in data]
    if type(data) is dict and set(data) == {"t", "v"}:
        tag, items = data["t"], data["v"]
        if tag in ("tuple", "set", "frozenset") and type(items) is list:
            return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](
                decode_plain(item, _depth + 1) for item in items)
        if tag == "dict" and type(items) is list and all(type(pair) is list and len(pair) == 2 for pair in items):
            return {decode_plain(k, _depth + 1): decode_plain(v, _depth + 1) for k, v in items}
        if tag == "bytes" and type(items) is str:
            return bytes.fromhex(items)
        if tag == "complex" and type(items) is list and len(items) == 2 and all(type(x) is float for x in items):
            return complex(*items)
    raise ValueError("not plain data")


def error_line(err: BaseException) -> str:
    """An exception's last line, at most 300 characters, never raising."""
    try:
        return traceback.format_exception_only(type(err), err)[-1].strip()[:300]
    except BaseException:  # noqa: BLE001 - a hostile __str__
        return type(err).__name__
