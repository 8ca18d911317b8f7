"""The model family's benches: what reads config files, writes records or times things around the
pure model of qbench.model. lstm (DeepFlow evaluations and their records), search (strategy and
power-split searches: workloads, records, tables), calibrate (measured ceilings of this device),
against (stored runs next to their roofline floors), config (DeepFlow and hardware files)."""
