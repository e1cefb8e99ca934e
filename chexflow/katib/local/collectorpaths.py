"""Where a local trial's files go: STATE/trials/NAME, and the folder Katib mounts for the
metrics collector, which the container path in the trial's command is rewritten to.

Katib mounts an emptyDir at the collector's folder in each trial pod (`getMountPath`,
`mutateMetricsCollectorVolume`: the metrics file's folder, /var/log/katib for StdOut, the
TensorFlowEvent folder). Locally that is STATE/trials/NAME/metrics, emptied for each attempt,
unless the folder lies on one of the trialSpec's volumes, which map to local folders as usual.
A TensorFlowEvent program is often given the folder above the collector's (Katib's
tf-mnist-with-summaries: `--log-path=/mnist-with-summaries-logs`, collector on its `test`):
that folder then stands for STATE/trials/NAME/metrics and the collector's is the subfolder.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from chexflow.katib.experiment.model import DEFAULT_FILE_PATH, Experiment
from chexflow.katib.experiment.trialspec import (
    PathMaps,
    map_paths,
    override_args,
    parent_named,
    primary_container,
    render_command_string,
    render_trial_spec,
    trial_values,
    volume_mounts,
)
from chexflow.katib.local.state import TrialRecord


@dataclass
class TrialFolders:
    exp: Experiment
    state_dir: Path
    trial_command: str | None
    volumes: dict[str, Path]
    trial_args: list[str]
    create: bool = True  # make the folders (not for a dry run, which only names them)

    def trial_dir(self, rec: TrialRecord) -> Path:
        d = self.state_dir / "trials" / rec.name
        if self.create:
            d.mkdir(parents=True, exist_ok=True)
        return d

    def collector_folder(self) -> str | None:
        """The container folder Katib mounts for the collector (StdOut: /var/log/katib, where
        Katib's wrapper writes the output and its pid file)."""
        c = self.exp.collector
        if c.kind == "StdOut":  # Katib mounts its folder at /var/log/katib for StdOut too
            return os.path.dirname(DEFAULT_FILE_PATH)
        if c.kind == "File":
            return os.path.dirname(c.path)
        return c.path.rstrip("/") if c.kind == "TensorFlowEvent" else None

    def command_text(self, rec: TrialRecord) -> str:
        """The trial's command line as written (--trial-command, or the primary container's
        command and args), its values substituted."""
        if self.trial_command is not None:
            values = trial_values(self.exp, rec.name, rec.parameters)
            return render_command_string(self.trial_command, values)
        container, _ = primary_container(self.exp, render_trial_spec(self.exp, rec.name,
                                                                     rec.parameters))
        argv = (container.get("command") or []) + (container.get("args") or [])
        return " ".join(override_args([str(a) for a in argv], self.trial_args))

    def paths(self, rec: TrialRecord) -> tuple[str, Path] | None:
        """(container folder, local folder) of the collector's folder: a trialSpec volume's
        local folder when it lies on one, else STATE/trials/NAME/metrics. For TensorFlowEvent,
        the container folder is the highest folder above the collector's that the command
        names (parent_named), so the program's own subfolders land in the trial's folder."""
        folder = self.collector_folder()
        if folder is None:
            return None
        if self.trial_command is None:
            spec = render_trial_spec(self.exp, rec.name, rec.parameters)
            _, pods = primary_container(self.exp, spec)
            mounts = volume_mounts(pods, self.volumes, self.state_dir / "volumes", self.create)
            mapped = map_paths([folder], mounts)[0]
            if mapped != folder:
                return folder, Path(mapped)
        local = self.trial_dir(rec) / "metrics"
        if self.exp.collector.kind == "TensorFlowEvent":
            folder = parent_named(folder, self.command_text(rec))
        if self.create:
            (local / os.path.relpath(self.collector_folder(), folder)).mkdir(parents=True,
                                                                            exist_ok=True)
        return folder, local

    def empty_metrics(self, rec: TrialRecord) -> None:
        """A new attempt starts with an empty collector folder (Katib: a new pod's own one)."""
        local = self.trial_dir(rec) / "metrics"
        if local.is_dir():
            shutil.rmtree(local)

    def collected(self, rec: TrialRecord) -> Path:
        """The local file (File) or folder (TensorFlowEvent) the collector reads."""
        folder, local = self.paths(rec)
        return local / os.path.relpath(self.exp.collector.path.rstrip("/"), folder)

    def path_maps(self, rec: TrialRecord) -> PathMaps:
        """(container path, local path, paths below it too) for the trial's command: the
        collector's folder and what lies below it; a folder above it named by the command
        (`paths`), only where it is named as a whole."""
        paths = self.paths(rec)
        if paths is None:
            return []
        folder, local = paths
        inner = self.collector_folder()
        if inner == folder:
            return [(folder, local, True)]
        return [(inner, local / os.path.relpath(inner, folder), True), (folder, local, False)]
