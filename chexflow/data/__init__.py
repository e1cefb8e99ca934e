"""Datasets in the real formats: NIH ChestX-ray14 and CheXpert, to TFRecord shards."""
