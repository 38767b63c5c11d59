#!/usr/bin/env bash
# One device call that runs everything after `shared/gpu/pack`: the GPU tests, the examples, the
# benchmark and the peers (same machine, same lease). Full logs in $OUT; a summary on stdout.
cd "$(dirname "$0")/.."
export FUSE_REQUIRE_GPU=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
bash .gpu/run tests > "$OUT/tests.txt" 2>&1
grep -E "^=== |test result|FAILED|panicked" "$OUT/tests.txt" | grep -v "^=== .gpu/tests/\(ui\|ui_tests\|cpu_language\|nvrtc\)" | head -40
bash .gpu/run examples > "$OUT/examples.txt" 2>&1; echo "examples rc=$?"
grep -iE "^=== |agree|error|FAILED" "$OUT/examples.txt" | head -20
.gpu/benches/workloads --bench --json "$OUT/bench.json" > "$OUT/bench.txt" 2>&1; echo "bench rc=$?"
bash .gpu/run peers > "$OUT/peers.txt" 2>&1; echo "peers rc=$?"
sed -n '/^id /,$p' "$OUT/bench.txt" | cut -c1-110
tail -45 "$OUT/peers.txt" | cut -c1-110
