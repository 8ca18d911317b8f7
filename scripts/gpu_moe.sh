#!/usr/bin/env bash
# `qbench moe` on a multi-GPU machine, from the repository root; logs and runs under $OUT.
#   scripts/gpu_moe.sh [PART...]          (default: check)
#   W=2 STEPS=30 scripts/gpu_moe.sh seed  (W ranks, default 4; STEPS / WARMUP timed / untimed steps, 100 / 10)
# Parts, each command with its own time limit so that one failure does not cost the others:
#   check       the MoE GPU tests (grouped GEMM, routing and replication kernels, block GEMMs, the
#               symmetric-memory transport on every GPU) and a short timing of both systems
#   seed        the seed config (fp16, d 1024, h 4096, 8192 tokens per rank, 8 experts per rank, top-2)
#   static      the seed config with a fixed capacity (--capacity-factor 1.0), eager and graphed (a static
#               step: the all-to-alls are captured too), RUNS runs (default 3) of one command, then (W > 1)
#               --a2a-ffn-overlap-degree 1,2 once
#   replicated  rand-skew routing, --replicate-hot 0,2,4, RUNS runs of one command
# (static and replicated: each run joins $OUT/NAME.tar as it ends, so a call cut short keeps the runs made,
# one log $OUT/NAME.log, and the medians over the runs at its end)
#   overlap     --a2a-ffn-overlap-degree 1,2,4
#   replicate   rand-skew routing, --replicate-hot 0,2,4,6
#   experts     --num-local-experts 8,16,32,64
#   gemm        bf16, grouped GEMM backends triton and torch
#   blocks      a2a against blocks: locality 0.25..1.0 x 8..64 local experts (32 cases, one command)
#   transports  --system blocks over every --transport, locality 0.25 and 1.0 (ag/ga times: pull + push)
#   trace       per-rank kernel timelines (--trace) of the seed step and of rand-skew with replication
#   kernels     `qbench moe --kernels grouped` (one GPU): the TMA against the pointer grouped GEMM
#   single      one GPU (world size 1): the compile / graph / sync-free GPU tests, then the seed config in
#               every --exec mode (eager, compile, graph), dropless and with --capacity-factor 1.0:
#               step_ms against floor_ms, experts_tflops (eager phases), host_ms per mode
#   threads     one GPU (world size 1), seed config, capacity 1.0: eager on both backward threads and graphed,
#               RUNS runs of one command (results/moe-h200-ws1/backward-thread-8b96258), their medians at the end
#   hostcut     issue 50's lines in one call (at most ~10 min): the seed config at world sizes SIZES (default
#               "4 2 1", those the GPUs allow), --a2a-ffn-overlap-degree 1,2, eager dropless and capacity 1.0
#               eager + graph (degree 1 alone at world size 1), RUNS runs each (run-major: a call cut short by HOSTCUT_S keeps runs of every
#               world size), with --system tutel beside where a carried Tutel source (.tutel/src, git-ignored;
#               `carry` it) builds; every run in $OUT/hostcut.tar, medians per world size at the end of hostcut.log;
#               run 1's dropless steps also profiled (--trace: per-rank timelines with the phases, in runs.tar.gz)
source "$(dirname "$0")/gpu_prelude.sh"
W=${W:-4}
STEPS=${STEPS:-100}
WARMUP=${WARMUP:-10}

# moe NAME LIMIT_S ARGS...: qbench moe into $OUT/runs/moe-NAME, its log added to $OUT/LOG.log (LOG: NAME
# unless set); prints the rc and the table's last ${TAIL:-8} rows
moe() {
  local name=$1 limit=$2 log=$OUT/${LOG:-$1}.log
  shift 2
  timeout "$limit" python3 -m qbench moe --world-size "$W" --num-steps "$STEPS" --warmup "$WARMUP" \
    --out "$OUT/runs/moe-$name" "$@" >> "$log" 2>&1
  echo "== $name rc=$?" | tee -a "$log"
  grep -E "│|rror" "$log" | tail -"${TAIL:-8}"
}

check_part() {
  timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_grouped_gemm.py tests/test_grouped_gemm_tma.py \
    tests/test_moe_route.py tests/test_moe_hot.py tests/test_block_gemm.py tests/test_moe_transport_gpu.py \
    > "$OUT/gpu_tests.log" 2>&1
  echo "== gpu tests rc=$?"
  tail -4 "$OUT/gpu_tests.log"
  STEPS=20 WARMUP=5 moe check 120 --system a2a,blocks --locality 0.25,1.0
}
seed_part() { moe seed 120 --seed-format; }

