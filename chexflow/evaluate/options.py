"""The numeric options of an evaluation, checked before anything is read: by `chexflow evaluate`
and, before the run starts, by the pipelines' evaluate step (`chexflow run` checks them before
any step runs)."""

from __future__ import annotations

from chexflow.limits import MAX_BOOTSTRAP, MAX_SEED, check_range


def check_options(bootstrap: int, batch_size: int = 64, seed: int = 0) -> None:
    """--bootstrap (0: no confidence interval), --batch-size and --seed within their ranges."""
    check_range("--bootstrap", bootstrap, 0, cap=MAX_BOOTSTRAP)
    check_range("--batch-size", batch_size, 1)
    check_range("--seed", seed, 0, MAX_SEED)
