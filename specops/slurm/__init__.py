"""Slurm: a cluster's login node drives the jobs (sbatch, squeue, scontrol, scancel, sinfo).

script renders the sbatch script from typed inputs; queue parses Slurm's output into typed data
and judges a request against a partition; cluster runs Slurm's commands over a connection and
returns data (submit, jobs, stop, the partition, the shared-workdir probe). Below ops: the stages
route a `scheduler: slurm` host here.
"""
