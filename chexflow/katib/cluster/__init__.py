"""The cluster client: an Experiment created, followed and read with the Kubernetes client."""
