"""Evaluation: predictions for a split, per-class AUROC with bootstrap CIs, ROC plot, report.

plots, report and results need no TensorFlow (control environment); predict does. The AUROC
maths is chexflow.auroc, shared with training's validation.
"""
