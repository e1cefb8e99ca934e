"""Grad-CAM's block for DenseNet-121 and ResNet-50 at each image size, and `chexflow explain`
and `chexflow predict` on a ResNet-50 (untrained: where it looks is not the point here, that its
maps and probabilities come out of the right layers is; the trained DenseNet-121's maps are
checked in tests/test_explain.py)."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from PIL import Image

from chexflow.data.synth import render
from chexflow.pathologies import PATHOLOGIES
from tests.conftest import read_json, run_chexflow

BLOCK = {  # (model, image size): the default block and its cells a side
    ("densenet121", 32): ("conv3_block12_concat", 4),
    ("densenet121", 64): ("conv4_block24_concat", 4),
    ("densenet121", 128): ("relu", 4), ("densenet121", 224): ("relu", 7),
    ("resnet50", 32): ("conv3_block4_out", 4), ("resnet50", 64): ("conv4_block6_out", 4),
    ("resnet50", 128): ("conv5_block3_out", 4), ("resnet50", 224): ("conv5_block3_out", 7),
}


@pytest.mark.trainer
@pytest.mark.parametrize(("name", "size"), list(BLOCK))
def test_the_default_block_is_the_last_with_at_least_4_cells_a_side(name, size):
    from chexflow.evaluate.gradcam import GradCam
    from chexflow.train.models import build_model

    cam = GradCam(build_model(name, size, 14, flip=False))
    assert (cam.layer, cam.cells) == (BLOCK[name, size][0], (BLOCK[name, size][1],) * 2)


@pytest.mark.trainer
@pytest.mark.slow
def test_explain_and_predict_run_a_resnet50(tmp_path):
    from chexflow.train.models import build_model
    from chexflow.train.rundir import embed_model_info

    model = tmp_path / "resnet50.keras"
    net = build_model("resnet50", 64, 14, flip=True, seed=1)
    net.save(model)
    embed_model_info(model, list(PATHOLOGIES), 64)
    rng = np.random.default_rng(0)
    images = []
    for k in range(3):
        labels = np.zeros(14)
        labels[k] = 1
        path = tmp_path / f"image{k}.png"
        Image.fromarray(render(labels, 64, rng), mode="L").save(path)
        images.append(path)
    proc = run_chexflow("explain", model, *images, "--class", "Cardiomegaly", "--class", "Mass",
                        "--out", tmp_path / "maps")
    assert "layer conv4_block6_out, 4x4 cells" in proc.stdout
    index = read_json(tmp_path / "maps" / "explain.json")
    assert index["classes"] == ["Cardiomegaly", "Mass"] and len(index["images"]) == 3
    with np.load(tmp_path / "maps" / "maps.npz") as maps:
        assert maps["maps"].shape == (3, 2, 64, 64) and maps["probs"].shape == (3, 14)
        explained = maps["probs"]
    pixels = np.stack([np.asarray(Image.open(p))[..., None] for p in images])
    expected = net(pixels, training=False).numpy()
    np.testing.assert_allclose(explained, expected, atol=1e-5, rtol=0)
    run_chexflow("predict", model, *images, "--out", tmp_path / "p.csv")
    with open(tmp_path / "p.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    got = np.array([[float(r[c]) for c in PATHOLOGIES] for r in rows])
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
