"""Reading stored runs back: summaries, run-to-run comparison with significance, spreads, ratios and
targets. Used by the `summary` and `compare` commands; nothing here measures."""
