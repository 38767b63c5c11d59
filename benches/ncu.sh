#!/usr/bin/env bash
# Nsight Compute on the GPU machine: one full-size launch of each row kernel and W3, after
# `shared/gpu/pack benches`. Run from the repository root: `bash benches/ncu.sh`; reports in $OUT.
B=.gpu/benches/workloads
export FUSE_REQUIRE_GPU=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv
SECS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats --section ComputeWorkloadAnalysis"
prof() { # name kernel-regex skip only
  timeout 200 ncu --clock-control none -k "regex:$2" --launch-skip $3 --launch-count 1 $SECS $B --bench --only $4 > $OUT/ncu_$1.txt 2>&1
  echo "== $1 rc=$?"
  grep -E "Grid Size|Registers Per|Duration|DRAM Throughput|^ +Memory Throughput|L1/TEX Hit|L2 Hit|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|Executed Ipc Active|Warp Cycles Per Issued|No Eligible|Block Limit Reg|Dynamic Shared" $OUT/ncu_$1.txt | sed 's/  */ /g'
}
prof w5 'fuse_w5_softmax$' 2 W5
prof w6 'fuse_w6_layernorm_gelu$' 2 W6
prof w7 'fuse_w7_layernorm_quantize$' 2 W7
prof w8 'fuse_w8_rmsnorm$' 2 W8
prof w3 'fuse_w3_bias_gelu_dropout$' 2 W3
prof s1c2 'fuse_w5_softmax$' 2 S1
prof s1c32768 'fuse_w5_softmax$' 138 S1
