"""The current stack: TensorFlow 2.20 with tf-keras (Keras 2), numpy 2, kfp and the trainer in
one environment, and what the TF 2.15.1 trainer wrote (tests/data/tf2.15) still read."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from chexflow.envs import trainer_python

pytestmark = pytest.mark.trainer  # TensorFlow in the trainer's environment

REPO = Path(__file__).resolve().parent.parent
OLD = REPO / "tests/data/tf2.15"
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}


def _run(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(trainer_python()), "-c", code], capture_output=True, text=True,
                          env=env or ENV, timeout=300, cwd=REPO)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:2])


def test_environment_holds_tensorflow_2_20_tf_keras_numpy_2_and_kfp_together():
    proc = _run("import chexflow, json, sys, numpy, tensorflow as tf, tf_keras, kfp, "
                "horovod.tensorflow.keras as hvd, google.protobuf as pb\n"
                "print(json.dumps({'tf': tf.__version__, 'numpy': numpy.__version__, "
                "'tf_keras': tf_keras.__version__, 'keras_module': tf.keras.Model.__module__, "
                "'kfp': kfp.__version__, 'protobuf': pb.__version__, "
                "'python': '.'.join(map(str, sys.version_info[:2])), 'gloo': hvd.gloo_built()}))")
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert _version(got["tf"]) >= (2, 20), got
    assert _version(got["numpy"]) >= (2, 0), got
    assert _version(got["tf_keras"]) == _version(got["tf"]), got
    # importing chexflow made tensorflow.keras tf-keras (Keras 2), what Horovod's wrappers need
    assert got["keras_module"].startswith("tf_keras."), got
    assert got["gloo"] is True
    if trainer_python() == Path(sys.executable):  # make setup's one environment
        assert _version(got["python"]) >= (3, 12), got


def test_keras_3_loaded_before_chexflow_is_one_clear_error():
    # tensorflow.keras is resolved on first use: only a use before chexflow is imported
    # (so before it sets TF_USE_LEGACY_KERAS) leaves Keras 3 there
    env = {k: v for k, v in ENV.items() if k != "TF_USE_LEGACY_KERAS"}
    proc = _run("import tensorflow as tf\ntf.keras.layers.Dense\n"
                "from chexflow.errors import ChexflowError\n"
                "try:\n    import chexflow.train.models\n"
                "except ChexflowError as e:\n    print(e)\n", env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "need Keras 2 (tf-keras)" in proc.stdout
    assert "TF_USE_LEGACY_KERAS=1" in proc.stdout


def test_model_saved_by_the_tf_2_15_trainer_predicts_the_same(tmp_path: Path):
    expected = json.loads((OLD / "expected.json").read_text())
    assert expected["tensorflow"] == "2.15.1" and expected["keras_package"] == "keras"
    # its classes were a member of their own then (chexflow.json): still read
    from chexflow.train.rundir import model_info

    assert model_info(OLD / "best_model.keras") == {
        "classes": [f"class{i}" for i in range(14)], "image_size": 16}
    proc = _run(
        "import json, sys\n"
        f"sys.path.insert(0, {str(OLD)!r})\n"
        "from make_fixture import inputs\n"
        "from chexflow.train.models import load_model\n"
        f"m = load_model({str(OLD / 'best_model.keras')!r})\n"
        "print(json.dumps(m.predict(inputs(), verbose=0).tolist()))")
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(got, expected["predictions"], rtol=0, atol=1e-5)


def test_checkpoint_written_by_the_tf_2_15_trainer_restores_model_and_optimizer(
        tmp_path: Path):
    expected = json.loads((OLD / "expected.json").read_text())
    shutil.copytree(OLD / "checkpoints", tmp_path / "checkpoints")  # restoring writes nothing
    proc = _run(
        "import json, sys\n"
        f"sys.path.insert(0, {str(OLD)!r})\n"
        "import chexflow\n"
        "import tensorflow as tf\n"
        "from tensorflow import keras\n"
        "from make_fixture import inputs, model\n"
        "m = model()\n"
        "m.compile(optimizer=keras.optimizers.Adam(1e-3), loss='binary_crossentropy')\n"
        "m.optimizer.build(m.trainable_variables)\n"
        "ckpt = tf.train.Checkpoint(model=m, optimizer=m.optimizer)\n"
        f"path = tf.train.latest_checkpoint({str(tmp_path / 'checkpoints')!r})\n"
        "ckpt.restore(path).assert_existing_objects_matched()\n"
        "print(json.dumps({'iterations': int(m.optimizer.iterations.numpy()),\n"
        "                  'predictions': m.predict(inputs(), verbose=0).tolist()}))")
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["iterations"] == expected["optimizer_iterations"] == 1
    np.testing.assert_allclose(got["predictions"], expected["predictions"], rtol=0, atol=1e-5)
