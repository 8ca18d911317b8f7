"""qbench: benchmarks for low-precision and sparse layers, and the analytical model that explains them.

The Python API, loaded on first use so that `import qbench` stays free of torch and pandas:
  qbench.load(RUN)   the runs as one tidy pandas DataFrame (qbench.tidy)
  qbench.layers      the layers (SwitchBackLinear, FragmentedLinear, MoELayer, ...), importable from one place
"""

# The one place the version is set: pyproject.toml reads it (tool.setuptools.dynamic), env.json records it.
__version__ = "0.1.0"


def __getattr__(name: str):
    import importlib

    if name == "load":
        return importlib.import_module("qbench.tidy").load
    if name == "layers":
        return importlib.import_module("qbench.layers")
    raise AttributeError(f"module 'qbench' has no attribute {name!r}")
