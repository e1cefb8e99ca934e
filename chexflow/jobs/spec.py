"""What a job is: a command for one environment, how many Horovod workers, resources, volumes.

A JobSpec says nothing about where it runs; a backend (chexflow.jobs.local / .kubernetes) does.
`command` is the argv of ONE process (one Horovod rank when `horovod` is true): the local backend
wraps it in `horovodrun`, the kubernetes backend in an MPIJob whose launcher runs `mpirun`.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from typing import Any

from chexflow.errors import ChexflowError

NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME = 52  # leaves room for the "-launcher"/"-worker-N" pod suffixes within 63 characters
ENVIRONMENTS = ("trainer", "control")
QUANTITY_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m|[KMGTPE]i?)?$")
# A worker's requests when `cpu`/`memory` are not given: a share per GPU, or per rank without GPUs.
CPU_PER_SLOT, MEMORY_PER_SLOT = "1", "2Gi"
TOLERATION_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
# The UID of user chexflow in the trainer and launcher images (images/*/Dockerfile USER_UID).
IMAGE_UID = 1000


class JobSpecError(ChexflowError):
    """A job description that cannot be run."""


class JobFailed(ChexflowError):
    """A job ran and failed; the message ends with the tail of its log."""

    def __init__(self, message: str, log_tail: str = "", exit_code: int | None = None):
        super().__init__(message + (f"\n--- log tail ---\n{log_tail}" if log_tail else ""))
        self.log_tail = log_tail
        self.exit_code = exit_code


class JobTimeout(JobFailed):
    """A job ran past its time limit and was ended."""


class JobCancelled(ChexflowError):
    """The process running a job was stopped (SIGTERM, Ctrl-C); the job was deleted."""


@dataclass(frozen=True)
class Volume:
    """A PersistentVolumeClaim mounted at `mount_path` (locally: the path is used as it is)."""

    claim: str
    mount_path: str
    read_only: bool = False


@dataclass
class JobSpec:
    name: str
    command: list[str]
    environment: str = "trainer"
    workers: int = 1
    horovod: bool = False
    gpus_per_worker: int = 0
    slots_per_worker: int = 0  # ranks per worker pod; 0: one per GPU (at least one)
    cpu: str = ""  # per worker; "": cpu_per_gpu x GPUs, or 1 per rank without GPUs
    memory: str = ""  # per worker; "": memory_per_gpu x GPUs, or 2Gi per rank without GPUs
    cpu_per_gpu: str = "4"
    memory_per_gpu: str = "16Gi"
    shm_size: str = "1Gi"
    env: dict[str, str] = field(default_factory=dict)
    volumes: list[Volume] = field(default_factory=list)
    timeout_seconds: int = 3600
    backoff_limit: int | None = None  # None: 2 launcher retries (MPIJob), none (batch Job)
    ttl_seconds_after_finished: int = 3600
    labels: dict[str, str] = field(default_factory=dict)
    working_dir: str | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        where = f"job {self.name!r}"
        if not NAME_RE.match(self.name) or len(self.name) > MAX_NAME:
            raise JobSpecError(
                f"{where}: name must be lowercase letters, digits and '-', start with a letter, "
                f"end with a letter or digit, at most {MAX_NAME} characters"
            )
        if not self.command or not all(isinstance(a, str) for a in self.command):
            raise JobSpecError(f"{where}: command must be a non-empty list of strings")
        if self.environment not in ENVIRONMENTS:
            raise JobSpecError(f"{where}: environment must be one of {ENVIRONMENTS}")
        if self.workers < 1:
            raise JobSpecError(f"{where}: workers must be >= 1, got {self.workers}")
        if self.workers > 1 and not self.horovod:
            raise JobSpecError(f"{where}: workers={self.workers} needs horovod=True")
        if self.gpus_per_worker < 0:
            raise JobSpecError(f"{where}: gpus_per_worker must be >= 0")
        if self.slots_per_worker < 0:
            raise JobSpecError(f"{where}: slots_per_worker must be >= 0 (0: one per GPU)")
        if self.backoff_limit is not None and self.backoff_limit < 0:
            raise JobSpecError(f"{where}: backoff_limit must be >= 0")
        for key in ("cpu", "memory", "cpu_per_gpu", "memory_per_gpu", "shm_size"):
            value = getattr(self, key)
            if (value or key not in ("cpu", "memory")) and not QUANTITY_RE.match(value):
                raise JobSpecError(f"{where}: {key} {value!r} is not a Kubernetes quantity "
                                   f"(e.g. 4, 500m, 16Gi)")
        if self.timeout_seconds <= 0:
            raise JobSpecError(f"{where}: timeout_seconds must be > 0")
        bad = [k for k in self.env if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k)]
        if bad:
            raise JobSpecError(f"{where}: invalid environment variable names {bad}")

    @property
    def slots(self) -> int:
        """Processes per worker: slots_per_worker, else one per GPU (at least one)."""
        return self.slots_per_worker or max(1, self.gpus_per_worker)

    @property
    def worker_cpu(self) -> str:
        """A worker's CPU request: `cpu`, else the per-GPU share, else 1 per rank."""
        if self.cpu:
            return self.cpu
        if self.gpus_per_worker:
            return scale_quantity(self.cpu_per_gpu, self.gpus_per_worker)
        return scale_quantity(CPU_PER_SLOT, self.slots)

    @property
    def worker_memory(self) -> str:
        """A worker's memory request: `memory`, else the per-GPU share, else 2Gi per rank."""
        if self.memory:
            return self.memory
        if self.gpus_per_worker:
            return scale_quantity(self.memory_per_gpu, self.gpus_per_worker)
        return scale_quantity(MEMORY_PER_SLOT, self.slots)

    @property
    def processes(self) -> int:
        """Total Horovod ranks."""
        return self.workers * self.slots

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobSpec:
        data = dict(data)
        data["volumes"] = [Volume(**v) for v in data.get("volumes", [])]
        return cls(**data)


