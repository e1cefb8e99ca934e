"""Training under Horovod: one worker entry point for local runs, MPIJobs, Slurm and Katib.

Modules without TensorFlow (importable in the control environment): options, rundir,
throughput, launch, results. The rest import TensorFlow/Horovod and run in the trainer
environment. The data they read is chexflow.data.manifest's.
"""
