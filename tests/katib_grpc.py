"""gRPC calls to Katib's services for tests/test_katib_images.py. The tests run it inside a
container's network namespace (nsenter -n), where the service listens on 127.0.0.1; it prints one
JSON document. Katib's API messages come from katib-db-manager's server reflection (Katib's own
api.proto, compiled into the binary), so no generated stubs are needed.

    python katib_grpc.py health ADDR
    python katib_grpc.py descriptors ADDR OUT            # api.proto as a FileDescriptorSet
    python katib_grpc.py report ADDR TRIAL METRIC=VALUE@RFC3339 ...   # ReportObservationLog
    python katib_grpc.py observations ADDR TRIAL METRIC  # GetObservationLog
    python katib_grpc.py suggest ADDR DESCRIPTORS REQUEST_JSON   # GetSuggestions
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

API = "api.v1.beta1"
TIMEOUT = 30


def health(channel: grpc.Channel) -> str:
    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                      timeout=TIMEOUT)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def reflected_pool(channel: grpc.Channel) -> descriptor_pool.DescriptorPool:
    return descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(channel))


def call(pool: descriptor_pool.DescriptorPool, channel: grpc.Channel, service: str, method: str,
         request: dict) -> dict:
    """`service.method(request)` with messages built from the pool's descriptors."""
    desc = pool.FindServiceByName(f"{API}.{service}").FindMethodByName(method)
    req = json_format.ParseDict(request, message_factory.GetMessageClass(desc.input_type)())
    reply_cls = message_factory.GetMessageClass(desc.output_type)
    rpc = channel.unary_unary(f"/{API}.{service}/{method}",
                              request_serializer=type(req).SerializeToString,
                              response_deserializer=reply_cls.FromString)
    return json_format.MessageToDict(rpc(req, timeout=TIMEOUT))


def main(argv: list[str]) -> object:
    action, addr, *rest = argv
    with grpc.insecure_channel(addr) as channel:
        if action == "health":
            return health(channel)
        if action == "descriptors":
            pool = reflected_pool(channel)
            fds = descriptor_pb2.FileDescriptorSet()
            pool.FindServiceByName(f"{API}.DBManager").file.CopyToProto(fds.file.add())
            Path(rest[0]).write_bytes(fds.SerializeToString())
            return [f.name for f in fds.file]
        if action == "report":
            trial, *points = rest
            logs = []
            for point in points:
                metric, stamp = point.rsplit("@", 1)
                name, value = metric.split("=", 1)
                logs.append({"timeStamp": stamp, "metric": {"name": name, "value": value}})
            return call(reflected_pool(channel), channel, "DBManager", "ReportObservationLog",
                        {"trialName": trial, "observationLog": {"metricLogs": logs}})
        if action == "observations":
            trial, metric = rest
            return call(reflected_pool(channel), channel, "DBManager", "GetObservationLog",
                        {"trialName": trial, "metricName": metric})
        if action == "suggest":
            fds = descriptor_pb2.FileDescriptorSet.FromString(Path(rest[0]).read_bytes())
            pool = descriptor_pool.DescriptorPool()
            for f in fds.file:
                pool.AddSerializedFile(f.SerializeToString())
            return call(pool, channel, "Suggestion", "GetSuggestions", json.loads(rest[1]))
    raise SystemExit(f"katib_grpc.py: unknown action {action!r}")


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
