#!/usr/bin/env bash
# Nsight Compute on S1's long-row softmax launches (cols 32768 and 262144), after
# `shared/gpu/pack benches`: speed of light, occupancy, launch shape (cluster) and stall reasons.
B=.gpu/benches/workloads
export FUSE_REQUIRE_GPU=1
M="regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,sm__warps_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum,launch__cluster_dim_x,launch__grid_size,launch__shared_mem_per_block_dynamic,launch__occupancy_cluster_pct,sm__throughput.avg.pct_of_peak_sustained_elapsed,launch__registers_per_thread"
for skip in 70 104; do
  timeout 200 ncu --clock-control none -k 'regex:fuse_w5_softmax$' --launch-skip $skip --launch-count 1 --metrics "$M" $B --bench --only S1 > $OUT/long_$skip.txt 2>&1
  echo "== skip $skip rc=$?"
  grep -E "stalled|warps_active|dram__|duration|launch__|sm__throughput" $OUT/long_$skip.txt | awk '$NF+0 > 0.3 || /dram|duration|launch|active|sm__/' | sed 's/  */ /g; s/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//'
done
