"""A stable digest of a dataset object's state: what :func:`fastload.cached` keys by.

Pure: walks the object (its attributes, containers, arrays, the code of its
callables) and hashes a canonical encoding, so two datasets built with the same
arguments get the same digest in every process and every run (no ``id``, no
``repr`` with addresses, no set order), and a changed argument changes it. What
cannot be hashed canonically (open files, locks, sockets, C objects without state)
is named in the returned list so the caller can warn; the walk is bounded.
"""

from __future__ import annotations

import hashlib
import os
import types
from typing import Any

import numpy as np

__all__ = ["MAX_NODES", "fingerprint"]

#: The most objects one walk visits; past it the rest is reported, not hashed.
MAX_NODES = 1_000_000
_SCALARS = (type(None), bool, int, float, complex)


class _Walk:
    def __init__(self, max_nodes: int) -> None:
        self.h = hashlib.sha256()
        self.left = max_nodes
        self.problems: list[str] = []
        self.active: set[int] = set()

    def tag(self, kind: bytes, payload: bytes = b"") -> None:
        self.h.update(kind + len(payload).to_bytes(8, "little") + payload)

    def feed(self, obj: Any, path: str) -> None:
        self.left -= 1
        if self.left < 0:
            if self.left == -1:
                self.problems.append(f"{path}: the object has too many parts to fingerprint")
            return
        if isinstance(obj, _SCALARS):
            self.tag(b"v", f"{type(obj).__name__}:{obj!r}".encode())
        elif isinstance(obj, str):
            self.tag(b"s", obj.encode("utf-8", "surrogatepass"))
        elif isinstance(obj, (bytes, bytearray, memoryview)):
            self.tag(b"b", bytes(obj))
        elif isinstance(obj, os.PathLike):
            self.tag(b"p", os.fsencode(obj))
        elif isinstance(obj, np.ndarray):
            self.tag(b"a", f"{obj.dtype.str}{obj.shape}".encode())
            if obj.dtype.hasobject:
                self.feed(obj.tolist(), path)
            else:
                self.tag(b"d", np.ascontiguousarray(obj).tobytes())
        elif isinstance(
            obj, (types.FunctionType, types.MethodType, type, types.BuiltinFunctionType)
        ):
            self.callable(obj, path)
        else:
            self.container(obj, path)

    def callable(self, obj: Any, path: str) -> None:
        name = f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"
        self.tag(b"f", name.encode())
        if isinstance(obj, types.MethodType):
            self.feed(obj.__self__, f"{path}.__self__")
        code = getattr(obj, "__code__", None)
        if code is not None:
            # a lambda's or a local function's behaviour is its code and constants
            self.tag(b"c", code.co_code)
            self.feed([c for c in code.co_consts if not isinstance(c, types.CodeType)], path)
            for i, cell in enumerate(getattr(obj, "__closure__", None) or ()):
                try:
                    value = cell.cell_contents
                except ValueError:  # an empty cell
                    continue
                self.feed(value, f"{path}.<closure {i}>")
            self.feed(getattr(obj, "__defaults__", None), f"{path}.__defaults__")

    def container(self, obj: Any, path: str) -> None:
        if id(obj) in self.active:
            self.tag(b"r")  # a cycle: the shape is enough
            return
        self.active.add(id(obj))
        try:
            self._container(obj, path)
        finally:
            self.active.discard(id(obj))

    def _container(self, obj: Any, path: str) -> None:
        if isinstance(obj, (list, tuple)):
            self.tag(b"l", f"{type(obj).__name__}:{len(obj)}".encode())
            for i, v in enumerate(obj):
                self.feed(v, f"{path}[{i}]")
        elif isinstance(obj, dict):
            self.tag(b"m", f"{type(obj).__name__}:{len(obj)}".encode())
            for k, v in sorted(obj.items(), key=lambda kv: self.digest(kv[0])):
                self.feed(k, f"{path}.<key>")
                self.feed(v, f"{path}[{k!r}]")
        elif isinstance(obj, (set, frozenset)):
            self.tag(b"e", f"{type(obj).__name__}:{len(obj)}".encode())
            for d in sorted(self.digest(v) for v in obj):
                self.tag(b"x", d)
        elif hasattr(obj, "__array__") and not hasattr(obj, "__dict__"):
            try:
                self.feed(np.asarray(obj), path)
            except Exception:
                self.problems.append(f"{path}: {type(obj).__qualname__} cannot be read as an array")
        else:
            self.instance(obj, path)

    def instance(self, obj: Any, path: str) -> None:
        cls = type(obj)
        self.tag(b"o", f"{cls.__module__}.{cls.__qualname__}".encode())
        state: dict[str, Any] = {}
        if hasattr(obj, "__dict__"):
            state.update(vars(obj))
        for klass in cls.__mro__:
            for slot in getattr(klass, "__slots__", ()):
                skip = not isinstance(slot, str) or slot in ("__dict__", "__weakref__")
                if not skip and hasattr(obj, slot):
                    state[slot] = getattr(obj, slot)
        if not state:
            # C state (functools.partial, datetime, ...) shows in how it pickles; a file,
            # a lock, a socket or a connection does not pickle: nothing canonical there
            try:
                reduced = obj.__reduce_ex__(4)
            except Exception:
                self.problems.append(f"{path}: {cls.__module__}.{cls.__qualname__}")
                return
            if isinstance(reduced, tuple):
                self.feed(list(reduced[1:3]), f"{path}.<state>")
            return
        for k in sorted(state):
            self.tag(b"k", k.encode())
            self.feed(state[k], f"{path}.{k}")

    def digest(self, obj: Any) -> bytes:
        sub = _Walk(max(self.left, 0))
        sub.active = self.active
        sub.feed(obj, "<key>")
        self.left = sub.left
        self.problems.extend(sub.problems)
        return sub.h.digest()


def fingerprint(obj: Any, max_nodes: int = MAX_NODES) -> tuple[str, list[str]]:
    """Return ``(hex digest, problems)`` for ``obj``'s state.

    An object with a ``fastload_fingerprint()`` method is represented by what it
    returns. ``problems`` names each part (``dataset.handle: _io.BufferedReader``)
    that was not hashed: a change there does not change the digest.
    """
    own = getattr(obj, "fastload_fingerprint", None)
    if callable(own):
        obj = ("fastload_fingerprint", own())
    walk = _Walk(max_nodes)
    walk.feed(obj, "dataset")
    return walk.h.hexdigest(), walk.problems
