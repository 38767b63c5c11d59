B=.gpu/benches/workloads
export FUSE_REQUIRE_GPU=1
M="regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
for w in w5_softmax:W5 w8_rmsnorm:W8 w7_layernorm_quantize:W7; do
  k=${w%%:*}; id=${w##*:}
  timeout 150 ncu --clock-control none -k "regex:fuse_$k\$" --launch-skip 2 --launch-count 1 --metrics "$M,sm__warps_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum" $B --bench --only $id > $OUT/stall_$k.txt 2>&1
  echo "== $k"; grep -E "stalled|warps_active|dram__|duration" $OUT/stall_$k.txt | awk '$NF+0 > 0.3 || /dram|duration|active/' | sed 's/  */ /g'
done
