"""DICOM radiographs as 8-bit greyscale, the form `load_greyscale` gives every image before its
one resize: pydicom decodes the pixel data, applies the Modality LUT (or rescale) and the VOI LUT
(or window), and the result is scaled from the range those LUTs output to 0..255, MONOCHROME1
inverted so that bone is bright as in MONOCHROME2 and in NIH's and CheXpert's PNG/JPEG.

Without a VOI LUT or window the range is the stored one (BitsStored, through the rescale), as a
16-bit PNG is scaled by its bit depth: an 8-bit MONOCHROME2 file keeps its pixels, and a 16-bit
file holding 257 x an 8-bit image gives that image back. pydicom is imported only for DICOM
files, so reading PNG and JPEG needs no pydicom.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import numpy as np

DICOM_MAGIC = b"DICM"  # at byte 128, after the preamble (DICOM Part 10)
DICOM_SUFFIXES = (".dcm", ".dicom")
MONOCHROME = ("MONOCHROME1", "MONOCHROME2")


class DicomRejected(ValueError):
    """The DICOM file cannot be used as a radiograph; the message says why."""


def is_dicom(path: Path, data: bytes) -> bool:
    """A DICOM Part 10 file (the DICM marker), or a file named .dcm/.dicom."""
    return data[128:132] == DICOM_MAGIC or Path(path).suffix.lower() in DICOM_SUFFIXES


def lut_output_range(ds) -> tuple[float, float]:
    """(lowest, highest) value the Modality and VOI LUTs can output: a VOI LUT's entries
    (LUTDescriptor bits), else the stored range (BitsStored, PixelRepresentation) through the
    Modality LUT or rescale slope and intercept: the range pydicom's windowing maps onto."""
    if "VOILUTSequence" in ds and ds.VOILUTSequence:
        return 0.0, float(2 ** int(ds.VOILUTSequence[0].LUTDescriptor[2]) - 1)
    if "ModalityLUTSequence" in ds and ds.ModalityLUTSequence:
        return 0.0, float(2 ** int(ds.ModalityLUTSequence[0].LUTDescriptor[2]) - 1)
    bits = int(ds.BitsStored)
    low, high = (0, 2**bits - 1) if ds.PixelRepresentation == 0 else (
        -(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    slope, intercept = ds.get("RescaleSlope"), ds.get("RescaleIntercept")
    if slope is not None and intercept is not None:
        low, high = sorted((low * float(slope) + float(intercept),
                            high * float(slope) + float(intercept)))
    return float(low), float(high)


def _dataset(data: bytes):
    import pydicom
    from pydicom.errors import InvalidDicomError

    try:
        with warnings.catch_warnings():  # what it warns of, the rejection or the image says
            warnings.simplefilter("ignore", UserWarning)
            return pydicom.dcmread(io.BytesIO(data), force=True)
    except (InvalidDicomError, EOFError, ValueError, KeyError, OSError) as e:
        raise DicomRejected(f"not a DICOM file pydicom can read ({e})") from None


def _check_radiograph(ds, max_pixels: int | None) -> str:
    """The photometric interpretation of a one-frame greyscale image of at most `max_pixels`
    pixels; else DicomRejected."""
    if "PixelData" not in ds:
        raise DicomRejected("DICOM file without pixel data (PixelData)")
    pixels = int(ds.get("Rows", 0) or 0) * int(ds.get("Columns", 0) or 0)
    if max_pixels is not None and pixels > max_pixels:
        raise DicomRejected(f"DICOM image of {pixels} pixels, above the limit of {max_pixels}: "
                            "too large to decode safely")
    photometric = str(ds.get("PhotometricInterpretation", ""))
    if photometric not in MONOCHROME:
        raise DicomRejected(f"DICOM PhotometricInterpretation {photometric or 'missing'}: "
                            "expected MONOCHROME1 or MONOCHROME2 (a greyscale radiograph)")
    frames = int(ds.get("NumberOfFrames", 1) or 1)
    if frames != 1:
        raise DicomRejected(f"DICOM file with {frames} frames: expected one image")
    return photometric


def dicom_greyscale(data: bytes, max_pixels: int | None = None) -> tuple[np.ndarray, str]:
    """(uint8 pixels at the file's own size, a description of the source such as
    'DICOM MONOCHROME1 15-bit') of a DICOM file's bytes; DicomRejected if unusable or above
    `max_pixels` pixels."""
    from pydicom.pixels import apply_modality_lut, apply_voi_lut

    ds = _dataset(data)
    photometric = _check_radiograph(ds, max_pixels)
    try:
        stored = ds.pixel_array
        values = apply_voi_lut(apply_modality_lut(stored, ds), ds).astype(np.float64)
        low, high = lut_output_range(ds)
    except (AttributeError, KeyError, TypeError, ValueError, NotImplementedError,
            RuntimeError) as e:
        syntax = getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", None)
        name = getattr(syntax, "name", syntax) or "unknown transfer syntax"
        raise DicomRejected(f"cannot decode the DICOM pixel data ({name}): "
                            f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    scaled = np.rint((values.clip(low, high) - low) * 255.0 / ((high - low) or 1.0))
    if photometric == "MONOCHROME1":
        scaled = 255.0 - scaled
    return scaled.astype(np.uint8), f"DICOM {photometric} {int(ds.BitsStored)}-bit"
