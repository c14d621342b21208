"""The deprecation shims of public signatures (fastload._args)."""

from __future__ import annotations

import inspect
import warnings

import pytest

from fastload._args import keyword_only, renamed_keyword


class Thing:
    @keyword_only("cache_dir", "cache_limit")
    def __init__(self, url: str, *, cache_dir: str | None = None, cache_limit: int = 0) -> None:
        self.args = (url, cache_dir, cache_limit)


@renamed_keyword("field", "text_field")
def convert(src: str, *, text_field: str = "text") -> str:
    return text_field


def test_the_new_spelling_warns_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Thing("u", cache_dir="d").args == ("u", "d", 0)
        assert convert("s", text_field="body") == "body"


def test_the_old_positional_call_still_works_with_a_deprecation_warning() -> None:
    with pytest.warns(DeprecationWarning, match=r"Thing\(\): passing cache_dir, cache_limit"):
        assert Thing("u", "d", 5).args == ("u", "d", 5)
    with pytest.warns(DeprecationWarning, match="write cache_dir=..."):
        assert Thing("u", "d").args == ("u", "d", 0)


def test_misuse_is_a_type_error_as_pythons_own() -> None:
    with pytest.raises(TypeError, match=r"takes 1 positional argument but 4 were given"):
        Thing("u", "d", 5, 6)
    with pytest.raises(TypeError, match="multiple values for argument 'cache_dir'"):
        Thing("u", "d", cache_dir="e")
    with pytest.raises(TypeError, match="unexpected keyword argument 'cache_dri'"):
        Thing("u", cache_dri="d")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="got both 'field' and 'text_field'"):
        convert("s", field="a", text_field="b")


def test_the_renamed_keyword_still_works_with_a_deprecation_warning() -> None:
    with pytest.warns(DeprecationWarning, match=r"convert\(\): field= is deprecated"):
        assert convert("s", field="body") == "body"  # type: ignore[call-arg]


def test_the_signature_shown_is_the_new_one() -> None:
    sig = inspect.signature(Thing)
    assert [p.kind for p in sig.parameters.values()][1:] == [inspect.Parameter.KEYWORD_ONLY] * 2
    assert list(inspect.signature(convert).parameters) == ["src", "text_field"]


def test_a_decorator_naming_a_positional_parameter_is_refused() -> None:
    with pytest.raises(TypeError, match="not keyword-only"):

        @keyword_only("b")
        def f(a: int, b: int) -> None: ...


class SubThing(Thing):
    """Inherits Thing's constructor, signature and shim."""


def test_a_subclass_inheriting_the_constructor_is_named_as_itself() -> None:
    with pytest.warns(DeprecationWarning, match=r"^SubThing\(\): passing cache_dir by position"):
        assert SubThing("u", "d").args == ("u", "d", 0)
    with pytest.raises(TypeError, match=r"^SubThing\(\) takes 1 positional argument"):
        SubThing("u", "d", 1, 2)
