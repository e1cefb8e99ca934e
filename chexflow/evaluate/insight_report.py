"""The report's sections on calibration, operating points and Grad-CAM, from the files an
evaluation folder holds (calibration.json, reliability.png, cam.png, cam.npz); an evaluation
without them (an older one) gets none. Without TensorFlow."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

import numpy as np

from chexflow.evaluate.calibration import CALIBRATION_FILE
from chexflow.evaluate.insights import CAM_NPZ, CAM_PNG, RELIABILITY_PNG


def _fmt(x: Any, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _img(png: Path, alt: str, element_id: str) -> str:
    data = base64.b64encode(png.read_bytes()).decode()
    return (f'<img id="{element_id}" alt="{html.escape(alt)}" '
            f'src="data:image/png;base64,{data}">')


def operating_rows(calibration: dict) -> list[str]:
    """One table row per class: ECE, the threshold and its sensitivity and specificity on the
    split it was chosen on and on the evaluated split."""
    choose = calibration["threshold_split"]
    rows = []
    for cls, d in calibration["per_class"].items():
        point = d.get("operating_point") or {}
        chosen = point.get(choose) or {}
        cells = [_fmt(d.get("ece")), _fmt(point.get("threshold"), 4),
                 _fmt(chosen.get("sensitivity")), _fmt(chosen.get("specificity")),
                 _fmt(point.get("sensitivity")), _fmt(point.get("specificity")),
                 html.escape(point.get("note", ""))]
        rows.append(f"<tr><td>{html.escape(cls)}</td>"
                    + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return rows


def calibration_section(calibration: dict, reliability_png: Path | None) -> list[str]:
    split, choose = calibration["split"], calibration["threshold_split"]
    target = f"{calibration['specificity_target']:.0%}"
    parts = [
        "<h2 id='calibration'>Calibration and operating points</h2>",
        f"<p>Expected calibration error (ECE) per class on the {html.escape(split)} split "
        f"({calibration['bins']} equal-width probability bins; mean "
        f"{_fmt(calibration.get('ece_mean'))}). Operating point: the threshold with the "
        f"highest sensitivity at {target} specificity on the {html.escape(choose)} split, "
        f"then its sensitivity and specificity on the {html.escape(split)} split.</p>",
        f"<table><tr><th>Pathology</th><th>ECE</th><th>threshold</th>"
        f"<th>sensitivity ({html.escape(choose)})</th>"
        f"<th>specificity ({html.escape(choose)})</th>"
        f"<th>sensitivity ({html.escape(split)})</th>"
        f"<th>specificity ({html.escape(split)})</th><th>note</th></tr>",
        *operating_rows(calibration), "</table>",
    ]
    if reliability_png is not None:
        parts.append(_img(reliability_png, "reliability diagram of every class", "reliability"))
    return parts


def cam_section(cam_png: Path, cam_npz: Path | None) -> list[str]:
    layer = ""
    if cam_npz is not None:
        with np.load(cam_npz) as cam:
            layer = (f" Maps from layer <code>{html.escape(str(cam['layer']))}</code> "
                     f"({'x'.join(str(c) for c in cam['cells'])} cells).")
    return [
        "<h2 id='gradcam'>Where the model looked (Grad-CAM)</h2>",
        "<p>For each class, the image it gave the highest probability, and the class's "
        "Grad-CAM map over it (red: where the class's score rises most with the features)."
        f"{layer}</p>",
        _img(cam_png, "Grad-CAM of every class on its highest-probability image", "cam-grid"),
    ]


def insight_sections(folder: Path) -> list[str]:
    """The HTML sections for the evaluation in FOLDER, in report order."""
    folder = Path(folder)
    parts: list[str] = []
    if (folder / CALIBRATION_FILE).is_file():
        png = folder / RELIABILITY_PNG
        parts += calibration_section(json.loads((folder / CALIBRATION_FILE).read_text()),
                                     png if png.is_file() else None)
    if (folder / CAM_PNG).is_file():
        npz = folder / CAM_NPZ
        parts += cam_section(folder / CAM_PNG, npz if npz.is_file() else None)
    return parts
