#!/usr/bin/env bash
# The whole test suite on a GPU machine, from the repository root; logs under $OUT/tests.
#   scripts/gpu_tests.sh            (CHUNKS parallel pytest processes, default 10; LIMIT_S each, default 500)
#   IDS=left.txt scripts/gpu_tests.sh   only the node ids listed in that file (one per line: a left.txt)
# On a GPU the kernels compile and autotune instead of running under the interpreter, so one pytest
# process takes longer than a device call allows. The tests are spread over CHUNKS processes one test at a
# time, round robin (the slow cases are parametrizations of a few tests, so each process gets a share),
# and run side by side on the one GPU; the timing tests run afterwards on their own, so that no other
# process's kernels share the GPU while they time. A process cut at LIMIT_S names what it did not run in
# $OUT/tests/left.txt: run those with `IDS=left.txt scripts/gpu_tests.sh` (the file inside the tree: the device
# copies the working tree, not $OUT). Listed ids that name no test any more (a README table test's id carries
# the table's line) are left out and named in $OUT/tests/gone.txt.
source "$(dirname "$0")/gpu_prelude.sh"
CHUNKS=${CHUNKS:-10}
LIMIT_S=${LIMIT_S:-500}
export TORCHINDUCTOR_COMPILE_THREADS=2  # CHUNKS compiling processes share the host's cores
dir="$OUT/tests"
mkdir -p "$dir"
gpu_header > "$dir/header.txt"
python3 -c "from qbench.env import own_source_hash; print('source_hash', own_source_hash()[:12])" >> "$dir/header.txt"

python3 -m pytest --collect-only -q -p no:cacheprovider 2>/dev/null | grep "::" > "$dir/collected.txt"
if [ -n "${IDS:-}" ]; then
  # only the listed ids that still name a test (a test function's id names all its parametrizations): one
  # stale id, e.g. a README table test named by an old line number, would make pytest run none of its chunk
  python3 - "$IDS" "$dir" <<'EOF'
import sys
from pathlib import Path

listed, d = Path(sys.argv[1]), Path(sys.argv[2])
collected = (d / "collected.txt").read_text().splitlines()
functions = {node.split("[", 1)[0] for node in collected}
asked = [line.strip() for line in listed.read_text().splitlines() if "::" in line]
known = set(collected) | functions
kept = [node for node in asked if node in known]
gone = [node for node in asked if node not in known]
(d / "all.txt").write_text("".join(node + "\n" for node in kept))
(d / "gone.txt").write_text("".join(node + "\n" for node in gone))
if gone:
    print(f"{len(gone)} of the {len(asked)} ids in {listed} name no test now (not run; {d}/gone.txt)")
EOF
else
  cp "$dir/collected.txt" "$dir/all.txt"
fi
grep -E "^tests/test_timing(_dist)?\.py::" "$dir/all.txt" > "$dir/timing.txt"
grep -vE "^tests/test_timing(_dist)?\.py::" "$dir/all.txt" |
  awk -v n="$CHUNKS" -v d="$dir" '{ print > (d "/chunk" (NR - 1) % n ".txt") }'

# run NAME IDS_FILE: pytest on the node ids of IDS_FILE, log and JUnit XML under $dir
run() {
  local ids
  mapfile -t ids < "$2"
  timeout -s INT "$LIMIT_S" python3 -m pytest -q -p no:cacheprovider -rfE --junitxml="$dir/$1.xml" "${ids[@]}" \
    > "$dir/$1.log" 2>&1
}

for ids in "$dir"/chunk*.txt; do
  run "$(basename "$ids" .txt)" "$ids" &
done
wait
[ -s "$dir/timing.txt" ] && run timing "$dir/timing.txt"  # (pytest with no ids would run everything)

python3 - "$dir" <<'EOF'
"""Totals over every process's JUnit XML, the failures by name, and the tests no process finished (a
process cut at its limit was in the middle of its last recorded test: that one counts as not reached)."""
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

d = Path(sys.argv[1])
seen, totals, failed = set(), Counter(), []
for xml in sorted(d.glob("*.xml")):
    cases = [c for c in ET.parse(xml).getroot().iter("testcase") if c.get("classname") is not None]
    if "KeyboardInterrupt" in xml.with_suffix(".log").read_text():
        cases = cases[:-1]
    for case in cases:
        node = case.get("classname").replace(".", "/") + ".py::" + case.get("name")
        seen.add(node)
        kinds = {child.tag for child in case}
        outcome = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
        totals[outcome] += 1
        if outcome == "failed":
            failed.append(node)
# an id without parameters (file::test) stands for every parametrization of that test
left = [n for n in (d / "all.txt").read_text().split("\n")
        if n and n not in seen and not any(s.startswith(n + "[") for s in seen)]
(d / "left.txt").write_text("".join(n + "\n" for n in left))
print(f"{totals['passed']} passed, {totals['failed']} failed, {totals['skipped']} skipped, {len(left)} not finished"
      + (" (rerun them: IDS=left.txt scripts/gpu_tests.sh)" if left else ""))
print("\n".join(f"FAILED {n}" for n in failed))
EOF
(cd "$OUT" && tar czf tests.tar.gz tests && rm -rf tests)
