"""Benchmarks: paraxis next to PyTorch's own implementations, on this machine."""
