"""The analytical model: hardware descriptions, roofline floors, the DeepFlow LSTM language-model model
and floors for qbench's own workloads. Nothing here imports torch."""
