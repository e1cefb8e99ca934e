"""A real Kubernetes control plane for tests and exploration, built from Go modules (cluster/).

LocalCluster (controlplane.py) runs etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kwok GPU nodes and mpi-operator on loopback; `chexflow cluster up|down|env`
(commands.py) is the command-line way in.
"""
