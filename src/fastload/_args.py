"""Deprecation shims for public signatures (one release of grace, then gone).

fastload's public constructors and functions take their source(s) and ``out`` by
position and everything else by keyword. Calls written against the older
signatures keep working for one release through these decorators, with a
:class:`DeprecationWarning` that says what to write instead; ``inspect.signature``
of a decorated function shows the new signature (``functools.wraps`` sets
``__wrapped__``), so the documentation and the argument table show only that.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["changing_default", "keyword_only", "moved_names", "renamed_keyword"]

F = TypeVar("F", bound=Callable[..., Any])


def keyword_only(*names: str) -> Callable[[F], F]:
    """Mark ``names`` (the parameters that used to follow the positional ones, in
    their old order) as keyword-only, still accepting them by position for one
    release with a :class:`DeprecationWarning`.

    The decorated function must declare ``names`` keyword-only. Too many positional
    arguments, or one given both ways, is a :class:`TypeError` as Python's own.
    """

    def decorate(fn: F) -> F:
        params = list(inspect.signature(fn).parameters.values())
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        keyword = {p.name for p in params if p.kind is p.KEYWORD_ONLY}
        missing = [n for n in names if n not in keyword]
        if missing:
            raise TypeError(f"{fn.__qualname__}: {missing} are not keyword-only parameters")
        n_pos = len(positional)
        shown = n_pos - (1 if positional and positional[0].name in ("self", "cls") else 0)
        qualname = fn.__qualname__.removesuffix(".__init__")
        is_init = fn.__name__ == "__init__"

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if len(args) > n_pos:
                # a subclass inheriting the constructor is named as itself
                called = type(args[0]).__name__ if is_init else qualname
                extra = args[n_pos:]
                if len(extra) > len(names):
                    raise TypeError(
                        f"{called}() takes {shown} positional argument"
                        f"{'s' if shown != 1 else ''} but {len(args) - n_pos + shown} were given"
                    )
                moved = names[: len(extra)]
                for name, value in zip(moved, extra, strict=True):
                    if name in kwargs:
                        raise TypeError(f"{called}() got multiple values for argument {name!r}")
                    kwargs[name] = value
                spelled = ", ".join(f"{n}=..." for n in moved)
                warnings.warn(
                    f"{called}(): passing {', '.join(moved)} by position is deprecated and "
                    f"stops working in the next release; write {spelled}",
                    DeprecationWarning,
                    stacklevel=2,
                )
                args = args[:n_pos]
            return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


def renamed_keyword(old: str, new: str) -> Callable[[F], F]:
    """Accept the keyword ``old`` as ``new`` for one release, with a
    :class:`DeprecationWarning`; both at once is a :class:`TypeError`."""

    def decorate(fn: F) -> F:
        if new not in inspect.signature(fn).parameters:
            raise TypeError(f"{fn.__qualname__} has no parameter {new!r}")
        qualname = fn.__qualname__.removesuffix(".__init__")

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if old in kwargs:
                if new in kwargs:
                    raise TypeError(f"{qualname}() got both {old!r} and {new!r}; pass {new!r}")
                warnings.warn(
                    f"{qualname}(): {old}= is deprecated and stops working in the next "
                    f"release; write {new}=",
                    DeprecationWarning,
                    stacklevel=2,
                )
                kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


def changing_default(
    where: str, name: str, old: Any, new: Any, why: str, stacklevel: int = 3
) -> Any:
    """The value of a parameter left at ``None`` whose default changes from ``old`` to
    ``new`` in the next release: ``old``, with a :class:`DeprecationWarning` saying so
    and what to pass to keep either. ``stacklevel`` as :func:`warnings.warn`'s, counted
    from the function calling this one (3: the caller of that function; one more per
    decorator between)."""
    warnings.warn(
        f"{where}(): {name}'s default becomes {new!r} in the next release ({why}); pass "
        f"{name}={old!r} to keep today's behaviour, or {name}={new!r}",
        DeprecationWarning,
        stacklevel=stacklevel,
    )
    return old


def moved_names(
    module: str, names: list[str], new: str
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for a module whose public ``names`` moved to the
    module ``new``: each still resolves, lazily (PEP 562: the old module imports
    nothing of the new one, which may sit in a higher layer), with a
    :class:`DeprecationWarning` naming the new import, for one release."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(
            f"{module}.{name} moved to {new}; write `from {new} import {name}` "
            f"(the old path stops working in the next release)",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(new), name)

    def __dir__() -> list[str]:
        return list(names)

    return __getattr__, __dir__
