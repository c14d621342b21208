"""Write the JPEG region decoder's fuzz seeds (generated, never committed): small
JPEGs of every layout it decodes (4:2:0, 4:2:2, 4:4:4, grayscale, progressive,
restart markers, odd sizes, CMYK) and a few cut or damaged ones.

usage: python fuzz/make_jpeg_seeds.py OUT_DIR
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

from PIL import Image

from fastload.convert.synthetic import photo_like


def jpeg(img: Image.Image, **params: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", **params)
    return buf.getvalue()


def main(out: str) -> None:
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    rgb = Image.fromarray(photo_like(72, 40, seed=1, noise=8.0))
    odd = Image.fromarray(photo_like(37, 23, seed=2, noise=8.0))
    seeds = {
        "s420": jpeg(rgb, quality=60, subsampling=2),
        "s422": jpeg(rgb, quality=60, subsampling=1),
        "s444": jpeg(odd, quality=60, subsampling=0),
        "gray": jpeg(odd.convert("L"), quality=60),
        "progressive": jpeg(rgb, quality=60, progressive=True),
        "restart": jpeg(rgb, quality=60, restart_marker_blocks=1),
        "cmyk": jpeg(odd.convert("CMYK"), quality=60),
        "tiny": jpeg(Image.new("RGB", (1, 1)), quality=50),
    }
    seeds["cut"] = seeds["s420"][: len(seeds["s420"]) // 2]
    seeds["cut_progressive"] = seeds["progressive"][: len(seeds["progressive"]) * 2 // 3]
    for name, data in seeds.items():
        (root / f"{name}.jpg").write_bytes(data)


if __name__ == "__main__":
    main(sys.argv[1])
