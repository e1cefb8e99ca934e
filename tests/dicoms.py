"""DICOM files written with pydicom from an 8-bit image's pixels, for the tests of DICOM input:
each variant stores the same picture in another way (MONOCHROME1 or 2, 8 or 16 bits, a
rescale, a VOI window or a VOI LUT), so that a correct reader gives the 8-bit pixels back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.sequence import Sequence
from pydicom.uid import ExplicitVRLittleEndian, generate_uid

DIGITAL_XRAY = "1.2.840.10008.5.1.4.1.1.1.1"  # Digital X-Ray Image Storage - For Presentation


def write_dicom(path: Path, stored: np.ndarray, photometric: str, bits_stored: int,
                **elements) -> Path:
    """A DICOM Part 10 file holding `stored` (uint8 or uint16) as its pixel data."""
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta.MediaStorageSOPClassUID = DIGITAL_XRAY
    ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    ds.SOPClassUID = DIGITAL_XRAY
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID
    ds.Modality = "DX"
    ds.set_pixel_data(stored, photometric, bits_stored)
    for name, value in elements.items():
        setattr(ds, name, value)
    ds.save_as(path, enforce_file_format=True)
    return Path(path)


def identity_voi_lut() -> Sequence:
    """A VOI LUT mapping stored values 0..255 onto 0..255 (8-bit output), higher ones to 255."""
    item = Dataset()
    item.add_new("LUTDescriptor", "US", [256, 0, 8])
    item.add_new("LUTData", "US", list(range(256)))
    return Sequence([item])


# name: (stored pixels from the 8-bit image p, PhotometricInterpretation, BitsStored, elements)
VARIANTS = {
    "MONOCHROME2-8bit": (lambda p: p, "MONOCHROME2", 8, {}),
    "MONOCHROME1-8bit": (lambda p: 255 - p, "MONOCHROME1", 8, {}),
    "MONOCHROME2-16bit": (lambda p: p.astype(np.uint16) * 257, "MONOCHROME2", 16, {}),
    "MONOCHROME1-16bit": (lambda p: 65535 - p.astype(np.uint16) * 257, "MONOCHROME1", 16, {}),
    # 16-bit values 0..255: black by their bit depth, the picture itself through the VOI
    "MONOCHROME2-16bit-window": (lambda p: p.astype(np.uint16), "MONOCHROME2", 16,
                                 {"WindowCenter": 128, "WindowWidth": 256}),
    # the Modality LUT (rescale) first: stored p + 1000, intercept -1000, then the window
    "MONOCHROME2-16bit-rescale-window": (lambda p: p.astype(np.uint16) + 1000, "MONOCHROME2", 16,
                                         {"RescaleIntercept": -1000, "RescaleSlope": 1,
                                          "WindowCenter": 128, "WindowWidth": 256}),
    "MONOCHROME2-16bit-voilut": (lambda p: p.astype(np.uint16), "MONOCHROME2", 16,
                                 {"VOILUTSequence": identity_voi_lut()}),
}


def write_variant(path: Path, pixels: np.ndarray, variant: str) -> Path:
    """`pixels` (uint8) stored as VARIANTS[variant]."""
    stored, photometric, bits, elements = VARIANTS[variant]
    return write_dicom(path, stored(pixels), photometric, bits, **elements)
