"""What vulture cannot see used: names that a library, a protocol or a file format reads.

`make lint` and tests/test_lint.py run vulture over chexflow/ and pipelines/ with this file
(pyproject.toml, [tool.vulture]); tests/ are not read, so code that only tests use is reported
too. Each line is an attribute access vulture counts as a use; add one only with its reader.
"""

# ruff: noqa: B018 (each line is an expression on purpose)
_ = object  # vulture reads the names below; nothing runs this file

# protobuf reads a descriptor's fields (chexflow.data.example builds tf.train.Example's)
_.oneof_index
_.map_entry
# Keras calls a callback's hooks, a layer's and a schedule's call, reads a layer's momentum
_.on_epoch_begin
_.on_epoch_end
_.on_train_batch_begin
_.on_train_batch_end
_.call
_.momentum
# gRPC calls the servicers' methods by the names of Katib's API (chexflow.katib.services)
_.GetSuggestions
_.ValidateAlgorithmSettings
_.ValidateEarlyStoppingSettings
_.GetEarlyStoppingRules
_.SetTrialStatus
# inspect.signature reads a function's __signature__ (kfp: the pipelines' parameters)
_.__signature__
# io reads a text stream's writable() (chexflow.pipelines.console)
_.writable
# the open lock file of a sweep's state folder, held while the sweep runs
_._lock
# fields written to metrics.json (chexflow.train.throughput, asdict)
_.images_per_sec_per_worker
_.images_per_sec_mean
_.images_per_sec_std
_.timed_steps
# each pipeline definition's `chexflow run` settings, read by name (chexflow.pipelines.registry)
_.RUN_DEFAULTS
# tarfile reads a member's TarInfo fields (chexflow.devcluster.realnode: the pause image's layer)
_.gid
_.uname
_.gname
_.mtime
# Horovod's launcher calls the build checks that chexflow.jobs.horovodrun replaces
_.mpi_built
_.gloo_built
# PyYAML's emitter passes increase_indent's arguments by name (chexflow.jobs.trainjob's dumper)
_.indentless
# the pod label and the variable kwok's stages match (chexflow/devcluster/kwok-stages.yaml)
_.FAIL_LABEL
_.OUTCOME_ENV
# a Workload's verdict beside its line (chexflow.jobs.queueing.QueueState)
_.admitted
# the fault run's launcher log, kept with its rows (chexflow.bench.cluster_faults.FaultRun)
_.launcher_log
# KServe's model server calls a Model's predict with these arguments by name, and reads its
# input and output types for the v2 metadata (chexflow.serve.predictor)
_.response_headers
_.get_input_types
_.get_output_types
