"""gemmrl: half-precision GEMM kernels found by search, verified against a high-precision reference,
timed against the vendor libraries, and served to PyTorch.

Importing gemmrl does no CUDA work and compiles nothing.
"""

__version__ = "0.1.0"
