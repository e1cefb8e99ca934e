"""The bare-metal path: the same Horovod training job as an sbatch script, run by Slurm.

`chexflow slurm render` writes the script (srun --mpi=pmix or mpirun, one task per GPU,
optionally inside `apptainer exec --nv`); `chexflow slurm submit` hands it to sbatch, waits,
and reports the job's state and the training metrics.
"""
