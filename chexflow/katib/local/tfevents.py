"""Katib's TensorFlowEvent metrics collector: `python -m chexflow.katib.local.tfevents DIR NAME...`
prints `{NAME: [values in wall-time order]}` as JSON.

Run in the trainer environment (tensorboard's EventAccumulator, as Katib's tfevent collector
image uses). Katib's tag semantics: metric `train/accuracy` takes the tags that start with
`accuracy` in event files whose folder ends with `train`; a metric without a folder takes the
matching tags of every event file. Tensor summaries (TF2 `tf.summary.scalar`) and old-style
scalar summaries are both read.
"""

from __future__ import annotations

import json
import os
import sys


def should_consider(tag: str, metric: str, event_file: str) -> bool:
    """Katib's `_should_consider`."""
    parts = metric.split("/")
    parent = os.path.dirname(metric) if len(parts) >= 2 else os.path.dirname(event_file)
    return tag.startswith(parts[-1]) and os.path.dirname(event_file).endswith(parent)


def collect(directory: str, metrics: list[str]) -> dict[str, list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing.tag_types import SCALARS, TENSORS
    from tensorboard.util.tensor_util import make_ndarray

    found: dict[str, list[tuple[float, int, float]]] = {}
    for root, _, files in os.walk(directory):
        for name in sorted(files):
            path = os.path.join(root, name)
            acc = EventAccumulator(path, size_guidance={SCALARS: 0, TENSORS: 0})
            try:
                acc.Reload()
            except Exception:  # not an event file: Katib's collector skips it too
                continue
            tags = acc.Tags()
            for metric in metrics:
                for tag in tags.get(TENSORS, []):
                    if should_consider(tag, metric, path):
                        found.setdefault(metric, []).extend(
                            (e.wall_time, e.step, float(make_ndarray(e.tensor_proto)))
                            for e in acc.Tensors(tag))
                for tag in tags.get(SCALARS, []):
                    if should_consider(tag, metric, path):
                        found.setdefault(metric, []).extend(
                            (e.wall_time, e.step, float(e.value)) for e in acc.Scalars(tag))
    return {m: [v for _, _, v in sorted(events)] for m, events in found.items()}


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python -m chexflow.katib.local.tfevents DIR METRIC...", file=sys.stderr)
        return 2
    # no folder: no event files, as Katib's os.walk finds none (the objective is unavailable)
    print(json.dumps(collect(argv[0], argv[1:]) if os.path.isdir(argv[0]) else {}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
