"""Mixtures of experts: the MoE block (`layer`) and expert parallelism."""