# repeated NAME FIRST_LIMIT_S LIMIT_S ARGS...: RUNS runs of qbench moe ARGS (the first may compile and autotune:
# FIRST_LIMIT_S), run i in runs/moe-NAME-i, each moved into $OUT/TAG.tar as it ends, logs in $OUT/TAG.log
# (TAG: NAME unless set, so that several commands share one tarball and log: few files come back)
repeated() {
  local name=$1 first=$2 limit=$3 run tag=${TAG:-$1}
  shift 3
  for run in $(seq "${RUNS:-3}"); do
    LOG=$tag TAIL=0 moe "$name-$run" "$([ "$run" = 1 ] && echo "$first" || echo "$limit")" "$@"
    tar -rf "$OUT/$tag.tar" -C "$OUT" "runs/moe-$name-$run" && rm -rf "$OUT/runs/moe-$name-$run"
  done
}

# summarize NAME METRIC...: the medians over the runs NAME-1, NAME-2, ... of NAME.tar, into its log (BY: a
# param to put side by side, --by)
summarize() {
  local name=$1 metric
  shift
  mkdir -p "$OUT/summary" && tar -xf "$OUT/$name.tar" -C "$OUT/summary"
  set -- $(for metric in "$@"; do echo --metric "$metric"; done)
  python3 -m qbench summary "$OUT"/summary/runs/moe-"$name"-[0-9]* --across-runs median ${BY:+--by "$BY"} "$@" 2>&1 |
    tee -a "$OUT/$name.log"
  rm -rf "$OUT/summary"
}

static_part() {
  repeated static 200 110 --capacity-factor 1.0 --exec eager,graph
  local exchange=()
  if [ "$W" -gt 1 ]; then  # chunks overlap the exchange with the expert GEMMs: nothing to overlap at world size 1
    RUNS=1 TAG=static repeated static-overlap 110 110 --capacity-factor 1.0 --exec eager,graph --a2a-ffn-overlap-degree 1,2
    exchange=(dispatch_ms combine_ms)
  fi
  summarize static step_ms floor_ms plan_ms experts_ms backward_experts_ms "${exchange[@]}" host_ms
}
replicated_part() {
  repeated replicated 150 110 --routing rand-skew --replicate-hot 0,2,4
  summarize replicated step_ms
}
overlap_part() { moe overlap 200 --a2a-ffn-overlap-degree 1,2,4 --seed-format; }
replicate_part() { moe replicate 240 --routing rand-skew --replicate-hot 0,2,4,6; }
experts_part() { moe experts 200 --num-local-experts 8,16,32,64; }
gemm_part() { moe gemm 120 --dtype bf16 --gemm triton,torch; }
blocks_part() {
  TAIL=40 moe blocks 560 --system a2a,blocks --locality 0.25,0.5,0.75,1.0 --num-local-experts 8,16,32,64 --seed-format
}
transports_part() {
  for transport in a2a symm symm-fused-ga symm-fused; do
    TAIL=4 moe "transport-$transport" 120 --system blocks --transport "$transport" --locality 0.25,1.0
  done
}
trace_part() {
  moe seed-trace 120 --trace "$OUT/runs/trace"
  moe replicate-trace 240 --routing rand-skew --replicate-hot 0,2,4 --trace "$OUT/runs/trace"
}
kernels_part() {
  for dtype in fp16 bf16; do
    timeout 300 python3 -m qbench moe --kernels grouped --dtype "$dtype" --out "$OUT/runs/grouped-$dtype" \
      > "$OUT/grouped-$dtype.log" 2>&1
    echo "== grouped GEMM kernels $dtype rc=$?"
    tail -24 "$OUT/grouped-$dtype.log"
  done
}

single_part() {
  timeout 600 python3 -m pytest -q -p no:cacheprovider tests/test_moe_compile.py tests/test_moe_records.py \
    tests/test_grouped_gemm.py tests/test_grouped_gemm_tma.py tests/test_moe_route.py > "$OUT/gpu_tests_single.log" 2>&1
  echo "== world-size-1 GPU tests rc=$?"
  tail -4 "$OUT/gpu_tests_single.log"
  W=1 moe single 580 --exec eager,compile,graph
  W=1 moe single-cap1 580 --capacity-factor 1.0 --exec eager,compile,graph
  for name in single single-cap1; do  # the targets' numbers, per mode: ms, TFLOP/s, ratio to the floor
    python3 - "$OUT/runs/moe-$name/results.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    m, p = r["metrics"], r["params"]
    floor, step = m.get("floor_ms"), m.get("step_ms")
    ratio = f"{step / floor:.2f}x floor" if floor and step else "-"
    print(f"cf={p['capacity_factor']} {p['exec']:8} {p.get('timing')} {r['status']:8} step_ms={step} floor_ms={floor} ({ratio}) "
          f"experts_tflops={m.get('experts_tflops')} host_ms={m.get('host_ms')} {r.get('error') or ''}")
PY
  done
}

