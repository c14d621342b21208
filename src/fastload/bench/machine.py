"""Facts about the machine a benchmark ran on: CPU, cores, RAM, disk, software, GPU.

Everything here is best effort: a fact that cannot be found is ``None``, never an
error, so a report can always be written. torch is imported only if installed (for
its version and CUDA); DALI's version is read from package metadata without
importing it.
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from fastload.config import usable_cpus

__all__ = ["cpu_count", "disk_info", "machine_info", "pil_flavour"]


def cpu_count() -> int:
    """CPUs this process may run on (its affinity mask), at least 1
    (:func:`fastload.config.usable_cpus`)."""
    return usable_cpus()


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Hardware", "Processor"):
                    return value.strip() or None
    except OSError:
        pass
    return platform.processor() or None


def _ram_bytes() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        return None


def _mount_of(path: Path) -> tuple[str | None, str | None]:
    """(device, file system type) of the mount holding ``path``, from /proc/mounts."""
    best: tuple[str, str, str] | None = None
    try:
        real = str(path.resolve())
        with open("/proc/mounts", encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                dev, mnt, fstype = parts[0], parts[1], parts[2]
                inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
                if inside and (best is None or len(mnt) > len(best[1])):
                    best = (dev, mnt, fstype)
    except OSError:
        return None, None
    return (best[0], best[2]) if best else (None, None)


def _rotational(device: str | None) -> bool | None:
    if not device or not device.startswith("/dev/"):
        return None
    name = os.path.basename(device)
    for candidate in (name, name.rstrip("0123456789"), name.split("p")[0]):
        p = Path("/sys/block") / candidate / "queue" / "rotational"
        if p.exists():
            try:
                return p.read_text().strip() == "1"
            except OSError:
                return None
    return None


def disk_info(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Where ``path`` lives: ``path``, ``device``, ``fstype``, ``total_bytes``,
    ``free_bytes``, ``rotational`` (None when unknown)."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    device, fstype = _mount_of(p)
    total = free = None
    try:
        usage = shutil.disk_usage(p)
        total, free = int(usage.total), int(usage.free)
    except OSError:
        pass
    return {
        "path": os.fspath(path),
        "device": device,
        "fstype": fstype,
        "total_bytes": total,
        "free_bytes": free,
        "rotational": _rotational(device),
    }


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _torch_facts() -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {"torch": None, "cuda": None}
    cuda: dict[str, Any] | None = None
    try:
        if torch.cuda.is_available():
            cuda = {
                "version": torch.version.cuda,
                "devices": [
                    torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())
                ],
            }
    except Exception:  # a broken driver must not break a report
        cuda = None
    return {"torch": str(torch.__version__), "cuda": cuda}


def _image_backend() -> dict[str, Any] | None:
    try:
        from fastload.decode import backend_info

        return backend_info()
    except Exception:  # Pillow missing: the report says so with None
        return None


def crop_decoder_name() -> str:
    """Which decoder :func:`fastload.decode.decode_crop` runs here: ``"native"``
    (libjpeg-turbo region decode built into ``fastload._native``), else the PIL
    library (``"Pillow"`` or ``"Pillow-SIMD"``), or ``"none"`` without either."""
    from fastload.decode import crop_decoder

    try:
        if crop_decoder() == "native":
            return "native"
    except Exception:  # a bad FASTLOAD_CROP_DECODER must not break a report
        pass
    info = _image_backend()
    return "none" if info is None else str(info["library"])


def pil_flavour(decoder: Any = None) -> dict[str, Any] | None:
    """Which PIL a decode tier ran with: ``library`` (``"Pillow"`` or ``"Pillow-SIMD"``,
    as :func:`fastload.decode.backend_info` tells them apart), ``version``,
    ``libjpeg_turbo``, ``crop_decoder`` (:func:`crop_decoder_name`: what
    ``decode_crop`` and the crop options decode with) and, for a
    :class:`~fastload.decode.Decoder` that resizes
    (possibly wrapped, ``.inner``), ``resizer``: ``"torch"`` where its outputs are
    resized by torch's kernels, else the PIL library's name. None without Pillow."""
    info = _image_backend()
    if info is None:
        return None
    out: dict[str, Any] = {
        "library": info["library"],
        "version": info["version"],
        "libjpeg_turbo": info["libjpeg_turbo"],
        "crop_decoder": crop_decoder_name(),
    }
    from fastload.decode import Decoder

    inner = getattr(decoder, "inner", decoder)
    if isinstance(inner, Decoder) and inner.image is not None and inner.size is not None:
        from fastload.decode.image import _RESAMPLE, _TORCH_MODES, _torch_kernel

        # what the decoder decides per image (resizer "auto": tensors resized by torch's
        # kernels unless Pillow-SIMD is the PIL in use; "torch": tensors and arrays),
        # for its mode and filter
        auto = inner.resizer == "auto" and not info["pillow_simd"]
        wants = (inner.image == "tensor" and (auto or inner.resizer == "torch")) or (
            inner.image == "numpy" and inner.resizer == "torch"
        )
        torch_resizes = (
            wants
            and inner.mode in _TORCH_MODES
            and _torch_kernel(_RESAMPLE.get(inner.resample, -1)) is not None
        )
        out["resizer"] = "torch" if torch_resizes else info["library"]
    return out


def machine_info(cache_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """A JSON-serialisable description of this machine and its software.

    Keys: ``hostname``, ``platform``, ``cpu_model``, ``cores`` (usable),
    ``cores_total``, ``ram_bytes``, ``python``, ``fastload``, ``torch``, ``cuda``
    (None without a GPU), ``dali`` (version or None), ``numpy``, ``s3fs``,
    ``image_backend`` (:func:`fastload.decode.backend_info`) and, when
    ``cache_dir`` is given, ``disk`` (:func:`disk_info`).
    """
    from fastload import __version__

    info: dict[str, Any] = {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu_model": _cpu_model(),
        "cores": cpu_count(),
        "cores_total": os.cpu_count(),
        "ram_bytes": _ram_bytes(),
        "python": sys.version.split()[0],
        "fastload": __version__,
        "numpy": _version("numpy"),
        "s3fs": _version("s3fs"),
        "dali": _version("nvidia-dali-cuda120") or _version("nvidia-dali-cuda110"),
    }
    info.update(_torch_facts())
    info["image_backend"] = _image_backend()
    if cache_dir is not None:
        info["disk"] = disk_info(cache_dir)
    return info
