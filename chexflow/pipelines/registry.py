"""The pipelines by name, loaded from their definition files, and compiling them to IR YAML.

A pipeline is a file `pipelines/<name with underscores>.py` in the project (the folder a user
opens and edits), defining `NAME` and `build(...)`, which returns the `@dsl.pipeline` function,
and optionally `RUN_DEFAULTS`, the parameters `chexflow run` sets where the signature's defaults
(a cluster's) are too big for this machine: with the signature, one table of defaults.
It is loaded by path, as `kfp dsl compile --py FILE` does; the compiled IR YAML goes beside it.
`CHEXFLOW_PIPELINES_DIR` points at another folder of definitions.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from chexflow.envs import REPO_ROOT
from chexflow.errors import ChexflowError
from chexflow.folders import writable_folder

PIPELINES_DIR_ENV = "CHEXFLOW_PIPELINES_DIR"


def pipelines_dir() -> Path:
    """The folder holding the pipeline definitions and their compiled YAML."""
    return Path(os.environ.get(PIPELINES_DIR_ENV) or REPO_ROOT / "pipelines")


def components_dir() -> Path:
    """The folder for the components' compiled YAML (`components/` beside `pipelines/`)."""
    return pipelines_dir().parent / "components"


def pipeline_names() -> tuple[str, ...]:
    """The names of the pipelines defined in pipelines_dir(), sorted."""
    return tuple(sorted(p.stem.replace("_", "-") for p in pipelines_dir().glob("*.py")
                        if not p.name.startswith("_")))


def definition_file(name: str) -> Path:
    path = pipelines_dir() / f"{name.replace('-', '_')}.py"
    if not path.is_file():
        known = ", ".join(pipeline_names()) or "none"
        raise ChexflowError(f"pipeline {name!r}: no {path} (pipelines there: {known})")
    return path


@dataclass(frozen=True)
class Parameter:
    """A pipeline parameter as its signature states it."""

    name: str
    type: str  # the annotation: str, int, float, bool, list or dict
    required: bool
    default: Any = None  # None also when the default is not a literal (set by the definition)


def pipeline_parameters(name: str) -> list[Parameter]:
    """The parameters of pipeline `name`, in order, read from the signature of the
    `@dsl.pipeline` function in its definition file. The file is parsed, not run: the CLI builds
    its parsers in environments without kfp."""
    path = definition_file(name)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.FunctionDef) and any(
            isinstance(d, ast.Call) and getattr(d.func, "attr", getattr(d.func, "id", None))
            == "pipeline" for d in node.decorator_list
        ):
            args = node.args.args
            defaults = [None] * (len(args) - len(node.args.defaults)) + node.args.defaults
            own = [_parameter(a, d) for a, d in zip(args, defaults, strict=True)]
            return own + _cluster_parameters(node, path)
    raise ChexflowError(f"{path}: no function decorated with @dsl.pipeline(...)")


def _cluster_parameters(node: ast.FunctionDef, path: Path) -> list[Parameter]:
    """The parameters `@cluster_parameters` gives a `**cluster` function (ClusterOptions')."""
    from chexflow.jobs.spec import ClusterOptions

    decorated = any(getattr(d, "id", getattr(d, "attr", None)) == "cluster_parameters"
                    for d in node.decorator_list)
    if decorated != (node.args.kwarg is not None):
        raise ChexflowError(f"{path}: {node.name}: @cluster_parameters and **cluster go together")
    if not decorated:
        return []
    return [Parameter(name, typ.__name__, required=False, default=default)
            for name, (typ, default) in ClusterOptions.pipeline_parameters().items()]


def run_defaults(name: str) -> dict[str, Any]:
    """What `chexflow run` gives pipeline `name` unless told: the signature's literal defaults,
    over them the definition's RUN_DEFAULTS (read, not run, as the signature is)."""
    params = {p.name: p for p in pipeline_parameters(name)}
    out = {p.name: p.default for p in params.values() if p.default is not None}
    path = definition_file(name)
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [
                "RUN_DEFAULTS"]:
            try:
                table = ast.literal_eval(node.value)
            except ValueError:
                table = None
            if not isinstance(table, dict):
                raise ChexflowError(f"{path}: RUN_DEFAULTS must be a literal dict")
            unknown = sorted(set(table) - set(params))
            if unknown:
                raise ChexflowError(f"{path}: RUN_DEFAULTS {unknown}: not parameters of {name}")
            out.update(table)
    return out


def _parameter(arg: ast.arg, default: ast.expr | None) -> Parameter:
    typ = arg.annotation.id if isinstance(arg.annotation, ast.Name) else "str"
    if default is None:
        return Parameter(arg.arg, typ, required=True)
    try:
        value = ast.literal_eval(default)
    except ValueError:
        value = None
    return Parameter(arg.arg, typ, required=False, default=value)


def load(name: str) -> ModuleType:
    """The definition module of pipeline `name`, executed once per process."""
    path = definition_file(name)
    module_name = f"chexflow_pipeline_{path.stem}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception:
        del sys.modules[module_name]
        raise
    if getattr(module, "NAME", None) != name or not callable(getattr(module, "build", None)):
        raise ChexflowError(f"{path}: expected NAME = {name!r} and a build() function")
    return module


def build(name: str, trainer_image: str | None = None, launcher_image: str | None = None,
          mount_path: str | None = None):
    """The @dsl.pipeline function for `name` (image defaults baked in as parameters; the data
    PVC mounted at `mount_path` in every pod, else at the definition's default)."""
    import inspect

    builder = load(name).build
    accepted = inspect.signature(builder).parameters
    kwargs = {"mount_path": mount_path} if mount_path else {}
    if kwargs and "mount_path" not in accepted:
        raise ChexflowError(f"{definition_file(name)}: build() takes no mount_path; the jobs' "
                            "pods cannot mount the data PVC elsewhere")
    if "default_launcher_image" in accepted:
        return builder(trainer_image, launcher_image, **kwargs)
    return builder(trainer_image, **kwargs)


def compile_pipeline(name: str, out_dir: Path | None = None, trainer_image: str | None = None,
                     launcher_image: str | None = None) -> Path:
    """Write OUT_DIR/NAME.yaml (KFP IR, uploadable to the Kubeflow Pipelines UI)."""
    import yaml
    from kfp import compiler

    out_dir = Path(out_dir or pipelines_dir())
    writable_folder(out_dir, "--out")
    path = out_dir / f"{name}.yaml"
    compiler.Compiler().compile(build(name, trainer_image, launcher_image), str(path))
    if launcher_image:  # the components' own image (their base_image is fixed at import)
        docs = list(yaml.safe_load_all(path.read_text()))
        for executor in docs[0]["deploymentSpec"]["executors"].values():
            executor["container"]["image"] = launcher_image
        path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


def compile_components(out_dir: Path | None = None) -> list[Path]:
    """Write each KFP component of chexflow.components.definitions to OUT_DIR/NAME.yaml, for
    `kfp.components.load_component_from_file` in a user's own pipelines."""
    from kfp import compiler
    from kfp.dsl.base_component import BaseComponent

    from chexflow.components import definitions

    out_dir = Path(out_dir or components_dir())
    writable_folder(out_dir, "--components-out")
    paths = []
    for attr, component in sorted(vars(definitions).items()):
        if isinstance(component, BaseComponent) and attr.endswith("_op"):
            path = out_dir / f"{attr.removesuffix('_op').replace('_', '-')}.yaml"
            compiler.Compiler().compile(component, str(path))
            paths.append(path)
    return paths
