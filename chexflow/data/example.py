"""Reading one serialized tf.train.Example without TensorFlow (the checks before training and
evaluation run without it): the messages of tensorflow/core/example/example.proto and
feature.proto, declared here for protobuf's own parser.

    message BytesList { repeated bytes value = 1; }
    message FloatList { repeated float value = 1 [packed = true]; }
    message Int64List { repeated int64 value = 1 [packed = true]; }
    message Feature { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
                                   Int64List int64_list = 3; } }
    message Features { map<string, Feature> feature = 1; }
    message Example { Features features = 1; }
"""

from __future__ import annotations

from functools import cache

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

F = descriptor_pb2.FieldDescriptorProto
PACKAGE = "chexflow.tensorflow"  # not TensorFlow's own package: no clash where TF is loaded too


def _message(name: str, *fields: tuple[str, int, int, str | None, int],
             oneof: str | None = None) -> descriptor_pb2.DescriptorProto:
    """A message of (name, number, type, message type, label) fields."""
    message = descriptor_pb2.DescriptorProto(name=name)
    if oneof:
        message.oneof_decl.add(name=oneof)
    for field_name, number, kind, type_name, label in fields:
        field = message.field.add(name=field_name, number=number, type=kind, label=label)
        if type_name:
            field.type_name = f".{PACKAGE}.{type_name}"
        if oneof:
            field.oneof_index = 0
    return message


@cache
def _example_class() -> type:
    opt, rep = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    file = descriptor_pb2.FileDescriptorProto(name="chexflow/example.proto", package=PACKAGE,
                                              syntax="proto3")
    for name, kind in (("BytesList", F.TYPE_BYTES), ("FloatList", F.TYPE_FLOAT),
                       ("Int64List", F.TYPE_INT64)):
        file.message_type.append(_message(name, ("value", 1, kind, None, rep)))
    file.message_type.append(_message(
        "Feature", ("bytes_list", 1, F.TYPE_MESSAGE, "BytesList", opt),
        ("float_list", 2, F.TYPE_MESSAGE, "FloatList", opt),
        ("int64_list", 3, F.TYPE_MESSAGE, "Int64List", opt), oneof="kind"))
    features = _message("Features", ("feature", 1, F.TYPE_MESSAGE, "Features.FeatureEntry", rep))
    entry = _message("FeatureEntry", ("key", 1, F.TYPE_STRING, None, opt),
                     ("value", 2, F.TYPE_MESSAGE, "Feature", opt))
    entry.options.map_entry = True
    features.nested_type.append(entry)
    file.message_type.append(features)
    file.message_type.append(_message("Example", ("features", 1, F.TYPE_MESSAGE, "Features", opt)))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.Example"))


def example_features(raw: bytes) -> dict[str, list]:
    """A serialized tf.train.Example as {feature name: its values (bytes, floats or ints)}.
    Raises ValueError for bytes that are not one."""
    try:
        example = _example_class().FromString(raw)
    except DecodeError as e:
        raise ValueError(f"not a tf.train.Example ({e})") from None
    out = {}
    for name, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        out[name] = list(getattr(feature, kind).value) if kind else []
    return out
