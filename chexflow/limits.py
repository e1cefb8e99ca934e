"""Range checks of numeric command-line values: a refused value gets one line naming the option,
the value and the range it must be in."""

from __future__ import annotations

import math

from chexflow.errors import ChexflowError

# numpy's and TensorFlow's seeds are unsigned 32-bit
MAX_SEED = 2**32 - 1


class OptionRangeError(ChexflowError, ValueError):
    """A numeric option outside its range (or not a finite number)."""


def check_range(flag: str, value: float | None, low: float, high: float | None = None,
                above: bool = False, hint: str = "", cap: float | None = None) -> None:
    """Refuse `value` unless it is a finite number >= low (> low when `above`) and <= high;
    None (an option left out) passes. `cap`: an upper bound named apart (`must be <= cap`), for
    options whose lower bound is the one users meet."""
    if value is None:
        return
    bound = f"> {low}" if above else f">= {low}"
    ok = math.isfinite(value) and (value > low if above else value >= low)
    if high is not None:
        bound = f"in [{low}, {high}]" if not above else f"in ({low}, {high}]"
        ok = ok and value <= high
    if not ok:
        raise OptionRangeError(f"{flag} {value}: must be {bound}{hint}")
    if cap is not None and value > cap:
        raise OptionRangeError(f"{flag} {value}: must be <= {cap}")

# A training's learning rate for one worker (the worker scales it by their number). Adam and SGD
# train with 1e-5 to about 1 (CheXNet: 1e-3; Goyal et al.'s linear scaling reaches 3.2 for SGD
# at a batch of 8192); far above, the first step diverges, and past float32's 3.4e38
# TensorFlow cannot even hold the rate (a ValueError as the optimizer is built).
MAX_LR = 10.0
# Decoupled weight decay removes lr x weight_decay of every weight at each step: AdamW's usual
# values are 1e-4 to 0.1; at 1, one step at lr 1 zeroes the network.
MAX_WEIGHT_DECAY = 1.0
# Counts (epochs, steps, batch, threads, ...) within int32, as TensorFlow takes some of them:
# 2**31 threads is a ValueError at its first operation, a batch past int64 one as the input
# pipeline is built.
MAX_COUNT = 2**31 - 1
# Image sides: preprocess and `chexflow data synth` write up to this.
MAX_IMAGE_SIZE = 4096
# Horovod's fusion buffer (MB), allocated on every GPU: 64 by its docs' default; DenseNet-121's
# and ResNet-50's gradients are 32 and 100 MB in all.
MAX_FUSION_MB = 1024.0
# Horovod's cycle (ms): 1 by default, 25 on hosts without a GPU here; a second already idles
# the ranks between allreduces.
MAX_CYCLE_MS = 1000.0
# Bootstrap resamples of an evaluation: ten times CheXNet's 10,000 (the resamples' AUROCs are
# held in memory, resamples x classes).
MAX_BOOTSTRAP = 100_000
