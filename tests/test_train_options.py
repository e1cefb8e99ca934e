"""TrainOptions: the one description of a training run's options, from which the worker's
parser is made and every worker command line is built."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from chexflow.errors import ChexflowError
from chexflow.train.options import TrainOptions, add_train_arguments


def worker_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_train_arguments(p, launcher=False)
    return p


def test_argv_parses_back_to_the_same_options():
    options = TrainOptions(data=Path("/d"), out=Path("/o"), model="resnet50", lr=0.01,
                           batch_size=8, amp=True, steps_per_epoch=3, weight_decay=1e-4)
    argv = options.to_argv()
    assert "--xla" not in argv and "--validation-steps" not in argv  # unset / false: left out
    assert TrainOptions.from_namespace(worker_parser().parse_args(argv)) == options
    defaults = worker_parser().parse_args(["--out", "/o"])
    assert TrainOptions.from_namespace(defaults) == TrainOptions(out=Path("/o"))


def test_worker_command_and_values_converted_to_field_types():
    options = TrainOptions(out=Path("/o")).with_values(
        {"batch-size": "32", "lr": "0.005", "amp": "true", "optimizer": "sgd"}, "test")
    assert (options.batch_size, options.lr, options.amp) == (32, 0.005, True)
    cmd = options.worker_command("/py")
    assert cmd[:3] == ["/py", "-m", "chexflow.train.worker"]
    assert cmd[cmd.index("--optimizer") + 1] == "sgd" and "--amp" in cmd
    with pytest.raises(ChexflowError, match="test: 'out' is not an option"):
        options.with_values({"out": "/x"}, "test", fixed=("data", "out"))
    with pytest.raises(ChexflowError, match="test: epochs 'two' is not int"):
        options.with_values({"epochs": "two"}, "test")


def test_launcher_parser_has_the_same_options_plus_its_own():
    p = argparse.ArgumentParser()
    add_train_arguments(p, launcher=True)
    args = p.parse_args(["--out", "/o", "--workers", "2", "--weights", "imagenet"])
    assert args.workers == 2 and args.launcher == "horovodrun"
    assert TrainOptions.from_namespace(args) == TrainOptions(out=Path("/o"), weights="imagenet")


def test_launcher_local_is_still_accepted_as_horovodrun():
    p = argparse.ArgumentParser()
    add_train_arguments(p, launcher=True)
    assert p.parse_args(["--out", "/o", "--launcher", "local"]).launcher == "horovodrun"
    assert p.parse_args(["--out", "/o", "--launcher", "none"]).launcher == "none"


def test_train_op_takes_trainoptions_fields_with_their_types_and_defaults():
    """KFP reads train_op's inputs from its source: each is a job input or a TrainOptions
    field of the same type (`flip`: not no_flip), with TrainOptions' default where it has one
    (0 for None), and train_options() turns them into one TrainOptions."""
    from chexflow.components.definitions import train_op
    from chexflow.components.steps import TRAIN_OP_JOB_INPUTS, train_options

    kfp_types = {str: "String", int: "Integer", float: "Float", bool: "Boolean"}
    defaults = TrainOptions()
    spec = train_op.component_spec
    inputs = {**spec.inputs, "metrics": spec.outputs["metrics"]}  # an Output parameter
    options = [n for n in inputs if n not in TRAIN_OP_JOB_INPUTS]
    assert set(TRAIN_OP_JOB_INPUTS) <= set(inputs) and "flip" in options
    for name in options:
        field = "no_flip" if name == "flip" else name
        assert field in TrainOptions.names(), f"train_op input {name}: no TrainOptions field"
        assert inputs[name].type == kfp_types[TrainOptions.value_type(field)], name
        if inputs[name].optional:
            default = getattr(defaults, field)
            assert inputs[name].default == ({None: 0}.get(default, default) if name != "flip"
                                            else not default), name
    given = {"model": "resnet50", "epochs": 2, "steps_per_epoch": 0, "validation_steps": 3,
             "threads": 0, "flip": False, "workers": 2, "target": {}}
    assert train_options(given) == TrainOptions(model="resnet50", epochs=2, validation_steps=3,
                                                no_flip=True)
