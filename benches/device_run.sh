#!/usr/bin/env bash
# One device call that runs everything after `shared/gpu/pack`: the GPU tests, the examples, the
# benchmark and the peers (same machine, same lease). Full logs in $OUT; a summary on stdout.
cd "$(dirname "$0")/.."
export FUSE_REQUIRE_GPU=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
bash .gpu/run tests > "$OUT/tests.txt" 2>&1
grep -E "^=== |test result|FAILED|panicked" "$OUT/tests.txt" | grep -v "^=== .gpu/tests/\(ui\|ui_tests\|cpu_language\|nvrtc\)" | head -40
# cudarc looks for NCCL as libnccl.so; the machine may have only libnccl.so.2 (multi_gpu's NCCL).
nccl=$(for d in ${LD_LIBRARY_PATH//:/ } /usr/lib/x86_64-linux-gnu /usr/local/lib /usr/lib; do
  [ -e "$d/libnccl.so.2" ] && echo "$d/libnccl.so.2" && break; done)
[ -z "$nccl" ] && nccl=$(python3 -c 'import glob,torch,os;print((glob.glob(os.path.dirname(torch.__file__)+"/../nvidia/nccl/lib/libnccl.so.2") or [""])[0])' 2>/dev/null)
if [ -n "$nccl" ]; then mkdir -p /tmp/fuse-nccl && ln -sf "$nccl" /tmp/fuse-nccl/libnccl.so; export LD_LIBRARY_PATH=/tmp/fuse-nccl:$LD_LIBRARY_PATH; fi
echo "nccl: ${nccl:-none}"
bash .gpu/run examples > "$OUT/examples.txt" 2>&1; echo "examples rc=$?"
grep -iE "^=== |agree|error|FAILED|difference|per chain" "$OUT/examples.txt" | head -40
[ "${1:-}" = "--no-bench" ] && exit 0
.gpu/benches/workloads --bench --json "$OUT/bench.json" > "$OUT/bench.txt" 2>&1; echo "bench rc=$?"
bash .gpu/run peers > "$OUT/peers.txt" 2>&1; echo "peers rc=$?"
sed -n '/^id /,$p' "$OUT/bench.txt" | cut -c1-110
tail -45 "$OUT/peers.txt" | cut -c1-110
