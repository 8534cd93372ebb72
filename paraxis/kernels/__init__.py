"""The compute kernels the model and the parallel layers share: one entry for every GEMM
(`linear`), so a precision that changes how matmuls run (FP8: `fp8.py`) changes it in one
place."""
