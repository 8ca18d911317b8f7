#!/usr/bin/env bash
# `qbench model` on a GPU machine (repository root; outputs under $OUT, see gpu_prelude.sh): the measured
# ceilings of the GPU (matmul rates per dtype, copy bandwidth) as a hardware file for `--calibrated`.
#   scripts/gpu_model.sh calibrate
source "$(dirname "$0")/gpu_prelude.sh"
gpu_header
case "${1:-calibrate}" in
calibrate)
  qbench model calibrate --device cuda --out "$OUT/runs/model-calibrate" --file "$OUT/calibration.yaml" | tail -12
  pack_runs ;;
*) echo "unknown part $1: calibrate" >&2; exit 2 ;;
esac
