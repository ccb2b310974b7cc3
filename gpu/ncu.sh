#!/usr/bin/env bash
# Nsight Compute on one step's launches, each alone, at real clocks: duration, bandwidth, hit rates, issue
# rate, occupancy and where the warps stall. The full reports go to $OUT (or ./out).
#
#   bash target/gpu-bundle/ncu.sh gemv        # the Llama-3.2-1B shape's GEMVs (`bench_hf_decode`): the first
#                                             # gate/up, down, vocabulary, Q/K/V and output projection launches
#   bash target/gpu-bundle/ncu.sh attention   # the first attention launch of the Llama shape at 1024 (32 query
#                                             # heads over 8 KV heads of 64, bf16: clustered) and of config (c)
#                                             # at 4096
set -uo pipefail
cd "$(dirname "$0")"
out="${OUT:-$PWD/out}"
mkdir -p "$out"
ncu=/usr/local/cuda/bin/ncu
[ -x "$ncu" ] || ncu=$(command -v ncu)
llama=(./bench_hf_decode --preset llama-1b --position 1024 --max-len 2048 --steps 2)

# profile NAME KERNEL SKIP COMMAND...: launch SKIP + 1 of KERNEL under COMMAND, its report to $out/ncu-NAME.txt.
profile() {
  local name=$1 kernel=$2 skip=$3
  shift 3
  echo "=== $name: $kernel, launch $((skip + 1))"
  "$ncu" --clock-control none --kernel-name "$kernel" --launch-skip "$skip" --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats \
    --section Occupancy --section SchedulerStats "$@" > "$out/ncu-$name.txt" 2>&1
  local shown="Duration|DRAM Throughput|Memory Throughput|L1/TEX Hit Rate|L2 Hit Rate|Grid Size|Block Size"
  shown+="|Registers Per|Achieved Active Warps|Issued Warp Per Scheduler|No Eligible|Warp Cycles Per Issued|[Ss]tall"
  grep -E "$shown" "$out/ncu-$name.txt"
}

case "${1:-}" in
  gemv)
    # The down projection is the second plain GEMV of a step, the output projection the first (the `_deep`
    # entry: 256 blocks); the gate/up and vocabulary projections have more groups of columns than a wave of
    # blocks (the `_waves` entries).
    profile gate-up gemv_glu_waves 0 "${llama[@]}"
    profile down gemv_deep 1 "${llama[@]}"
    profile vocabulary gemv_waves 0 "${llama[@]}"
    profile qkv gemv_rope 0 "${llama[@]}"
    profile output gemv_deep 0 "${llama[@]}"
    ;;
  attention)
    profile attention-llama attention_tc_cluster 0 "${llama[@]}"
    ./export-example c "$out/program-c" --backend cuda --memory device > /dev/null || exit 1
    profile attention-c attention_tc 0 ./delegate-host run "$out/program-c/program.toml" --position 4096 \
      --hold-position --steps 2
    rm -rf "$out/program-c"
    ;;
  *) echo "usage: ncu.sh gemv|attention" >&2; exit 2 ;;
esac
