"""The layers, importable from one place: `from qbench.layers import SwitchBackLinear`.

Each name is loaded from its module on first use (a module-level __getattr__), so importing this package
imports no torch; the modules themselves know nothing of benches (no timers, no stores).
"""

# public name -> module under qbench.layers that defines it
EXPORTS = {
    "SwitchBackLinear": "switchback", "StandardLinear": "switchback",
    "Fp8Linear": "fp8",
    "FragmentedLinear": "fragmented", "BlockDiagonalLinear": "fragmented", "LowRankLinear": "fragmented",
    "MoELayer": "moe", "BlocksMoELayer": "moe", "MoEOptions": "moe",
    "Block": "transformer", "BlockStack": "transformer",
}
__all__ = sorted(EXPORTS)


def __getattr__(name: str):
    import importlib

    if name not in EXPORTS:
        raise AttributeError(f"module 'qbench.layers' has no attribute {name!r}")
    return getattr(importlib.import_module(f"qbench.layers.{EXPORTS[name]}"), name)
