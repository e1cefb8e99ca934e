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
                above: bool = False, hint: str = "") -> None:
    """Refuse `value` unless it is a finite number >= low (> low when `above`) and <= high;
    None (an option left out) passes."""
    if value is None:
        return
    bound = f"> {low}" if above else f">= {low}"
    ok = math.isfinite(value) and (value > low if above else value >= low)
    if high is not None:
        bound = f"in [{low}, {high}]" if not above else f"in ({low}, {high}]"
        ok = ok and value <= high
    if not ok:
        raise OptionRangeError(f"{flag} {value}: must be {bound}{hint}")
