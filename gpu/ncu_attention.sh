#!/usr/bin/env bash
# Nsight Compute on the decode attention (real clocks, each launch alone): the Llama-3.2-1B shape's first
# attention launch at position 1024 (`bench_hf_decode`, 32 query heads over 8 KV heads of 64, bf16) and config
# (c)'s at position 4096 (8 heads of 128, f16). Prints duration, bandwidth, hit rates, issue rate, occupancy
# and where the warps stall; the full reports go to $OUT (or ./out). Why does one SM read a head's cache at
# only 20-25 GB/s (BENCHMARKS.md, eighth pass)?
#
#   bash target/gpu-bundle/ncu_attention.sh     # on the GPU machine
set -uo pipefail
cd "$(dirname "$0")"
out="${OUT:-$PWD/out}"
mkdir -p "$out"
ncu=/usr/local/cuda/bin/ncu
[ -x "$ncu" ] || ncu=$(command -v ncu)
sections=(--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats
  --section Occupancy --section SchedulerStats)
show() {
  grep -E "Duration|DRAM Throughput|Memory Throughput|L1/TEX Hit Rate|L2 Hit Rate|Grid Size|Block Size|Registers Per|Achieved Active Warps|Issued Warp Per Scheduler|No Eligible|Warp Cycles Per Issued|[Ss]tall" "$1"
}
echo "=== attention, Llama-3.2-1B shape at 1024"
"$ncu" --clock-control none --kernel-name attention --launch-skip 0 --launch-count 1 "${sections[@]}" \
  ./bench_hf_decode --preset llama-1b --position 1024 --max-len 2048 --steps 2 > "$out/ncu-attention-llama.txt" 2>&1
show "$out/ncu-attention-llama.txt"
echo "=== attention, config (c) at 4096"
./export-example c "$out/program-c" --backend cuda --memory device > /dev/null || exit 1
"$ncu" --clock-control none --kernel-name attention --launch-skip 0 --launch-count 1 "${sections[@]}" \
  ./delegate-host run "$out/program-c/program.toml" --position 4096 --hold-position --steps 2 \
  > "$out/ncu-attention-c.txt" 2>&1
show "$out/ncu-attention-c.txt"
rm -rf "$out/program-c"
