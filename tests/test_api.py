"""The public API refuses what it cannot honour.

Over every public constructor and function (the callables of ``fastload.__all__`` and
``fastload.convert.__all__``, and ``fastload.dali``'s):

* the signature ``inspect.signature`` shows is explicit: no ``*args``/``**kwargs``
  (``DataLoader`` forwards torch's own keywords, which torch checks);
* a misspelt keyword is a ``TypeError`` naming it, raised before any I/O (the source
  given does not exist, so any read would fail otherwise, and nothing is written);
* the datasets, converters and the DALI pipeline take only their source(s) and
  ``out`` by position; what used to follow them by position still works for one
  release, with a ``DeprecationWarning`` naming what to write.

Known exceptions are listed in :data:`KNOWN` with the reason, and run as strict
``xfail``: when one is fixed the test says so, and the entry must go.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import fastload
import fastload.convert
import fastload.dali
import fastload.errors

#: The error classes are exceptions: they take a message (and what it concerns) like
#: any ``Exception``, are raised rather than configured, and some keep
#: ``BaseException``'s own ``*args`` signature; they are out of this test's scope.
ERRORS = set(fastload.errors.__all__)

#: (test, public name) -> why it fails today. Strict xfail: remove the entry when fixed.
KNOWN: dict[tuple[str, str], str] = {}

#: Parameters allowed by position: the sources and ``out``.
SOURCES = ("url", "dataset", "images", "annotations", "root", "sources", "out")
#: Public callables that keep more positional parameters, and why (not failures).
POSITIONAL_BY_DESIGN = {
    "DataLoader": "a drop-in for torch.utils.data.DataLoader: torch's positional order",
    # the torchvision drop-ins keep torchvision's positional order after the source
    # (``url`` stands where torchvision has ``root``/``annFile``): recipes call them so
    "CocoDetection": "torchvision.datasets.CocoDetection's order after the source",
    "Cityscapes": "torchvision.datasets.Cityscapes's order after the source",
    "ImageFolder": "torchvision.datasets.ImageFolder's order after the source",
}
#: What the drop-ins take by position: torchvision's parameters, in its order.
TORCHVISION_ORDER = {
    "CocoDetection": ["url", "transform", "target_transform", "transforms"],
    "Cityscapes": [
        "url",
        "split",
        "mode",
        "target_type",
        "transform",
        "target_transform",
        "transforms",
    ],
    "ImageFolder": ["url", "transform", "target_transform"],
}
#: The one ``**kwargs`` allowed, and why.
FORWARDS = {"DataLoader": "torch_kwargs"}  # torch's own keywords, which torch checks

BAD = "cache_dri"  # cache_dir, misspelt


def _public() -> dict[str, Callable[..., Any]]:
    found: dict[str, Callable[..., Any]] = {}
    for name in fastload.__all__:
        if name in ERRORS or name == "__version__":
            continue
        obj = getattr(fastload, name)
        if callable(obj) and not inspect.ismodule(obj):
            found[name] = obj
    for name in fastload.convert.__all__:
        obj = getattr(fastload.convert, name)
        if name in ERRORS or inspect.ismodule(obj) or not callable(obj):
            continue
        found[f"convert.{name}"] = obj
    for name in fastload.dali.__all__:
        found[f"dali.{name}"] = getattr(fastload.dali, name)
    return found


PUBLIC = _public()
# the datasets, converters and DALI pipeline: what the positional convention covers
CONVENTION = sorted(
    name
    for name, obj in PUBLIC.items()
    if name not in POSITIONAL_BY_DESIGN
    and (
        name.startswith("dali.")
        or (name.startswith("convert.") and inspect.isfunction(obj))
        or (
            not name.startswith("convert.")  # the converters' reports are results
            and getattr(obj, "__module__", "").startswith(("fastload.datasets", "fastload.text"))
            and (inspect.isfunction(obj) or inspect.isclass(obj))
        )
    )
)


def _cases(test: str, names: list[str]) -> list[Any]:
    out = []
    for name in names:
        reason = KNOWN.get((test, name))
        marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
        out.append(pytest.param(name, id=name, marks=marks))
    return out


def test_the_lists_cover_what_they_should() -> None:
    for name in ("ShardedDataset", "StreamingDataset", "CocoDetection", "cached", "DataLoader"):
        assert name in PUBLIC
    for name in ("convert.coco", "convert.cityscapes", "convert.folder", "dali.pipeline"):
        assert name in PUBLIC
        assert name in CONVENTION
    assert "DataLoader" not in CONVENTION
    assert {name for _, name in KNOWN} <= set(PUBLIC)  # no stale entry


@pytest.mark.parametrize("name", _cases("explicit", sorted(PUBLIC)))
def test_signature_is_explicit(name: str) -> None:
    params = inspect.signature(PUBLIC[name]).parameters.values()
    hidden = [p.name for p in params if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    allowed = [FORWARDS[name]] if name in FORWARDS else []
    assert hidden == allowed, f"{name} hides its signature behind {hidden}"


def _argument(name: str, where: Path) -> Any:
    """A value for a required parameter: paths that do not exist, small stand-ins."""
    if name in ("dataset",):
        return [0, 1, 2]
    if name in ("batch_size", "seq_len"):
        return 4
    if name in ("shards", "fields"):
        return ()
    if name == "buffer":
        return b""
    if name == "value":
        return "1KB"
    if name in ("transform", "target_transform", "transforms"):
        return None  # a path there is a TypeError (torchvision's call shape)
    return str(where / name)


@pytest.mark.parametrize("name", _cases("misspelt", sorted(PUBLIC)))
def test_a_misspelt_keyword_is_a_type_error_before_any_io(name: str, tmp_path: Path) -> None:
    where = tmp_path / "missing"  # every path argument lies under it; nothing may appear
    fn = PUBLIC[name]
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for p in inspect.signature(fn).parameters.values():
        if p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.kind is p.KEYWORD_ONLY:
            kwargs[p.name] = _argument(p.name, where)
        else:
            args.append(_argument(p.name, where))
    kwargs[BAD] = 1
    with pytest.raises(TypeError, match=rf"\b{BAD}\b"):
        fn(*args, **kwargs)
    assert not where.exists()


@pytest.mark.parametrize("name", _cases("sources", CONVENTION))
def test_only_the_sources_are_positional(name: str) -> None:
    params = inspect.signature(PUBLIC[name]).parameters.values()
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    extra = [n for n in positional if n not in SOURCES]
    assert not extra, f"{name} takes {extra} by position"
    assert not [p.name for p in params if p.kind is p.VAR_POSITIONAL]


def test_positional_by_design_is_what_it_says() -> None:
    assert set(POSITIONAL_BY_DESIGN) <= set(PUBLIC)
    assert not set(POSITIONAL_BY_DESIGN) & set(CONVENTION)
    for name, order in TORCHVISION_ORDER.items():
        params = inspect.signature(PUBLIC[name]).parameters.values()
        positional = [
            p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        assert positional == order, name


# (public name, sources given, the old positional argument after them, its value)
OLD_CALLS = [
    ("ShardedDataset", 1, "cache_dir", "CACHE"),
    ("StreamingDataset", 1, "shuffle", False),
    ("CocoDetection", 4, "cache_dir", "CACHE"),
    ("Cityscapes", 7, "cache_dir", "CACHE"),
    ("ImageFolder", 3, "cache_dir", "CACHE"),
    ("cached", 1, "cache_dir", "CACHE"),
    ("convert.coco", 3, "shard_size", "1MB"),
    ("convert.cityscapes", 2, "split", "val"),
    ("convert.folder", 2, "shard_size", "1MB"),
    ("dali.pipeline", 1, "batch_size", 4),
    ("dali.DaliPipeline", 1, "batch_size", 4),
]


@pytest.mark.parametrize(("name", "n", "old", "value"), OLD_CALLS, ids=[c[0] for c in OLD_CALLS])
def test_the_old_positional_call_still_works_with_a_warning(
    name: str, n: int, old: str, value: Any, tmp_path: Path
) -> None:
    fn = PUBLIC[name]
    sources = [
        _argument(p, tmp_path / "missing") for p in list(inspect.signature(fn).parameters)[:n]
    ]
    if name == "cached":
        sources = [[0, 1, 2]]
    if value == "CACHE":
        value = str(tmp_path / "cache")
    with (
        pytest.warns(DeprecationWarning, match=rf"passing {old}\b.*write {old}=\.\.\."),
        contextlib.suppress(fastload.FastloadError),  # the missing source, after the shim
    ):
        fn(*sources, value)


def test_the_pipeline_function_and_class_take_the_same_arguments() -> None:
    from fastload.dali._pipeline import DaliPipeline

    def shown(fn: Callable[..., Any]) -> list[tuple[str, Any, Any]]:
        params = inspect.signature(fn).parameters.values()
        return [(p.name, p.kind, p.default) for p in params if p.name != "self"]

    assert shown(fastload.dali.pipeline) == shown(DaliPipeline)


def test_the_new_spelling_warns_nothing(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        ds = fastload.cached([0, 1, 2], cache_dir=tmp_path / "c")
        assert ds[1] == 1
