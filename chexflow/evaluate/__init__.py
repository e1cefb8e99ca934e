"""Evaluation: predictions for a split, per-class AUROC with bootstrap CIs, ROC plot, report.

auroc, plots, report and results need no TensorFlow (control environment); predict does.
"""
