"""Evaluation under bad input (issue 18): numeric options range-checked in one line, a model
refused on data with other class names or another image size (from the model's run record),
one evaluation per --out folder, and no evaluation of a split without images."""

from __future__ import annotations

import pytest

from tests.conftest import run_chexflow


@pytest.mark.parametrize(("argv", "message"), [
    (("--batch-size", "0"), "--batch-size 0: must be >= 1"),
    (("--bootstrap", "-1"), "--bootstrap -1: must be >= 0"),
    (("--seed", "-2"), "--seed -2: must be in [0, 4294967295]"),
])
def test_evaluate_numeric_option_out_of_range_is_refused(tmp_path, argv, message):
    proc = run_chexflow("evaluate", "--data", tmp_path, "--model", tmp_path, "--out",
                        tmp_path / "ev", *argv, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"chexflow evaluate: error: {message}"]
    assert not (tmp_path / "ev").exists()