threads_part() {
  W=1 repeated ws1-thread 200 150 --capacity-factor 1.0 --exec eager,graph --backward-thread calling,device
  BY=backward_thread summarize ws1-thread step_ms host_ms experts_tflops
}

# tutel_site: build a carried Tutel source (.tutel/src, with its COMMIT file) into /tmp/tutel-site and put it on
# PYTHONPATH; SYSTEMS: "a2a,tutel" where it builds, else "a2a" (no source, or a failed build: tutel_build.log)
tutel_site() {
  SYSTEMS=a2a
  [ -f .tutel/src/setup.py ] || return 0
  rm -rf /tmp/tutel-src /tmp/tutel-site && cp -r .tutel/src /tmp/tutel-src
  if (cd /tmp/tutel-src && timeout 240 python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/tutel-site .) \
      > "$OUT/tutel_build.log" 2>&1; then
    cp .tutel/src/COMMIT /tmp/tutel-site/tutel/COMMIT 2> /dev/null
    export PYTHONPATH=$PYTHONPATH:/tmp/tutel-site
    SYSTEMS=a2a,tutel
  fi
}

hostcut_part() {
  local start=$SECONDS gpus run w sizes=() trace degrees
  gpus=$(nvidia-smi -L | wc -l)
  for w in ${SIZES:-4 2 1}; do [ "$w" -le "$gpus" ] && sizes+=("$w"); done
  tutel_site
  echo "== hostcut: world sizes ${sizes[*]}, systems $SYSTEMS, RUNS ${RUNS:-3} ($((SECONDS - start)) s)" |
    tee -a "$OUT/hostcut.log"
  for run in $(seq "${RUNS:-3}"); do
    for w in "${sizes[@]}"; do
      # no new pair of commands after HOSTCUT_S: a pair takes at most 240 s, so the call ends within ~10 minutes
      if [ $((SECONDS - start)) -gt "${HOSTCUT_S:-330}" ]; then
        echo "== hostcut: time is up before run $run at world size $w" | tee -a "$OUT/hostcut.log"
        break 2
      fi
      trace=(); [ "$run" = 1 ] && trace=(--trace "$OUT/runs/trace-w$w")  # CPU + CUDA activity of 3 steps
      degrees=1,2; [ "$w" = 1 ] && degrees=1  # one rank exchanges nothing: its step has one chunk whatever D
      W=$w TAG=hostcut RUNS=1 repeated "hostcut-w$w-dropless-$run" 120 120 --system "$SYSTEMS" \
        --a2a-ffn-overlap-degree "$degrees" --exec eager "${trace[@]}"
      W=$w TAG=hostcut RUNS=1 repeated "hostcut-w$w-cap1-$run" 120 120 --system "$SYSTEMS" \
        --a2a-ffn-overlap-degree "$degrees" --capacity-factor 1.0 --exec eager,graph
    done
  done
  mkdir -p "$OUT/summary" && tar -xf "$OUT/hostcut.tar" -C "$OUT/summary"
  local dirs across
  for w in "${sizes[@]}"; do
    for kind in dropless cap1; do
      dirs=("$OUT"/summary/runs/moe-hostcut-w"$w"-"$kind"-*)
      [ -d "${dirs[0]}" ] || continue
      across=(); [ "${#dirs[@]}" -gt 1 ] && across=(--across-runs median)
      python3 -m qbench summary "${dirs[@]}" "${across[@]}" --metric step_ms \
        --metric host_ms --metric 'host_*_ms' 2>&1 | tee -a "$OUT/hostcut.log"
    done
  done
  rm -rf "$OUT/summary"
}

PARTS=("${@:-check}")
for part in "${PARTS[@]}"; do
  declare -F "${part}_part" > /dev/null || { echo "unknown part '$part'; see the head of $0"; exit 2; }
done
gpu_header
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv -lms 1000 > "$OUT/smi.csv" 2>&1 &  # clocks and throttling through the run
SMI=$!
for part in "${PARTS[@]}"; do "${part}_part"; done
kill "$SMI"
pack_runs
