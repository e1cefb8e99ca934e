"""The model `chexflow predict` and `explain` run, with the names of its outputs: the classes its
run record (run.json) or its .keras file holds, as `chexflow evaluate` reads them."""

from __future__ import annotations

import sys
from pathlib import Path

from chexflow.evaluate.record import model_file, run_record, trained_classes
from chexflow.train.rundir import model_info


def output_names(model: Path, outputs: int) -> list[str]:
    """The classes of the model's `outputs` outputs, in order; output_1..N (with a note on
    stderr) for a model that records none, or other than `outputs` of them."""
    found = run_record(model)
    classes = trained_classes(found[1]) if found else None
    if classes is None:
        info = model_info(model_file(model)) or {}
        classes = info.get("classes")
    if classes and len(classes) == outputs:
        return list(classes)
    print(f"note: --model {model} records no class names for its {outputs} outputs; the "
          f"columns are named output_1..output_{outputs}", file=sys.stderr)
    return [f"output_{i + 1}" for i in range(outputs)]


def load(model: Path):
    """(the Keras model of MODEL, a .keras file or a training run folder, its class names)."""
    from chexflow.train.models import load_model

    net = load_model(model)
    return net, output_names(Path(model), int(net.output_shape[-1]))
