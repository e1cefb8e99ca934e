"""Training under bad input and faults (issue 18): every numeric option range-checked in one
line, one run per --out folder (a lock naming its holder), no worker outliving a killed
`chexflow train`, a clear last line when a worker dies, and no run that trains on nothing."""

from __future__ import annotations

import argparse

import pytest

from chexflow.errors import ChexflowError
from chexflow.train.options import add_train_arguments
from chexflow.train.rundir import check_options
from tests.conftest import run_chexflow


def _parsed(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_train_arguments(p, launcher=True)
    return p.parse_args(["--out", "/nowhere", "--synthetic-data", *argv])


@pytest.mark.parametrize(("argv", "message"), [
    (("--epochs", "0"), "--epochs 0: must be >= 1"),
    (("--batch-size", "-4"), "--batch-size -4: must be >= 1"),
    (("--steps-per-epoch", "0"), "--steps-per-epoch 0: must be >= 1"),
    (("--validation-steps", "0"),
     "--validation-steps 0: must be >= 1 (leave it out to validate on the whole split)"),
    (("--warmup-steps", "-1"), "--warmup-steps -1: must be >= 0"),
    (("--lr-warmup-epochs", "-0.5"), "--lr-warmup-epochs -0.5: must be >= 0"),
    (("--lr-warmup-epochs", "nan"), "--lr-warmup-epochs nan: must be >= 0"),
    (("--lr", "nan"), "--lr nan: must be > 0"),
    (("--lr", "inf"), "--lr inf: must be > 0"),
    (("--lr", "0"), "--lr 0.0: must be > 0"),
    (("--weight-decay", "nan"), "--weight-decay nan: must be >= 0"),
    (("--image-size", "-5"), "--image-size -5: must be >= 1"),
    (("--image-size", "16"), "--image-size 16: Keras' models need at least 32 px"),
    (("--threads", "0"), "--threads 0: must be >= 1"),
    (("--seed", "-1"), "--seed -1: must be in [0, 4294967295]"),
    (("--seed", str(2**32)), "--seed 4294967296: must be in [0, 4294967295]"),
])
def test_numeric_train_option_out_of_range_is_refused(argv, message):
    with pytest.raises(ChexflowError) as refused:
        check_options(_parsed(*argv))
    assert str(refused.value) == message


def test_in_range_train_options_pass():
    check_options(_parsed("--validation-steps", "1", "--warmup-steps", "0",
                          "--lr-warmup-epochs", "0", "--seed", str(2**32 - 1)))


def test_bad_numbers_refused_in_one_line_before_any_worker_starts(tmp_path):
    for argv, message in [
        (("--validation-steps", "0"), "--validation-steps 0: must be >= 1"),
        (("--warmup-steps", "-3"), "--warmup-steps -3: must be >= 0"),
        (("--workers", "0"), "--workers 0: must be at least 1"),
    ]:
        proc = run_chexflow("train", "--data", tmp_path, "--out", tmp_path / "o", *argv,
                            check=False)
        assert proc.returncode == 2, proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith(f"chexflow train: error: {message}"), line
        assert "launch:" not in proc.stdout and not (tmp_path / "o").exists()
