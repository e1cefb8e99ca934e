"""The recipe's optimizers: Keras' legacy Adam and SGD (fused, one op per variable: a training
step that builds in a third of the time) take the same steps as the new optimizers they
replace, with the same decoupled weight decay."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
pytestmark = pytest.mark.trainer  # TensorFlow in the test's own process


def _steps(opt, steps: int = 4) -> list[np.ndarray]:
    """The weights of a small seeded model after `steps` steps of `opt` on fixed data."""
    from tensorflow import keras

    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, activation="relu"),
                              keras.layers.Dense(3, activation="sigmoid")])
    model.compile(optimizer=opt, loss="binary_crossentropy")
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(16, 6)).astype("float32"), (rng.random((16, 3)) > 0.5).astype("f4")
    for _ in range(steps):
        model.train_on_batch(x, y)
    return [w.numpy() for w in model.trainable_variables]


@pytest.mark.parametrize("name", ["adam", "sgd"])
def test_the_legacy_optimizer_takes_the_steps_of_the_new_one(name):
    from tensorflow import keras

    from chexflow.train import recipe

    used = recipe.optimizer(name, 0.01)
    assert isinstance(used, keras.optimizers.legacy.Optimizer)
    new = (keras.optimizers.Adam(0.01, beta_1=0.9, beta_2=0.999) if name == "adam"
           else keras.optimizers.SGD(0.01, momentum=0.9, nesterov=True))
    for a, b in zip(_steps(used), _steps(new), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["adam", "sgd"])
def test_weight_decay_is_the_new_optimizers_decoupled_decay(name):
    from tensorflow import keras

    from chexflow.train import recipe

    new = (keras.optimizers.Adam(0.01, beta_1=0.9, beta_2=0.999, weight_decay=0.1)
           if name == "adam" else
           keras.optimizers.SGD(0.01, momentum=0.9, nesterov=True, weight_decay=0.1))
    decayed = _steps(recipe.optimizer(name, 0.01, 0.1))
    for a, b in zip(decayed, _steps(new), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert not np.allclose(decayed[0], _steps(recipe.optimizer(name, 0.01))[0])


def test_horovod_rebuilds_the_optimizer_with_its_weight_decay():
    """hvd.DistributedOptimizer makes a subclass from the optimizer's config."""
    from chexflow.train import recipe

    opt = recipe.optimizer("adam", 0.01, 0.1)
    again = type(opt).from_config(opt.get_config())
    assert again.weight_decay == pytest.approx(0.1)


def test_the_slots_exist_before_the_first_step():
    """What a checkpoint restores and Horovod broadcasts before training."""
    from tensorflow import keras

    from chexflow.train import recipe

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer=recipe.optimizer("adam", 0.01, 0.1), loss="mse")
    recipe.build_optimizer(model.optimizer, model.trainable_variables)
    # the step count and two slots (m, v) for each of the kernel and the bias
    assert len(recipe.optimizer_variables(model.optimizer)) == 1 + 2 * 2
