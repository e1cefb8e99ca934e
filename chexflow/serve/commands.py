"""`chexflow serve render|deploy|local`: a trained model as a KServe InferenceService (rendered,
or created and waited for), or the same predictor as a local process."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DESCRIPTION = (
    "A trained model behind KServe's model server (chexflow.serve.predictor: the v1 and Open "
    "Inference (v2) protocols, images as PNG/JPEG/DICOM bytes or pixels, 14 probabilities). "
    "`render` prints the InferenceService, `deploy` creates it (and chexflow's "
    "ClusterServingRuntime, serving/chexflow-runtime.yaml) and waits until it is Ready, "
    "`local` serves a model folder on this machine.")


def _isvc_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL",
                   help="storage URI of a training run folder or .keras file: pvc://CLAIM/PATH "
                        "(mounted, no init container), s3://, gs://, https://")
    p.add_argument("--name", default="chexnet",
                   help="the InferenceService's name (default: %(default)s)")
    p.add_argument("--namespace", default="default", help="(default: %(default)s)")
    p.add_argument("--cpu", default="1", help="CPU of the predictor (default: %(default)s)")
    p.add_argument("--memory", default="2Gi",
                   help="memory of the predictor (default: %(default)s)")
    p.add_argument("--service-account", default=None,
                   help="the predictor's service account (default: the namespace's default)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a trained model with KServe (InferenceService)",
                       description=DESCRIPTION)
    actions = p.add_subparsers(dest="serve_command", required=True, metavar="ACTION")

    r = actions.add_parser("render", help="print the InferenceService of a model",
                           description="Print (or write) the InferenceService (RawDeployment, "
                           "chexflow's runtime) as `kubectl apply -f` takes it.")
    _isvc_arguments(r)
    r.add_argument("--out", type=Path, default=None, help="write it here (default: stdout)")
    r.set_defaults(func=run_render)

    d = actions.add_parser("deploy", help="create the InferenceService and wait until Ready",
                           description="Create chexflow's ClusterServingRuntime when missing "
                           "and the InferenceService (a new model replaces the one of the same "
                           "name), then wait until KServe reports it Ready; why it is not (the "
                           "predictor pod's image pull, scheduling, a crash and its log) is "
                           "one line.")
    _isvc_arguments(d)
    d.add_argument("--timeout", type=float, default=600,
                   help="seconds to wait for Ready (default: %(default)s)")
    d.add_argument("--update-runtime", action="store_true",
                   help="replace a ClusterServingRuntime chexflow-predictor that differs")
    d.add_argument("--image", default=None,
                   help="the predictor's image (default: the chosen trainer image)")
    d.set_defaults(func=run_deploy)

    local = actions.add_parser("local", help="serve a model folder on this machine",
                               description="KServe's model server for a training run folder or "
                               ".keras file, on this machine (the predictor the runtime runs).")
    local.add_argument("model", type=Path, metavar="MODEL",
                       help="best_model.keras, or a chexflow train --out")
    local.add_argument("--name", default="chexnet", help="model name (default: %(default)s)")
    local.add_argument("--http-port", type=int, default=8080, help="(default: %(default)s)")
    local.add_argument("--grpc-port", type=int, default=8081, help="(default: %(default)s)")
    local.set_defaults(func=run_local, trainer=True)


def _isvc(args: argparse.Namespace) -> dict:
    from chexflow.serve.render import inference_service

    return inference_service(args.name, args.model, namespace=args.namespace, cpu=args.cpu,
                             memory=args.memory, service_account=args.service_account)


def run_render(args: argparse.Namespace) -> int:
    import yaml

    text = yaml.safe_dump(_isvc(args), sort_keys=False)
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text)
        print(f"serve render: wrote {args.out}")
    return 0


def run_deploy(args: argparse.Namespace) -> int:
    from chexflow.kube import load_api_client
    from chexflow.serve.deploy import deploy

    isvc = _isvc(args)
    done = deploy(load_api_client(), isvc, args.namespace, timeout=args.timeout,
                  update_runtime=args.update_runtime, image=args.image)
    print(f"serve deploy: InferenceService {done.namespace}/{done.name} Ready at {done.url}"
          + (f" (predictor pod {done.pod_ip}:8080)" if done.pod_ip else ""))
    print(f"  curl -X POST {done.url}/v1/models/{done.name}:predict "
          "-d '{\"instances\": [{\"b64\": \"'$(base64 -w0 IMAGE.png)'\"}]}'")
    return 0


def run_local(args: argparse.Namespace) -> int:
    from chexflow.serve.predictor import main

    main([f"--model_name={args.name}", f"--model_dir={args.model}",
          f"--http_port={args.http_port}", f"--grpc_port={args.grpc_port}"])
    return 0
