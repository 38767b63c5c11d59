#!/usr/bin/env bash
# A/B of two builds of the benchmark in one device call: `bash benches/ab.sh A B IDS [ROUNDS]`
# runs `A --bench --only IDS` and `B ...` alternately, ROUNDS times each (2), each run's JSON in
# $OUT (ab_a1.json, ab_b1.json, ...), then prints each row's best time of each build and B's
# change (benches/ab.py). A and B are staged binaries (`.gpu/benches/workloads` and a copy of
# another build's); a run that fails or passes 240 s is reported and the others go on.
set -u
a=$1 b=$2 ids=$3 rounds=${4:-2}
out=${OUT:-/tmp}
for i in $(seq 1 "$rounds"); do
  for side in a b; do
    bin=$a; [ "$side" = b ] && bin=$b
    timeout 240 "$bin" --bench --only "$ids" --json "$out/ab_$side$i.json" > "$out/ab_$side$i.txt" 2>&1
    echo "ab: $side$i rc=$?"
  done
done
python3 "$(dirname "$0")/ab.py" "$out"
