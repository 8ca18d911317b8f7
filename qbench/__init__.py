"""qbench: benchmarks for low-precision and sparse layers, and the analytical model that explains them."""

__version__ = "0.1.0"
