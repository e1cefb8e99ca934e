"""The development floor: a local Kubernetes cluster and the images it runs, built from source.

Above the engine (nothing in chexflow's engine imports it): a real control plane built from Go
modules (controlplane.py: etcd, kube-apiserver, controller-manager, scheduler, kwok GPU nodes,
mpi-operator), a real node (realnode.py: containerd, kubelet, CoreDNS), kube-proxy, Katib
v0.19.0 (katib.py), the images built with podman on a Debian base (images.py, katib_images.py)
and the Go builds they need (build/: Kubernetes and the node; build/katib/: Katib's programs).
`chexflow cluster ...` and `chexflow images ...` (commands.py) are the command-line way in.
"""
