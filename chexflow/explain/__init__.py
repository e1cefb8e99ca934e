"""Predictions and Grad-CAM maps for image files: `chexflow predict` (PNG, JPEG and DICOM in,
per-class probabilities out as CSV) and `chexflow explain` (a Grad-CAM overlay per class).

The images take training's own path to the model: chexflow.data.pixels.load_greyscale (DICOM
through its LUTs first), then the model's own preprocessing layer. Inference runs in the trainer
environment; the maps are chexflow.evaluate.gradcam's, as in the evaluation report.
"""
