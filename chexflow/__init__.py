"""chexflow: CheXNet-style chest X-ray training and evaluation on Kubeflow with Horovod."""

__version__ = "0.1.0"
