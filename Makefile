# chexflow: the two commands a newcomer needs are `make demo` and `make test`.
# Both set everything up first (Debian packages, the Python environment); re-runs reuse them.

# One environment holds the trainer (TensorFlow 2.20, tf-keras, Horovod) and the control side
# (kfp, Katib's libraries, the test tools); the images keep the two apart.
VENV := .venv
DEMO_OUT ?= runs/demo
PYTEST_ARGS ?=
# Three pytest-xdist workers on a 2-core machine: the two cluster groups (katib, cluster) each on
# one worker, the local groups beside them; their waits on controllers and pods leave a third of a
# core idle with two workers (docs/tests.md#how-long-it-takes).
# The groups go out longest first (tests/conftest.py orders them by the last run's seconds,
# kept in CHEXFLOW_GROUP_SECONDS; --no-loadscope-reorder keeps xdist from re-sorting them by
# their number of tests).
PYTEST_WORKERS ?= 3
export CHEXFLOW_GROUP_SECONDS ?= .cache/test-group-seconds.json
# Each setup phase's time, printed at the end of `make test` (images/phase.sh; one file a run).
ifndef CHEXFLOW_SETUP_TIMES
CHEXFLOW_SETUP_TIMES := .cache/setup-times/$(shell date +%Y%m%d-%H%M%S).tsv
endif
export CHEXFLOW_SETUP_TIMES
PHASE := images/phase.sh

.PHONY: setup setup-system setup-env setup-cluster images cluster-up cluster-down demo test test-fast lint compile clean

setup: setup-system setup-env

setup-system:
	$(PHASE) system-packages images/install-system.sh

# Python 3.12 (images/python.sh), TensorFlow 2.20 and Horovod 0.28.1 built with
# images/horovod-0.28.1-tf2.20.patch (the wheel is cached in ~/.cache/chexflow/wheels), kfp.
setup-env: setup-system
	$(PHASE) python-env images/install-trainer.sh $(VENV) --editable --with-control

# What the cluster tests need, built before they start (each cached by content; nothing to do when cached):
# - the Go programs (chexflow/devcluster/build/build.sh, cached in ~/.cache/chexflow/k8s): the control plane, the
#   real node's (kubelet, CoreDNS, pause), Trainer and JobSet, Kueue, scheduler-plugins' Coscheduling, distribution's registry,
#   KServe's manager (the serving test's; built inside it, a cold build outlasted the test's deadline);
# - beside them, the images: Katib's five (its programs built first), then the trainer, launcher and
#   early-stopping images (podman on a debootstrapped Debian base).
# The two chains run at once: the image builds wait on downloads while the Go builds use the cores. Built
# inside the tests instead, they ran one after another on the cluster tests' worker: 31 of the 57 min of a
# cold run's tests (2026-11-26, docs/tests.md).
setup-cluster: setup-system setup-env
	$(PHASE) cluster-binaries $(VENV)/bin/chexflow cluster build --real-node --trainer --kueue --coscheduling --registry --kserve & \
	binaries=$$!; \
	$(PHASE) katib-images $(VENV)/bin/chexflow images build katib \
	  && $(PHASE) trainer-images $(VENV)/bin/chexflow images build trainer launcher earlystopping; \
	images=$$?; wait $$binaries && exit $$images

# The trainer, launcher and Katib images, built with podman on a debootstrapped Debian base (cached by content
# in ~/.cache/chexflow/images); `make setup-cluster` builds those the tests run, and a cluster test run
# alone builds what it needs.
images: setup
	$(VENV)/bin/chexflow images build

# Start / stop the local cluster by hand (then: eval "$$($(VENV)/bin/chexflow cluster env)").
cluster-up: setup-cluster
	$(VENV)/bin/chexflow cluster up --real-node

cluster-down:
	$(VENV)/bin/chexflow cluster down

# The main job: the chexnet-train pipeline run locally (kfp.local) on 400 generated images:
# DenseNet-121, 2 Horovod workers, 6 epochs (RUN_DEFAULTS in pipelines/chexnet_train.py);
# prints a line per step and ends with the mean test AUROC beside CheXNet's.
demo: setup
	$(VENV)/bin/chexflow run chexnet-train --out $(DEMO_OUT)

test: setup setup-cluster
	$(VENV)/bin/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup --no-loadscope-reorder \
		$(PYTEST_ARGS)

# The inner loop before a commit: the tests that need no cluster and no training (docs/tests.md),
# on FAST_WORKERS pytest-xdist workers, a module's tests on one worker (its fixtures made once);
# only the Python environment is set up. Three workers finish sooner than two on 2 cores: the
# tests wait on the processes they start.
FAST_WORKERS ?= 3
test-fast: setup-env
	$(VENV)/bin/python -m pytest -n $(FAST_WORKERS) --dist loadgroup \
		-m "not (cluster or realnode or slurm or trainer or slow)" $(PYTEST_ARGS)

# ruff's rules, then vulture: code nothing in chexflow/ or pipelines/ uses ([tool.vulture])
lint: setup-env
	$(VENV)/bin/ruff check .
	$(VENV)/bin/vulture

clean:
	rm -rf runs .pytest_cache
