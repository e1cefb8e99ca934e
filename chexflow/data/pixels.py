"""Decoding chest X-rays defensively: greyscale 8-bit at a fixed size, whatever the file holds."""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from chexflow.data.faults import FAULTS, cause


class ImageRejected(Exception):
    """The image cannot be used; the message is the reason written to rejected.csv."""


def load_greyscale(path: Path, size: int) -> tuple[np.ndarray, bytes, str | None]:
    """Return (size x size uint8 pixels, the file's bytes, the source mode if it was converted).

    RGB(A), palette and 16/32-bit images are converted rather than rejected; a missing, empty,
    truncated or non-image file, or one larger than Pillow's decompression-bomb limit
    (Image.MAX_IMAGE_PIXELS, about 89 megapixels), raises ImageRejected.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ImageRejected(f"image file not found: {path}") from None
    except OSError as e:
        raise ImageRejected(f"image file unreadable: {path}: {cause(e)}") from None
    if not data:
        raise ImageRejected(f"image file is empty: {path}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
        with img:
            img.load()
            mode = img.mode
            if mode in ("I;16", "I;16B", "I;16L", "I"):
                wide = np.asarray(img, dtype=np.int64).clip(0, 65535)
                img = Image.fromarray((wide // 257).astype(np.uint8), mode="L")
            elif mode == "F":
                flt = np.asarray(img, dtype=np.float32)
                span = float(flt.max() - flt.min()) or 1.0
                img = Image.fromarray(((flt - flt.min()) / span * 255).astype(np.uint8), mode="L")
            elif mode != "L":
                img = img.convert("L")
            if img.size != (size, size):
                img = img.resize((size, size), Image.Resampling.BILINEAR, reducing_gap=3.0)
            pixels = np.asarray(img, dtype=np.uint8)
    except UnidentifiedImageError:
        raise ImageRejected(f"not an image Pillow can identify: {path}") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise ImageRejected(f"image too large to decode safely: {path}: {e}") from None
    except (*FAULTS, SyntaxError, ValueError) as e:
        raise ImageRejected(f"corrupt or unreadable image: {path}: {cause(e)}") from None
    return pixels, data, (None if mode == "L" else mode)
