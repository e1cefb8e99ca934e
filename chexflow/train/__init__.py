"""Training under Horovod: one worker entry point for local runs, MPIJobs, Slurm and Katib.

Modules without TensorFlow (importable in the control environment): manifest, throughput,
launch, results. The rest import TensorFlow/Horovod and run in the trainer environment.
"""
