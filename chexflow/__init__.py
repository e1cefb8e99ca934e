"""chexflow: CheXNet-style chest X-ray training and evaluation on Kubeflow with Horovod."""

import os

__version__ = "0.1.0"

# chexflow's models and Horovod's Keras wrappers are Keras 2. On TensorFlow >= 2.16 that is
# tf-keras, which `tensorflow.keras` names only when this is set before TensorFlow is imported;
# child processes (horovodrun's workers, trials) inherit it.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
