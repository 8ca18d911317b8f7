"""qbench: benchmarks for low-precision and sparse layers, and the analytical model that explains them."""

# The one place the version is set: pyproject.toml reads it (tool.setuptools.dynamic), env.json records it.
__version__ = "0.1.0"
