"""`chexflow images render`: every artefact a cluster is given, for the chosen images
(chexflow.container_images): the pipelines' and components' IR YAML (compile), the TrainJob
runtime, KServe's ClusterServingRuntime, the Katib trial templates ConfigMap and the specs that
carry its templates inline.

All are written into a temporary folder beside the destination first and moved into place once
every one is made, so a failure leaves the destination as it was.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from chexflow.envs import REPO_ROOT
from chexflow.folders import writable_folder
from chexflow.jobs import trainjob
from chexflow.katib.experiment import chexnet_template as katib_templates
from chexflow.katib.experiment.templates import TEMPLATES_FILE
from chexflow.pipelines import registry
from chexflow.serve import render as serving


def _destinations(out: Path | None) -> dict[str, Path]:
    """Each artefact folder, under `out` or the project's own."""
    if out is None:
        return {"pipelines": registry.pipelines_dir(), "components": registry.components_dir(),
                "trainjob": trainjob.RUNTIME_FILE.parent,
                "serving": serving.RUNTIME_FILE.parent, "katib": katib_templates.katib_dir()}
    return {name: out / name
            for name in ("pipelines", "components", "trainjob", "serving", "katib")}


def _make(tmp: Path) -> None:
    """Every artefact under `tmp`, in the destinations' layout."""
    for name in registry.pipeline_names():
        registry.compile_pipeline(name, tmp / "pipelines")
    registry.compile_components(tmp / "components")
    (tmp / "trainjob").mkdir()
    (tmp / "trainjob" / trainjob.RUNTIME_FILE.name).write_text(trainjob.runtime_text())
    (tmp / "serving").mkdir()
    (tmp / "serving" / serving.RUNTIME_FILE.name).write_text(serving.runtime_text())
    specs = tmp / "katib" / katib_templates.SPECS_DIR
    specs.mkdir(parents=True)
    (tmp / "katib" / TEMPLATES_FILE).write_text(katib_templates.templates_text())
    made = katib_templates.templates()
    for spec in sorted((katib_templates.katib_dir() / katib_templates.SPECS_DIR).glob("*.yaml")):
        text = spec.read_text()
        if katib_templates.MARKER_RE.search(text):
            (specs / spec.name).write_text(katib_templates.spec_text(text, made))


def render_all(out: Path | None = None) -> list[Path]:
    """Write the artefacts (under `out`, else in place); the paths written."""
    where = _destinations(out)
    base = Path(out) if out is not None else REPO_ROOT
    writable_folder(base, "--out")
    written = []
    with tempfile.TemporaryDirectory(dir=base, prefix=".chexflow-render-") as tmp:
        _make(Path(tmp))
        for name, dest in where.items():
            for made in sorted(p for p in (Path(tmp) / name).rglob("*") if p.is_file()):
                target = dest / made.relative_to(Path(tmp) / name)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(made, target)  # a rename: the temporary folder is beside them
                written.append(target)
    return written
