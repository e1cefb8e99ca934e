"""What only the tests use: readers of a run's result files, the shared reference folder, a
single-node Slurm, a local trial's command."""