# A ClusterOptions field with this metadata is also a parameter of every pipeline (KFP STRUCT,
# LIST, STRING, BOOLEAN or NUMBER_INTEGER after its type), wired into the pipeline's job target.
PIPELINE_PARAMETER = {"pipeline_parameter": True}
# How a Horovod job runs on a cluster: an MPIJob (mpi-operator) or a TrainJob (Kubeflow Trainer v2
# on chexflow's Horovod runtime, trainjob/horovod-runtime.yaml).
JOB_KINDS = ("mpijob", "trainjob")


@dataclass
class ClusterOptions:
    """What a real cluster asks of a job's pods, beside the JobSpec (the local backend ignores
    it): node selection, GPU-node taints, priority, registry credentials, the Kueue LocalQueue
    (`queue`: label kueue.x-k8s.io/queue-name), gang scheduling (mpi-operator's
    runPolicy.schedulingPolicy, with `volcano_queue` for Volcano), the numeric user the pods run
    as and the kind a Horovod job is run as (`job_kind`: mpijob or trainjob).

    The one statement of these options: `chexflow job` sets them from its flags, and the fields
    marked PIPELINE_PARAMETER are the pipelines' parameters of the same names (their signatures
    and the `target` component are checked against this class)."""

    node_selector: dict[str, str] = field(default_factory=dict, metadata=PIPELINE_PARAMETER)
    tolerations: list[dict[str, Any]] = field(default_factory=list, metadata=PIPELINE_PARAMETER)
    priority_class: str = field(default="", metadata=PIPELINE_PARAMETER)
    image_pull_secrets: list[str] = field(default_factory=list, metadata=PIPELINE_PARAMETER)
    gang_scheduling: bool = field(default=False, metadata=PIPELINE_PARAMETER)
    # Kueue LocalQueue in the job's namespace; "": not queued by Kueue
    queue: str = field(default="", metadata=PIPELINE_PARAMETER)
    volcano_queue: str = ""  # gang scheduling with Volcano: schedulingPolicy.queue
    job_kind: str = field(default="mpijob", metadata=PIPELINE_PARAMETER)
    min_available: int = 0  # gang: pods that must start together; 0: the workers
    run_as_user: int = IMAGE_UID

    def __post_init__(self) -> None:
        if self.job_kind not in JOB_KINDS:
            raise JobSpecError(f"job_kind {self.job_kind!r}: expected one of "
                               f"{', '.join(JOB_KINDS)}")
        for i, tol in enumerate(self.tolerations):
            where = f"toleration {i} {tol!r}"
            unknown = set(tol) - {"key", "operator", "value", "effect", "tolerationSeconds"}
            if unknown:
                raise JobSpecError(f"{where}: unknown fields {sorted(unknown)}")
            if tol.get("operator", "Equal") not in ("Equal", "Exists"):
                raise JobSpecError(f"{where}: operator must be Equal or Exists")
            if tol.get("effect", "") not in ("", *TOLERATION_EFFECTS):
                raise JobSpecError(f"{where}: effect must be one of {TOLERATION_EFFECTS}")
        if self.min_available < 0 or self.run_as_user < 1:
            raise JobSpecError("min_available must be >= 0 and run_as_user >= 1 (non-root)")
        if (self.volcano_queue or self.min_available) and not self.gang_scheduling:
            raise JobSpecError("volcano_queue and min_available are gang-scheduling settings: "
                               "set gang_scheduling too")
        if self.queue and not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", self.queue):
            raise JobSpecError(f"queue {self.queue!r}: a LocalQueue name (lowercase letters, "
                               "digits, '-' and '.') was expected")

    @classmethod
    def pipeline_parameters(cls) -> dict[str, tuple[type, Any]]:
        """The fields that are pipeline parameters: name -> (plain type: dict, list, str, bool
        or int; default), in field order."""
        hints = typing.get_type_hints(cls)
        out = {}
        for f in dataclasses.fields(cls):
            if f.metadata.get("pipeline_parameter"):
                default = f.default_factory() if f.default is dataclasses.MISSING else f.default
                out[f.name] = (typing.get_origin(hints[f.name]) or hints[f.name], default)
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ClusterOptions:
        """Options from `to_dict()`'s or a pipeline's values (KFP hands numbers over as floats);
        an unknown name is refused, naming the known ones."""
        hints = typing.get_type_hints(cls)
        unknown = sorted(set(values) - set(hints))
        if unknown:
            raise JobSpecError(f"cluster options: unknown fields {unknown}; expected "
                               f"{[f.name for f in dataclasses.fields(cls)]}")
        return cls(**{k: int(v) if hints[k] is int else v for k, v in values.items()})


