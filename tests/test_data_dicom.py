"""DICOM input: pydicom's LUTs applied, MONOCHROME1 inverted, 8- and 16-bit files, then the one
resize every PNG takes (chexflow.data.pixels.load_greyscale); unusable files rejected with the
reason."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from chexflow.data.pixels import ImageRejected, load_greyscale
from chexflow.data.synth import render
from tests.dicoms import VARIANTS, write_dicom, write_variant


def generated_image(size: int) -> np.ndarray:
    """A generated radiograph (chexflow data synth's) with a few findings, uint8."""
    labels = np.zeros(14)
    labels[[1, 6, 13]] = 1
    return render(labels, size, np.random.default_rng(3))


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize(("source", "size"), [(64, 64), (128, 64), (48, 64)])
def test_dicom_of_a_pngs_pixels_decodes_to_the_pngs_pixels(tmp_path, variant, source, size):
    """At the model's size, and resized down or up: the DICOM's pixels after its LUTs equal the
    PNG's, so both take the same resize to the same result."""
    pixels = generated_image(source)
    png = tmp_path / "image.png"
    Image.fromarray(pixels, mode="L").save(png)
    dcm = write_variant(tmp_path / "image.dcm", pixels, variant)
    from_png, _, _ = load_greyscale(png, size)
    from_dicom, _, mode = load_greyscale(dcm, size)
    assert from_dicom.shape == (size, size) and from_dicom.dtype == np.uint8
    np.testing.assert_array_equal(from_dicom, from_png)
    assert mode.startswith(f"DICOM {VARIANTS[variant][1]} {VARIANTS[variant][2]}-bit")


def test_a_dicom_without_a_suffix_is_read_by_its_marker(tmp_path):
    pixels = generated_image(64)
    path = write_variant(tmp_path / "IM0001", pixels, "MONOCHROME1-16bit")
    np.testing.assert_array_equal(load_greyscale(path, 64)[0], pixels)


def test_unusable_dicoms_are_rejected_with_the_reason(tmp_path):
    rgb = write_dicom(tmp_path / "rgb.dcm", np.zeros((16, 16, 3), np.uint8), "RGB", 8)
    frames = write_dicom(tmp_path / "frames.dcm", np.zeros((2, 16, 16), np.uint8),
                         "MONOCHROME2", 8, NumberOfFrames=2)
    no_pixels = write_dicom(tmp_path / "none.dcm", np.zeros((16, 16), np.uint8),
                            "MONOCHROME2", 8)
    import pydicom

    ds = pydicom.dcmread(no_pixels)
    del ds.PixelData
    ds.save_as(no_pixels)
    garbage = tmp_path / "garbage.dcm"
    garbage.write_bytes(b"\0" * 128 + b"DICM" + b"\xff" * 40)
    expected = {rgb: "PhotometricInterpretation RGB: expected MONOCHROME1 or MONOCHROME2",
                frames: "with 2 frames: expected one image",
                no_pixels: "without pixel data", garbage: "DICOM"}
    for path, reason in expected.items():
        with pytest.raises(ImageRejected, match=reason) as e:
            load_greyscale(path, 32)
        assert str(path) in str(e.value) and "\n" not in str(e.value)
