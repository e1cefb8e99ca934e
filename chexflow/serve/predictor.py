"""The KServe predictor: a trained chexflow model behind KServe's model server (`kserve.Model`),
answering the v1 protocol (`POST /v1/models/NAME:predict`) and the Open Inference Protocol
(`POST /v2/models/NAME/infer`; gRPC too on --grpc_port) with one probability per class.

Requests carry images as their files' bytes (PNG, JPEG, DICOM), decoded and resized by
training's own decoder (chexflow.data.pixels.decode_greyscale), or as pixels already at the
model's size:

    v1: {"instances": [{"b64": "<base64 of the file>"}, ...]}    (or {"image_bytes": {"b64"}})
        {"instances": [[[p, ...], ...], ...]}                    (size x size grey levels 0-255)
        -> {"predictions": [{"Atelectasis": 0.12, ...}, ...]}
    v2: input BYTES [N] (the files; base64 strings in JSON, raw in the binary extension and
        gRPC) or UINT8/FP32 [N, size, size] or [N, size, size, 1]
        -> output "probabilities" FP32 [N, classes]; the classes in the model's metadata

An image that cannot be decoded or a tensor of the wrong shape is a 400 naming the instance and
why (kserve.errors.InvalidInput); the server keeps serving. Run in the trainer environment as
KServe runs a custom runtime's container:

    python -m chexflow.serve.predictor --model_name chexnet --model_dir /mnt/models
"""

from __future__ import annotations

import argparse
import base64
import binascii
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from chexflow.data.pixels import ImageRejected, decode_greyscale
from chexflow.serve.render import MODEL_DIR

OUTPUT = "probabilities"


class RequestRejected(ValueError):
    """A request the model cannot answer; the message names the instance and why."""


def image_bytes(instance: Any, index: int) -> bytes | None:
    """The file bytes a v1 instance carries ({"b64": ...} or {"image_bytes": {"b64": ...}}),
    None for an instance given as pixels."""
    if not isinstance(instance, dict):
        return None
    inner = instance.get("image_bytes", instance)
    encoded = inner.get("b64") if isinstance(inner, dict) else None
    if not isinstance(encoded, str):
        raise RequestRejected(f"instance {index}: expected {{\"b64\": \"<base64 of a PNG, JPEG "
                              f"or DICOM file>\"}} or a list of pixels, got keys "
                              f"{sorted(instance)}")
    return decode_b64(encoded, index)


def decode_b64(encoded: str | bytes, index: int) -> bytes:
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as e:
        raise RequestRejected(f"instance {index}: not base64 ({e})") from None


def decoded(data: bytes, size: int, index: int) -> np.ndarray:
    """An image file's bytes as size x size x 1 uint8 pixels, as training decodes files."""
    if not data:
        raise RequestRejected(f"instance {index}: an empty image")
    try:
        pixels, _ = decode_greyscale(data, size, f"instance {index}")
    except ImageRejected as e:
        raise RequestRejected(str(e)) from None
    return pixels[..., None]