def parse_toleration(text: str) -> dict[str, str]:
    """`KEY[=VALUE]:EFFECT` (kubectl taint's syntax) -> a toleration (Exists without VALUE)."""
    key, _, effect = text.rpartition(":")
    if not key or effect not in TOLERATION_EFFECTS:
        raise JobSpecError(f"toleration {text!r}: expected KEY[=VALUE]:EFFECT with EFFECT one "
                           f"of {', '.join(TOLERATION_EFFECTS)}")
    key, eq, value = key.partition("=")
    if eq:
        return {"key": key, "operator": "Equal", "value": value, "effect": effect}
    return {"key": key, "operator": "Exists", "effect": effect}


def scale_quantity(quantity: str, factor: int) -> str:
    """A Kubernetes quantity times `factor` ("16Gi" x 8 = "128Gi", "500m" x 3 = "1500m")."""
    match = QUANTITY_RE.match(quantity)
    if not match:
        raise JobSpecError(f"{quantity!r} is not a Kubernetes quantity (e.g. 4, 500m, 16Gi)")
    number = Decimal(match.group(1)) * factor
    return f"{number.normalize():f}{match.group(2) or ''}"


def dns_name(text: str, max_len: int = MAX_NAME) -> str:
    """A Kubernetes-safe name from free text (lowercase, '-', starts with a letter)."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    if not name or not name[0].isalpha():
        name = f"j-{name}"
    return name[:max_len].rstrip("-")
