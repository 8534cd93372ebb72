"""The stage partition the pipeline runs: computed in `paraxis/plan/partition.py`, where the
planner prices the very same split (pure Python there, so `paraxis plan` needs no torch)."""

from paraxis.plan.partition import Partition, partition_layers

__all__ = ["Partition", "partition_layers"]
