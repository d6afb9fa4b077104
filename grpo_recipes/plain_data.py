"""Inside the sandbox: what crosses between a function and its tests (function_tester.py) as plain data. A value is
encoded to JSON from exact types only (None, bool, int, float, complex, str, bytes; lists, tuples, sets, frozensets
and dicts of them; the standard library's Counter, defaultdict, OrderedDict, Fraction and Decimal; numpy's numbers
and arrays of numbers, booleans or strings), and decoded from JSON into those types only: no object of the
candidate's crosses, nothing is unpickled. An exception crosses as its name and message.

This module runs inside the sandbox (the function tester's sandboxes preload it): it imports only the standard library.
"""

import builtins
import collections
import decimal
import fractions
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
_MAPPINGS = {dict: "dict", collections.Counter: "counter", collections.defaultdict: "defaultdict",
             collections.OrderedDict: "ordereddict"}  # a defaultdict crosses without its factory
_NUMPY_KINDS = "biufcU"  # numpy arrays of booleans, integers, floats, complex numbers or strings


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
    if kind in _MAPPINGS:
        return {"t": _MAPPINGS[kind], "v": [[encode_plain(k, budget, _depth + 1), encode_plain(v, budget, _depth + 1)]
                                            for k, v in value.items()]}
    if kind is fractions.Fraction:
        return {"t": "fraction", "v": [encode_plain(value.numerator, budget), encode_plain(value.denominator, budget)]}
    if kind is decimal.Decimal:
        return {"t": "decimal", "v": str(value)}
    if kind is bytes:
        return {"t": "bytes", "v": value.hex()}
    if kind is complex:
        return {"t": "complex", "v": [value.real, value.imag]}
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.generic) and kind.__module__ == "numpy":
        item = value.item()
        if type(item) in (bool, int, float, complex, str, bytes):
            return encode_plain(item, budget, _depth)
    if numpy is not None and kind is numpy.ndarray and value.dtype.kind in _NUMPY_KINDS:
        budget[0] -= value.size
        if budget[0] < 0:
            raise TypeError(f"the value is bigger than {_PLAIN_ITEMS} items")
        return {"t": "ndarray", "dtype": value.dtype.str, "shape": list(value.shape),
                "v": encode_plain(value.ravel().tolist(), [_PLAIN_ITEMS], _depth + 1)}
    raise TypeError(f"a {kind.__name__} is not plain data (None, bool, int, float, complex, str, bytes, lists, "
                    "tuples, sets and dicts of them, Counter, defaultdict, OrderedDict, Fraction, Decimal, numpy "
                    "numbers and arrays)")


def decode_plain(data, _depth: int = 0):
    """The value encode_plain encoded, rebuilt from builtins only; anything else raises ValueError."""
    if _depth > _PLAIN_DEPTH:
        raise ValueError("too deep")
    if data is None or type(data) in (bool, int, float, str):
        return data
    if type(data) is list:
        return [decode_plain(item, _depth + 1) for item in data]
    if type(data) is dict and set(data) == {"t", "dtype", "shape", "v"} and data["t"] == "ndarray":
        return _decode_array(data)
    if type(data) is dict and set(data) == {"t", "v"}:
        return _decode_tagged(data["t"], data["v"], _depth)
    raise ValueError("not plain data")


def _decode_tagged(tag, items, depth: int):  # noqa: C901 - a branch per tagged type
    if tag in ("tuple", "set", "frozenset") and type(items) is list:
        kind = {"tuple": tuple, "set": set, "frozenset": frozenset}[tag]
        return kind(decode_plain(item, depth + 1) for item in items)
    if tag in _MAPPING_TYPES and type(items) is list and all(type(pair) is list and len(pair) == 2 for pair in items):
        pairs = {decode_plain(k, depth + 1): decode_plain(v, depth + 1) for k, v in items}
        return collections.defaultdict(None, pairs) if tag == "defaultdict" else _MAPPING_TYPES[tag](pairs)
    if tag == "fraction" and type(items) is list and len(items) == 2 and all(type(x) is int for x in items):
        return fractions.Fraction(*items)
    if tag == "decimal" and type(items) is str and len(items) < 5000:
        return decimal.Decimal(items)
    if tag == "bytes" and type(items) is str:
        return bytes.fromhex(items)
    if tag == "complex" and type(items) is list and len(items) == 2 and all(type(x) is float for x in items):
        return complex(*items)
    raise ValueError("not plain data")


_MAPPING_TYPES = {tag: kind for kind, tag in _MAPPINGS.items()}


def _decode_array(data: dict):
    """A numpy array of numbers, booleans or strings (numpy is imported here only when one crosses)."""
    import numpy

    dtype, shape, items = numpy.dtype(data["dtype"]), data["shape"], data["v"]
    if dtype.kind not in _NUMPY_KINDS or type(shape) is not list or not all(type(n) is int and n >= 0 for n in shape) \
            or type(items) is not list:
        raise ValueError("not plain data")
    return numpy.array([decode_plain(item, 1) for item in items], dtype=dtype).reshape(shape)


def error_line(err: BaseException) -> str:
    """An exception's last line, at most 300 characters, never raising."""
    try:
        return traceback.format_exception_only(type(err), err)[-1].strip()[:300]
    except BaseException:  # noqa: BLE001 - a hostile __str__
        return type(err).__name__
