"""What only the tests use: readers of a run's metrics.json and auroc.json, the shared reference
folder, a single-node Slurm, a local trial's command."""
