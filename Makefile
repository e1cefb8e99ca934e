# chexflow: the two commands a newcomer needs are `make demo` and `make test`.
# Both set everything up first (Debian packages, both Python environments); re-runs reuse them.

CONTROL := .venv
TRAINER := .venv-trainer
DEMO_OUT ?= runs/demo
PYTEST_ARGS ?=
# Two pytest-xdist workers: the cluster tests (one group, one worker) beside the local ones.
PYTEST_WORKERS ?= 2
# Each setup phase's time, printed at the end of `make test` (images/phase.sh; one file a run).
ifndef CHEXFLOW_SETUP_TIMES
CHEXFLOW_SETUP_TIMES := .cache/setup-times/$(shell date +%Y%m%d-%H%M%S).tsv
endif
export CHEXFLOW_SETUP_TIMES
PHASE := images/phase.sh

.PHONY: setup setup-system setup-control setup-trainer setup-cluster images cluster-up cluster-down demo test lint compile clean

setup: setup-system setup-control setup-trainer

setup-system:
	$(PHASE) system-packages images/install-system.sh

setup-control:
	$(PHASE) control-env images/install-control.sh $(CONTROL)

setup-trainer: setup-system
	$(PHASE) trainer-env images/install-trainer.sh $(TRAINER)

# The local Kubernetes control plane's binaries (chexflow/devcluster/build/build.sh; cached in ~/.cache/chexflow/k8s,
# about 6 min cold on an idle 2-core machine, downloads included; nothing to do when cached) and the real node's
# (build-node.sh: kubelet, CoreDNS, pause). The cluster tests need them. Then Katib's programs
# (chexflow/devcluster/build/katib/build.sh, about 2 min cold) and its five images (chexflow/devcluster/katib_images.py).
setup-cluster: setup-system setup-control
	$(PHASE) cluster-binaries $(CONTROL)/bin/chexflow cluster build --real-node
	$(PHASE) katib-images $(CONTROL)/bin/chexflow images build katib

# The trainer, launcher and Katib images, built with podman on a debootstrapped Debian base (cached by content
# in ~/.cache/chexflow/images); the real-pod tests build what they need themselves.
images: setup-system setup-control setup-trainer
	$(CONTROL)/bin/chexflow images build

# Start / stop the local cluster by hand (then: eval "$$($(CONTROL)/bin/chexflow cluster env)").
cluster-up: setup-cluster
	$(CONTROL)/bin/chexflow cluster up --real-node

cluster-down:
	$(CONTROL)/bin/chexflow cluster down

# The main job: the chexnet-train pipeline run locally (kfp.local) on 400 generated images:
# DenseNet-121, 2 Horovod workers, 6 epochs (chexflow/pipelines/local_run.py LOCAL_DEFAULTS);
# prints a line per step and ends with the mean test AUROC beside CheXNet's.
demo: setup
	$(CONTROL)/bin/chexflow run chexnet-train --out $(DEMO_OUT)

test: setup setup-cluster
	$(CONTROL)/bin/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

lint: setup-control
	$(CONTROL)/bin/ruff check .

clean:
	rm -rf runs .pytest_cache