def pixel_batch(values: Any, size: int) -> np.ndarray:
    """Pixels given as numbers: [N, size, size] or [N, size, size, 1], grey levels 0-255."""
    try:
        array = np.asarray(values, dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise RequestRejected(f"pixels: not a rectangular array of numbers ({e})") from None
    if array.ndim == 3:
        array = array[..., None]
    if array.ndim != 4 or array.shape[1:] != (size, size, 1):
        raise RequestRejected(f"pixels of shape {list(array.shape)}: expected [N, {size}, "
                              f"{size}] or [N, {size}, {size}, 1] (the model's input size), or "
                              "the image files' bytes")
    if not np.isfinite(array).all() or array.min() < 0 or array.max() > 255:
        raise RequestRejected("pixels: expected grey levels from 0 to 255")
    return array


def v1_batch(instances: Any, size: int) -> np.ndarray:
    """The model's input for a v1 request's instances: every one a file, or all pixels."""
    if not isinstance(instances, list) or not instances:
        raise RequestRejected('expected {"instances": [...]} with at least one instance')
    files = [image_bytes(instance, i) for i, instance in enumerate(instances)]
    if all(f is None for f in files):
        return pixel_batch(instances, size)
    if any(f is None for f in files):
        raise RequestRejected("instances mix files ({\"b64\": ...}) and pixels; send one kind")
    return np.stack([decoded(f, size, i) for i, f in enumerate(files)]).astype(np.float32)


def v2_batch(datatype: str, shape: list[int], values: np.ndarray, size: int) -> np.ndarray:
    """The model's input for a v2 request's one input tensor."""
    if datatype == "BYTES":
        if len(shape) != 1:
            raise RequestRejected(f"BYTES input of shape {shape}: expected [N], one image "
                                  "file per element")
        items = values.reshape(-1).tolist()
        if len(items) != shape[0]:
            raise RequestRejected(f"BYTES input of shape {shape} holds {len(items)} elements")
        files = [v if isinstance(v, bytes) else decode_b64(v, i) for i, v in enumerate(items)]
        return np.stack([decoded(f, size, i) for i, f in enumerate(files)]).astype(np.float32)
    if datatype not in ("UINT8", "FP32", "FP64", "INT32", "INT64"):
        raise RequestRejected(f"input datatype {datatype}: expected BYTES (image files) or "
                              "UINT8/FP32 pixels")
    return pixel_batch(values, size)


def v2_input(request) -> tuple[str, list[int], np.ndarray]:
    """(datatype, shape, values) of a v2 request's one input (kserve's InferRequest)."""
    if len(request.inputs) != 1:
        raise RequestRejected(f"{len(request.inputs)} inputs: expected one, the images")
    tensor = request.inputs[0]
    try:
        if tensor.datatype == "BYTES" and tensor.data is not None:
            values = np.asarray(tensor.data, dtype=object)
        else:
            values = tensor.as_numpy()
    except (ValueError, TypeError) as e:
        raise RequestRejected(f"input {tensor.name}: its data do not fit its shape "
                              f"{list(tensor.shape)} and datatype {tensor.datatype} ({e})") \
            from None
    return tensor.datatype, list(tensor.shape), values


def _model_class():
    """ChexflowModel, defined on first use: kserve parses the process's arguments on import."""
    import kserve
    from kserve.errors import InvalidInput
    from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse

    class ChexflowModel(kserve.Model):
        """A chexflow training run (or .keras file) served under `name`."""

        def __init__(self, name: str, model_dir: str | Path):
            super().__init__(name)
            self.model_dir = Path(model_dir)
            self.net = None
            self.classes: list[str] = []
            self.size = 0

        def load(self) -> bool:
            import tensorflow as tf

            from chexflow.explain.model import load

            self.net, self.classes = load(self.model_dir)
            self.size = int(self.net.input_shape[1])
            # one graph for every batch size: an eager call of DenseNet-121 costs its ~400
            # layers' Python overhead on every request (0.4 s for one 64 px image on 2 cores)
            spec = tf.TensorSpec([None, self.size, self.size, 1], tf.float32)
            self.forward = tf.function(lambda x: self.net(x, training=False),
                                       input_signature=[spec])
            self.forward(tf.zeros([1, self.size, self.size, 1]))  # traced before it serves
            self.ready = True
            return self.ready

        def probabilities(self, batch: np.ndarray) -> np.ndarray:
            return self.forward(batch.astype(np.float32)).numpy().astype(np.float32)

        async def predict(self, payload, headers=None, response_headers=None):
            try:
                if isinstance(payload, InferRequest):
                    batch = v2_batch(*v2_input(payload), self.size)
                else:
                    batch = v1_batch(payload.get("instances"), self.size)
            except RequestRejected as e:
                raise InvalidInput(str(e)) from None
            probs = self.probabilities(batch)
            if isinstance(payload, InferRequest):
                out = InferOutput(name=OUTPUT, shape=list(probs.shape), datatype="FP32")
                out.set_data_from_numpy(probs, binary_data=False)
                out.parameters = {"classes": ",".join(self.classes)}
                return InferResponse(model_name=self.name, infer_outputs=[out],
                                     response_id=payload.id or str(uuid.uuid4()))
            return {"predictions": [dict(zip(self.classes, map(float, row), strict=True))
                                    for row in probs]}

        def get_input_types(self) -> list[dict]:
            return [{"name": "images", "datatype": "BYTES", "shape": [-1]}]

        def get_output_types(self) -> list[dict]:
            return [{"name": OUTPUT, "datatype": "FP32", "shape": [-1, len(self.classes)]}]

    return ChexflowModel


def main(argv: list[str] | None = None) -> None:
    import kserve

    parser = argparse.ArgumentParser(parents=[kserve.model_server.parser],
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model_dir", default=MODEL_DIR,
                        help="the training run folder or .keras file (KServe's storageUri mount)")
    args, _ = parser.parse_known_args(argv)
    model = _model_class()(args.model_name, args.model_dir)
    model.load()
    kserve.ModelServer(http_port=args.http_port, grpc_port=args.grpc_port,
                       enable_grpc=args.enable_grpc).start([model])


if __name__ == "__main__":
    main()
