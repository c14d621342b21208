"""Import torchvision on machines whose torchvision wheel does not match the CPU torch.

The registry's torchvision wheel links CUDA libraries that the CPU torch wheel these
machines carry lacks, so its C++ extension fails to load and ``import torchvision`` dies
on ``RuntimeError: operator torchvision::nms does not exist`` (torchvision registers a
fake kernel for an operator its extension never defined). ``transformers`` imports
torchvision whenever it is installed, so the same failure breaks ``transformers`` and
``peft`` too.

``install()``, called before torchvision is first imported:

- defines the two operators torchvision's detection models call, ``torchvision::nms``
  (greedy non-maximum suppression) and ``torchvision::roi_align``, with CPU kernels
  written in torch (the second as a composite of ``grid_sample``, so autograd derives
  its backward);
- after the import, tells torchvision its ops exist and replaces its pure-Python
  ``roi_align`` fallback (which needs more than 14 GB for one Mask R-CNN step) by the
  ``grid_sample`` version. It follows torchvision's C++ kernel (a sample point more than
  one pixel outside the feature map counts as zero, where the Python fallback clamps it)
  and matches the fallback to ~1e-14 in float64 for boxes inside the map.

``register()`` only hooks the import (nothing is imported until torchvision is), which is
what ``tests/support/site/sitecustomize.py`` does in every child process of the suite.

Only the test suite and the benchmarks use this; fastload itself never imports it. Where
the wheel matches (torchvision's extension loads), ``install()`` does nothing.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from typing import Any

_INSTALLED = False
_LIB: Any = None  # keeps the torch.library.Library (and its definitions) alive


def _nms(boxes: Any, scores: Any, iou_threshold: float) -> Any:
    import torch

    if boxes.numel() == 0:
        return torch.empty((0,), dtype=torch.int64, device=boxes.device)
    order = torch.argsort(scores, descending=True, stable=True)
    b = boxes[order]
    x1, y1, x2, y2 = b.unbind(1)
    areas = (x2 - x1) * (y2 - y1)
    suppressed = torch.zeros(len(order), dtype=torch.bool)
    keep = []
    for i in range(len(order)):
        if suppressed[i]:
            continue
        keep.append(int(order[i]))
        xx1 = torch.maximum(x1[i], x1[i + 1 :])
        yy1 = torch.maximum(y1[i], y1[i + 1 :])
        xx2 = torch.minimum(x2[i], x2[i + 1 :])
        yy2 = torch.minimum(y2[i], y2[i + 1 :])
        inter = (xx2 - xx1).clamp(min=0) * (yy2 - yy1).clamp(min=0)
        iou = inter / (areas[i] + areas[i + 1 :] - inter)
        suppressed[i + 1 :] |= iou > iou_threshold
    return torch.tensor(keep, dtype=torch.int64, device=boxes.device)


def roi_align_grid(
    input: Any,
    rois: Any,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
    sampling_ratio: int,
    aligned: bool,
) -> Any:
    """torchvision's ``roi_align`` (fixed ``sampling_ratio``) as ``grid_sample`` per image."""
    import torch
    import torch.nn.functional as F

    n, c, h, w = input.shape
    k = rois.shape[0]
    ph, pw, sr = int(pooled_height), int(pooled_width), int(sampling_ratio)
    out = input.new_zeros((k, c, ph, pw))
    if k == 0:
        return out
    off = 0.5 if aligned else 0.0
    x1 = rois[:, 1] * spatial_scale - off
    y1 = rois[:, 2] * spatial_scale - off
    rw = rois[:, 3] * spatial_scale - off - x1
    rh = rois[:, 4] * spatial_scale - off - y1
    if not aligned:
        rw = rw.clamp(min=1.0)
        rh = rh.clamp(min=1.0)
    jy = (torch.arange(ph * sr, dtype=input.dtype, device=input.device) + 0.5) / sr
    jx = (torch.arange(pw * sr, dtype=input.dtype, device=input.device) + 0.5) / sr
    ys = y1[:, None] + jy[None, :] * (rh / ph)[:, None]  # [K, PH*SR]
    xs = x1[:, None] + jx[None, :] * (rw / pw)[:, None]  # [K, PW*SR]
    batch = rois[:, 0].long()
    pieces = []
    for img in range(n):
        sel = (batch == img).nonzero().flatten()
        if sel.numel() == 0:
            continue
        yk, xk = ys[sel], xs[sel]
        inside = ((yk >= -1.0) & (yk <= h))[:, :, None] & ((xk >= -1.0) & (xk <= w))[:, None, :]
        gy = yk.clamp(0, h - 1) / max(h - 1, 1) * 2 - 1
        gx = xk.clamp(0, w - 1) / max(w - 1, 1) * 2 - 1
        kn = sel.numel()
        grid = torch.stack(
            torch.broadcast_tensors(gx[:, None, :], gy[:, :, None]), dim=-1
        )  # [Kn, PH*SR, PW*SR, 2], (x, y)
        grid = grid.reshape(1, kn * ph * sr, pw * sr, 2)
        sampled = F.grid_sample(
            input[img : img + 1], grid, mode="bilinear", padding_mode="border", align_corners=True
        )  # [1, C, Kn*PH*SR, PW*SR]
        sampled = sampled.reshape(c, kn, ph * sr, pw * sr).permute(1, 0, 2, 3)
        sampled = sampled * inside[:, None].to(sampled.dtype)
        pooled = sampled.reshape(kn, c, ph, sr, pw, sr).mean(dim=(3, 5))
        pieces.append((sel, pooled))
    for sel, pooled in pieces:
        out = out.index_copy(0, sel, pooled)
    return out


