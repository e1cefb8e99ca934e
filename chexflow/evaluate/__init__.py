"""Evaluation: predictions for a split, per-class AUROC with bootstrap CIs, ROC plot, report;
calibration and operating points (calibration), Grad-CAM maps (gradcam) and their figures.

plots, report, calibration and the report's sections need no TensorFlow (control environment);
predict, gradcam and insights do. The AUROC maths is chexflow.auroc, shared with training's
validation.
"""
