"""Decoding chest X-rays defensively: greyscale 8-bit at a fixed size, whatever the file holds.

NIH ChestX-ray14 and CheXpert ship 8-bit greyscale PNG/JPEG: their pixels are kept as they are.
PNGs exported from DICOM are often 16-bit files holding 10- to 16-bit values (BitsStored, most
often 12): dividing those by 257 as if they spanned 16 bits leaves a 12-bit image 16 grey
levels. Such an image is scaled by its bit depth (`wide_bit_depth`) instead.
"""

from __future__ import annotations

import io
import struct
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from chexflow.data.dicom import DicomRejected, dicom_greyscale, is_dicom
from chexflow.data.faults import FAULTS, cause


class ImageRejected(Exception):
    """The image cannot be used; the message is the reason written to rejected.csv."""


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
DICOM_BITS = 12  # the BitsStored of most DICOM radiographs
# An image with a side below this (preprocess's smallest --image-size) is no radiograph. A size
# other than the CSV's is otherwise fine: NIH's PNGs are 1024x1024 resizes of DICOMs whose size
# and aspect OriginalImage[Width,Height] gives, and users may resize images themselves.
MIN_SIDE = 8


def png_significant_bits(data: bytes) -> int | None:
    """The grey channel's significant bits from a PNG's sBIT chunk (before IDAT); None without."""
    if not data.startswith(PNG_SIGNATURE):
        return None
    at = len(PNG_SIGNATURE)
    while at + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        if kind in (b"IDAT", b"IEND"):
            return None
        if kind == b"sBIT" and length >= 1:
            return data[at + 8] or None
        at += 12 + length
    return None


def wide_bit_depth(pixels: np.ndarray, data: bytes) -> int:
    """The bit depth of a 16/32-bit greyscale image: the PNG's sBIT when it has one (1..16);
    else 12 bits (DICOM's usual BitsStored) when every value is below 4096, else 16 bits."""
    bits = png_significant_bits(data)
    if bits is not None and 1 <= bits <= 16:
        return bits
    return DICOM_BITS if pixels.size and int(pixels.max()) < 1 << DICOM_BITS else 16


def load_greyscale(
    path: Path, size: int, csv_size: str | None = None
) -> tuple[np.ndarray, bytes, str | None]:
    """Return (size x size uint8 pixels, the file's bytes, the source mode if it was converted).

    RGB(A), palette and 16/32-bit images are converted rather than rejected (16/32-bit ones
    scaled from their bit depth, see wide_bit_depth; the mode returned says which); DICOM files
    are read with their LUTs applied (chexflow.data.dicom) and then resized like any other; a
    missing, empty, truncated or non-image file, or one larger than Pillow's decompression-bomb
    limit (Image.MAX_IMAGE_PIXELS, about 89 megapixels), or one with a side below MIN_SIDE
    (named with `csv_size`, the size the CSV gives, if any), raises ImageRejected.
    """
    data = read_image_file(path)
    pixels, mode = decode_greyscale(data, size, path, csv_size)
    return pixels, data, mode


def decode_greyscale(data: bytes, size: int, name: Path | str,
                     csv_size: str | None = None) -> tuple[np.ndarray, str | None]:
    """(size x size uint8 pixels, the source mode if it was converted) of an image file's bytes
    (PNG, JPEG, DICOM...): load_greyscale's decoding, for bytes that come from elsewhere than a
    file (a request to the predictor). `name` stands for the file in messages and its suffix
    counts as a DICOM hint; ImageRejected as load_greyscale."""
    path = Path(name)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img, mode = _greyscale_image(path, data)
        with img:
            if min(img.size) < MIN_SIDE:
                said = f" (the CSV says {csv_size})" if csv_size else ""
                raise ImageRejected(
                    f"image is {img.width}x{img.height} px{said}, below {MIN_SIDE} px a side: "
                    f"not a usable radiograph: {path}"
                )
            pixels = resized(img, size)
    except UnidentifiedImageError:
        raise ImageRejected(f"not an image Pillow can identify: {path}") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise ImageRejected(f"image too large to decode safely: {path}: {e}") from None
    except DicomRejected as e:
        raise ImageRejected(f"{e}: {path}") from None
    except (*FAULTS, SyntaxError, ValueError) as e:
        raise ImageRejected(f"corrupt or unreadable image: {path}: {cause(e)}") from None
    return pixels, (None if mode == "L" else mode)


def read_image_file(path: Path) -> bytes:
    """The file's bytes; ImageRejected if it is missing, unreadable or empty."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise ImageRejected(f"image file not found: {path}") from None
    except OSError as e:
        raise ImageRejected(f"image file unreadable: {path}: {cause(e)}") from None
    if not data:
        raise ImageRejected(f"image file is empty: {path}")
    return data


def _greyscale_image(path: Path, data: bytes) -> tuple[Image.Image, str]:
    """(the file as an 8-bit greyscale PIL image at its own size, the source mode)."""
    if is_dicom(path, data):
        pixels, mode = dicom_greyscale(data, Image.MAX_IMAGE_PIXELS)
        return Image.fromarray(pixels, mode="L"), mode
    img = Image.open(io.BytesIO(data))
    with img:
        img.load()
        mode = img.mode
        if mode in ("I;16", "I;16B", "I;16L", "I"):
            wide = np.asarray(img, dtype=np.int64).clip(0, 65535)
            bits = wide_bit_depth(wide, data)
            top = (1 << bits) - 1
            scaled = (wide.clip(0, top) * 255 + top // 2) // top
            return Image.fromarray(scaled.astype(np.uint8), mode="L"), f"{mode} ({bits}-bit)"
        if mode == "F":
            flt = np.asarray(img, dtype=np.float32)
            span = float(flt.max() - flt.min()) or 1.0
            return Image.fromarray(((flt - flt.min()) / span * 255).astype(np.uint8),
                                   mode="L"), mode
        return (img.copy() if mode == "L" else img.convert("L")), mode


def resized(img: Image.Image, size: int) -> np.ndarray:
    """An 8-bit greyscale image as size x size uint8 pixels: the one resize every image takes
    (PNG, JPEG and DICOM alike), at preprocessing and at `chexflow predict`."""
    if img.size != (size, size):
        img = img.resize((size, size), Image.Resampling.BILINEAR, reducing_gap=3.0)
    return np.asarray(img, dtype=np.uint8)