def define_ops() -> None:
    """Define ``torchvision::nms``/``qnms``/``roi_align`` unless torchvision's extension did."""
    global _LIB
    import torch

    try:
        torch.ops.torchvision.nms  # noqa: B018 - defined by a loaded extension (or by us)
        return
    except (AttributeError, RuntimeError):
        pass
    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.impl("nms", _nms, "CPU")
    # torchvision registers a fake kernel for quantized nms at import too
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define(
        "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height,"
        " SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor"
    )
    lib.impl("roi_align", _roi_align_op, "CompositeImplicitAutograd")
    _LIB = lib


def _after_import() -> None:
    ext = sys.modules["torchvision.extension"]
    if ext._has_ops():
        return  # the extension loaded: nothing to replace
    ext._has_ops = lambda: True
    roi_mod = sys.modules["torchvision.ops.roi_align"]  # the module: ops.roi_align is a function
    _SAVED["f"] = roi_mod._roi_align
    roi_mod._roi_align = _roi_align_op


class _Finder:
    """A meta-path hook: the first ``import torchvision`` defines the ops, then patches."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        # asked again until the import happens: importlib.util.find_spec (transformers'
        # availability check) asks without importing
        if name != "torchvision" or name in sys.modules:
            return None
        if importlib.util.find_spec("torch") is None:
            return None
        define_ops()
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            run(module)
            _after_import()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def register() -> None:
    """Arrange for the first ``import torchvision`` to go through the shim (imports nothing)."""
    global _INSTALLED
    if _INSTALLED or "torchvision" in sys.modules:
        return
    _INSTALLED = True
    sys.meta_path.insert(0, _Finder())


def install() -> bool:
    """Import torchvision through the shim now; True when it imports.

    Safe to call any number of times, and where torchvision or torch is absent (False).
    """
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("torchvision") is None:
        return False
    register()
    try:
        import torchvision  # noqa: F401
    except Exception:  # another mismatch: torchvision stays unusable
        return False
    return True


def _roi_align_op(
    input: Any,
    rois: Any,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
    sampling_ratio: int,
    aligned: bool,
) -> Any:
    if sampling_ratio > 0:
        return roi_align_grid(
            input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned
        )
    fallback = _SAVED.get("f")  # torchvision's own Python version (adaptive ratio)
    if fallback is None:
        raise NotImplementedError("roi_align with an adaptive sampling ratio under the shim")
    return fallback(
        input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned
    )


_SAVED: dict[str, Any] = {}
