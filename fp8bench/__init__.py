"""fp8bench: declarative FP8 / MXFP8 / NVFP4 training benchmarks with numerics, memory and regression tracking."""

__version__ = "0.1.0"
