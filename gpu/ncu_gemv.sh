#!/usr/bin/env bash
# Nsight Compute on the Llama-3.2-1B shape's GEMVs (`bench_hf_decode`, real clocks): the first gate/up launch,
# the first down and output projections, the vocabulary projection and the first Q/K/V launch, each alone.
# Prints their duration, bandwidth, issue rate and occupancy; the full reports go to $OUT (or ./out).
#
#   bash target/gpu-bundle/ncu_gemv.sh     # on the GPU machine
set -uo pipefail
cd "$(dirname "$0")"
out="${OUT:-$PWD/out}"
mkdir -p "$out"
ncu=/usr/local/cuda/bin/ncu
[ -x "$ncu" ] || ncu=$(command -v ncu)
# (kernel, launches of it to skip): the down projection is the second plain `gemv` of a step, the output
# projection the first, the vocabulary projection the 33rd (two a layer, 16 layers).
for spec in "gemv_glu 0" "gemv 1" "gemv 32" "gemv_rope 0" "gemv 0"; do
  set -- $spec
  echo "=== $1, launch $(($2 + 1))"
  "$ncu" --clock-control none --kernel-name "$1" --launch-skip "$2" --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats \
    --section Occupancy --section SchedulerStats \
    ./bench_hf_decode --preset llama-1b --position 1024 --max-len 2048 --steps 2 > "$out/ncu-$1-$2.txt" 2>&1
  grep -E "Duration|DRAM Throughput|Memory Throughput|Grid Size|Registers Per|Achieved Active Warps|Issued Warp Per Scheduler|No Eligible" "$out/ncu-$1-$2.txt"
done
