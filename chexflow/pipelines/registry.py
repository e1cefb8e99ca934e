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
import contextlib
import functools
import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from chexflow.container_images import check_reference, header_lines
from chexflow.envs import REPO_ROOT
from chexflow.errors import ChexflowError
from chexflow.folders import writable_folder

PIPELINES_DIR_ENV = "CHEXFLOW_PIPELINES_DIR"
RENDER_COMMAND = "chexflow compile --out DIR"


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
    node = _pipeline_function(path)
    args = node.args.args
    defaults = [None] * (len(args) - len(node.args.defaults)) + node.args.defaults
    own = [_parameter(a, d) for a, d in zip(args, defaults, strict=True)]
    return own + _cluster_parameters(node, path)


def _pipeline_function(path: Path) -> ast.FunctionDef:
    """The function decorated with @dsl.pipeline(...) in a definition file."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.FunctionDef) and any(
            isinstance(d, ast.Call) and getattr(d.func, "attr", getattr(d.func, "id", None))
            == "pipeline" for d in node.decorator_list
        ):
            return node
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


class _Unknown:
    """A default that cannot be read without running the definition."""


UNKNOWN = _Unknown()
CHEXFLOW_DIR = Path(__file__).resolve().parents[1]


def _module_file(module: str) -> Path | None:
    """The source file of a chexflow module, found without importing it."""
    if module != "chexflow" and not module.startswith("chexflow."):
        return None
    rel = Path(*module.split(".")[1:])
    for path in (CHEXFLOW_DIR / rel.with_suffix(".py"), CHEXFLOW_DIR / rel / "__init__.py"):
        if path.is_file():
            return path
    return None


@functools.cache
def _module_names(path: Path) -> dict[str, ast.expr | tuple[str, str]]:
    """A file's top-level names: assigned (NAME = expr) or imported from a module."""
    names: dict[str, ast.expr | tuple[str, str]] = {}
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Name):
            names[node.targets[0].id] = node.value
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                names[alias.asname or alias.name] = (node.module, alias.name)
    return names


def _static_value(expr: ast.expr, path: Path) -> Any:
    """A default's value read from the source, as the definition would compute it: literals,
    names assigned in the file or imported from a chexflow module (read the same way),
    f-strings of those, `a or b` (a build() argument, None unless given, is skipped), and a
    call without arguments of a function imported from a chexflow module that imports without
    kfp (the image defaults); UNKNOWN otherwise."""
    with contextlib.suppress(ValueError, TypeError, SyntaxError, RecursionError):
        return ast.literal_eval(expr)
    if isinstance(expr, ast.Name):
        found = _module_names(path).get(expr.id)
        if isinstance(found, ast.expr):
            return _static_value(found, path)
        if isinstance(found, tuple) and (source := _module_file(found[0])) is not None:
            return _static_value(ast.Name(found[1]), source)
        return UNKNOWN
    if isinstance(expr, ast.JoinedStr):
        parts = [_static_value(v.value, path) if isinstance(v, ast.FormattedValue) else v.value
                 for v in expr.values]
        return UNKNOWN if UNKNOWN in parts else "".join(map(str, parts))
    if isinstance(expr, ast.BoolOp) and isinstance(expr.op, ast.Or):
        values = [_static_value(v, path) for v in expr.values]
        return next((v for v in values if v is not UNKNOWN and v), UNKNOWN)
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and not expr.args \
            and not expr.keywords:
        found = _module_names(path).get(expr.func.id)
        if isinstance(found, tuple) and _module_file(found[0]) is not None:
            try:
                return getattr(importlib.import_module(found[0]), found[1])()
            except Exception:  # noqa: BLE001 - a module that needs kfp, a failing default
                return UNKNOWN
    return UNKNOWN


def signature_defaults(name: str) -> dict[str, Any]:
    """Each optional parameter's default in pipeline `name`'s signature, also those it names
    (DEFAULT_NAMESPACE, trainer_image(), ...), read from the source (UNKNOWN where it cannot
    be)."""
    path = definition_file(name)
    params = {p.name: p for p in pipeline_parameters(name)}
    out = {n: p.default for n, p in params.items() if not p.required}
    node = _pipeline_function(path)
    args = node.args.args
    for arg, default in zip(args[len(args) - len(node.args.defaults):], node.args.defaults,
                            strict=True):
        out[arg.arg] = _static_value(default, path)
    return out


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
    for given, flag in ((trainer_image, "--trainer-image"), (launcher_image, "--launcher-image")):
        if given:
            check_reference(given, flag)
    path = out_dir / f"{name}.yaml"
    compiler.Compiler().compile(build(name, trainer_image, launcher_image), str(path))
    if launcher_image:  # the components' own image (their base_image is fixed at import)
        docs = list(yaml.safe_load_all(path.read_text()))
        for executor in docs[0]["deploymentSpec"]["executors"].values():
            executor["container"]["image"] = launcher_image
        path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    _add_header(path, ("trainer", "launcher"), trainer_image, launcher_image)
    return path


def _add_header(path: Path, roles: tuple[str, ...], trainer_image: str | None = None,
                launcher_image: str | None = None) -> None:
    """The compiled file's first lines: which images it names (container_images.header_lines)."""
    given = {"trainer": trainer_image, "launcher": launcher_image}
    path.write_text(header_lines(RENDER_COMMAND, roles, given) + path.read_text())


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
            _add_header(path, ("launcher",))
            paths.append(path)
    return paths
