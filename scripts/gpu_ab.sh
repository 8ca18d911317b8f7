#!/usr/bin/env bash
# An A/B of two trees on one GPU machine, their runs alternating (repository root; outputs under $OUT, see
# gpu_prelude.sh):
#   scripts/gpu_ab.sh OLD_TREE N ARGS...     N runs of `qbench ARGS` each, old1, new1, old2, new2, ...
#   scripts/gpu_ab.sh OLD_TREE N ARGS... --old OLD_ARGS...   the old side spelt its options otherwise
# OLD_TREE holds the old code's qbench/ and kernels/, e.g. `git archive REV qbench kernels | tar x -C DIR`
# (an untracked folder travels to the device with the working tree). Each old run starts from inside it:
# `python3 -m qbench` imports the package of the current directory before anything on PYTHONPATH, so from
# the repository root both sides would run the new code (their env.json source hashes tell).
# Writes $OUT/runs/{old,new}1..N and $OUT/compare.md (`qbench compare --group N`), then packs the runs.
source "$(dirname "$0")/gpu_prelude.sh"
if [ $# -lt 3 ] || [ ! -d "$1/qbench" ]; then
  echo "usage: scripts/gpu_ab.sh OLD_TREE N ARGS... (OLD_TREE/qbench must exist)" >&2; exit 2
fi
old_tree=$(cd "$1" && pwd) runs=$2
shift 2
new_args=() old_args=()
while [ $# -gt 0 ] && [ "$1" != "--old" ]; do new_args+=("$1"); shift; done
if [ $# -gt 0 ]; then shift; old_args=("$@"); else old_args=("${new_args[@]}"); fi
OUT=$(cd "$OUT" && pwd)  # the old runs write from inside the old tree
gpu_header
for i in $(seq "$runs"); do
  (cd "$old_tree" && PYTHONPATH=. python3 -m qbench "${old_args[@]}" --out "$OUT/runs/old$i" > /dev/null) || echo "old$i failed"
  qbench "${new_args[@]}" --out "$OUT/runs/new$i" > /dev/null || echo "new$i failed"
done
qbench compare --group "$runs" $(for side in old new; do for i in $(seq "$runs"); do echo "$OUT/runs/$side$i"; done
  done) --markdown > "$OUT/compare.md"
pack_runs
