"""The pipelines by name, and compiling them to IR YAML."""

from __future__ import annotations

from pathlib import Path

from chexflow.errors import ChexflowError

PIPELINES = ("chexnet-train", "scaling-study", "tune-then-train")
COMPILED_DIR = Path(__file__).resolve().parent


def build(name: str, trainer_image: str | None = None, launcher_image: str | None = None):
    """The @dsl.pipeline function for `name` (image defaults baked in as parameters)."""
    if name == "chexnet-train":
        from chexflow.pipelines.chexnet_train import build as b

        return b(trainer_image)
    if name == "scaling-study":
        from chexflow.pipelines.scaling_study import build as b

        return b(trainer_image)
    if name == "tune-then-train":
        from chexflow.pipelines.tune_then_train import build as b

        return b(trainer_image, launcher_image)
    raise ChexflowError(f"pipeline {name!r}: expected one of {', '.join(PIPELINES)}")


def compile_pipeline(name: str, out_dir: Path = COMPILED_DIR, trainer_image: str | None = None,
                     launcher_image: str | None = None) -> Path:
    """Write OUT_DIR/NAME.yaml (KFP IR, uploadable to the Kubeflow Pipelines UI)."""
    import yaml
    from kfp import compiler

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.yaml"
    compiler.Compiler().compile(build(name, trainer_image, launcher_image), str(path))
    if launcher_image:  # the components' own image (their base_image is fixed at import)
        docs = list(yaml.safe_load_all(path.read_text()))
        for executor in docs[0]["deploymentSpec"]["executors"].values():
            executor["container"]["image"] = launcher_image
        path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path
