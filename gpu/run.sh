#!/usr/bin/env bash
# The GPU machine's side of `cargo xtask gpu-test` and `cargo xtask bench-gpu`: runs from the bundle those
# build (binaries built on a CPU machine; this machine has no Rust toolchain).
#
#   bash target/gpu-bundle/run.sh test    # every GPU test; a missing GPU fails them (KV_REQUIRE_GPU=1)
#   bash target/gpu-bundle/run.sh bench   # the side-by-side benchmark, ours and PyTorch's, then the
#                                         # Llama-3.2-1B-shaped decoder, ours and (with transformers)
#                                         # PyTorch's; JSON to $OUT
#   bash target/gpu-bundle/run.sh quick   # in one short call: every test executable at once, the real
#                                         # models, then prefill and the 1B and 26M exports (ours, floors)
#   bash target/gpu-bundle/run.sh real    # every committed real model on the CUDA delegate, and the chunked
#                                         # prefill export against the reference delegate (part of test)
#   bash target/gpu-bundle/run.sh isolated  # only the isolated-plugin runs and benches, then again under
#                                           # the CUDA Multi-Process Service when the machine has it
#   bash target/gpu-bundle/run.sh sweep base "-DGEMV_PRE=2" "-DGEMV_PRE=2 -DATTN_U=2"
#                                         # GPU µs per step of each kernel setting (the sources' tunables,
#                                         # through KV_CUDA_DEFINES; `base`: as written), in one session
#   bash target/gpu-bundle/run.sh trace   # each config's step as a timeline of its launches (trace_summary.py)
#   bash target/gpu-bundle/run.sh export-bench [SHAPE...]
#                                         # exported graphs at real sizes (fixtures/bench/SHAPE.rgd: llama-1b,
#                                         # qwen2.5-0.5b, tiny-26m; default all) beside the hand-built graph of
#                                         # the same shape, PyTorch compiled and the floor, in one session
#   bash target/gpu-bundle/run.sh prefill-bench [LENGTHS]
#                                         # time to first token of prompts of 128, 1024 and 4096 tokens
#                                         # (default; LENGTHS e.g. 128,1024) at the Llama-3.2-1B shape, bf16,
#                                         # beside the compute floor (a cuBLAS GEMM's bf16 rate, this run) and
#                                         # transformers + torch.compile; JSON to $out/prefill-bench.json
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
export RUST_BACKTRACE=0 KV_REQUIRE_GPU=1
# Results go to a work folder; $OUT (where the `device` tool collects files) gets one archive of them.
out="$here/out"
rm -rf "$out"
mkdir -p "$out"
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader
status=0

run_tests() {
  for t in test_*; do
    [ -x "$t" ] || continue
    echo "== $t"
    ./"$t" --test-threads=1 --include-ignored 2>&1 | tee "$out/$t.log" | grep -E "^test |test result|panicked|needs a" || true
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  done
  echo "== delegate-host plugins"
  ./delegate-host plugins | cut -c1-200
  for cfg in a b; do
    dir="$out/program-$cfg"
    ./export-example "$cfg" "$dir" --backend cuda --memory device > /dev/null || status=1
    for graph in "" "--cuda-graph"; do
      for copy in zero-copy copy-back; do
        [ "$copy" = copy-back ] && [ -n "$graph" ] && continue
        echo "== delegate-host run config $cfg, device memory, $copy $graph"
        ./delegate-host run "$dir/program.toml" --mode "$copy" $graph --json > "$out/run-$cfg-$copy$graph.json" 2> "$out/run-$cfg-$copy$graph.err" || { status=1; cat "$out/run-$cfg-$copy$graph.err"; }
        python3 - "$out/run-$cfg-$copy$graph.json" <<'PY' || status=1
import json, sys
v = json.load(open(sys.argv[1])); s = v["stats"]
print("tokens", v["tokens"][:16], "..." if len(v["tokens"]) > 16 else "", "| steps", len(v["tokens"]) - 1,
      "| host syncs/step", s.get("host_syncs_per_decode_step"), "| device loop", s.get("device_loop"),
      "| graph", s.get("cuda_graph"), "| bytes/step", s.get("mean_decode_bytes_copied_total"),
      "| GPU us/step", s.get("mean_decode_gpu_us"), "| host us/step", s.get("mean_decode_step_us"))
PY
      done
    done
  done
  run_isolated
}

# The CUDA delegate in a worker process (device caches over CUDA IPC) against in-process: tokens, bytes per
# step, and host time per step. Needs `$out/program-{a,b}` and their in-process `run-*-zero-copy.json`.
run_isolated() {
  echo "== isolated CUDA delegate${1:+ ($1)}: a worker process, device caches over CUDA IPC"
  iso="$out/isolated-plugins"
  mkdir -p "$iso" && cp libcuda_delegate_dylib.so "$iso/"
  ./delegate-host plugin-manifest --isolate "$iso/libcuda_delegate_dylib.so" > /dev/null || status=1
  for cfg in a b; do
    dir="$out/program-$cfg"
    ./delegate-host run "$dir/program.toml" --plugin-dir "$iso" --json > "$out/run-$cfg-isolated.json" 2> "$out/run-$cfg-isolated.err" || { status=1; cat "$out/run-$cfg-isolated.err"; }
    python3 - "$out/run-$cfg-isolated.json" "$out/run-$cfg-zero-copy.json" <<'PY' || status=1
import json, sys
iso, here = (json.load(open(f)) for f in sys.argv[1:3])
same = iso["tokens"] == here["tokens"]
print("isolated tokens equal in-process:", same, "| bytes/step", iso["stats"]["mean_decode_bytes_copied_total"],
      "| host us/step isolated", iso["stats"]["mean_decode_step_us"], "in-process", here["stats"]["mean_decode_step_us"])
sys.exit(0 if same else 1)
PY
    for isolate in "" "--plugin-dir $iso"; do
      echo "== bench config $cfg ${isolate:+(isolated)}"
      ./delegate-host bench "$dir/program.toml" $isolate --steps 12 --runs 6 --json > "$out/bench-iso-$cfg.json" 2> "$out/bench-iso-$cfg.err" || { status=1; cat "$out/bench-iso-$cfg.err"; }
      python3 - "$out/bench-iso-$cfg.json" <<'PY' || status=1
import json, sys
for m in json.load(open(sys.argv[1]))["modes"]:
    print(f'  {m["mode"]:10} graph={str(m["cuda_graph"]):5} host median {m["median_us"]:8.1f} us  bytes/step {m["bytes_copied_per_step"]}')
PY
    done
  done
}

# The isolated runs alone, then under MPS (the CUDA Multi-Process Service lets the host's and the worker's
# contexts share the GPU without time-slicing it between processes). The daemon is this run's own (its pipe
# and log folders under $out) and is stopped at the end; the GPU's settings are not touched.
run_isolated_only() {
  for cfg in a b; do
    dir="$out/program-$cfg"
    ./export-example "$cfg" "$dir" --backend cuda --memory device > /dev/null || status=1
    ./delegate-host run "$dir/program.toml" --json > "$out/run-$cfg-zero-copy.json" 2> "$out/run-$cfg.err" || { status=1; cat "$out/run-$cfg.err"; }
  done
  run_isolated
  if command -v nvidia-cuda-mps-control > /dev/null; then
    export CUDA_MPS_PIPE_DIRECTORY="$out/mps/pipe" CUDA_MPS_LOG_DIRECTORY="$out/mps/log"
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if nvidia-cuda-mps-control -d; then
      run_isolated "under MPS"
      echo quit | nvidia-cuda-mps-control
    else
      echo "== MPS: the daemon did not start"
    fi
  else
    echo "== MPS: nvidia-cuda-mps-control is not on this machine"
  fi
}

run_bench() {
  for cfg in a b c; do
    dir="$out/program-$cfg"
    ./export-example "$cfg" "$dir" --backend cuda --memory device --config-json "$out/config-$cfg.json" > /dev/null || { status=1; continue; }
    max=$(python3 -c "import json;print(json.load(open('$out/config-$cfg.json'))['max_len'])")
    for pos in $((max / 2)) $((max - 1)); do
      echo "== bench config $cfg at position $pos"
      ./delegate-host bench "$dir/program.toml" --position "$pos" --hold-position --steps 20 --runs 6 --json > "$out/bench-$cfg-$pos.json" 2> "$out/bench-$cfg-$pos.err" || { status=1; cat "$out/bench-$cfg-$pos.err"; }
      python3 - "$out/bench-$cfg-$pos.json" <<'PY' || status=1
import json, sys
v = json.load(open(sys.argv[1]))
for m in v["modes"]:
    print(f'  {m["mode"]:10} graph={str(m["cuda_graph"]):5} GPU median {m["gpu_median_us"]:8.1f} us  host median {m["median_us"]:8.1f} us'
          f'  syncs/step {m["host_syncs_per_step"]}  bytes/step {m["bytes_copied_per_step"]}')
PY
    done
    if [ -n "${PROFILE:-}" ]; then
      echo "== per-kernel GPU time, config $cfg at position $((max / 2)) (ncu: one step's kernels, each alone, base clocks)"
      # A step of the example decoder: the embedding, three kernels a layer, the logits and argmax, and the
      # device loop's feedback kernel.
      kernels=$(python3 -c "import json;print(3 * json.load(open('$out/config-$cfg.json'))['layers'] + 4)")
      /usr/local/cuda/bin/ncu --csv --print-units base --cache-control none --launch-skip $((kernels * 5)) --launch-count "$kernels" \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum \
        ./delegate-host run "$dir/program.toml" --position $((max / 2)) --hold-position --steps 40 --json > "$out/ncu-$cfg.csv" 2>/dev/null
      python3 ncu_summary.py "$out/ncu-$cfg.csv" || status=1
    fi
    steps=$(python3 -c "import json;c=json.load(open('$out/config-$cfg.json'));print(min(32,c['max_len']-len(c['prompt'])))")
    ./delegate-host run "$dir/program.toml" --steps "$steps" --json > "$out/tokens-$cfg.json" 2> "$out/tokens-$cfg.err" || status=1
    rm -rf "$dir"
  done
  echo "== PyTorch baseline"
  python3 torch_baseline.py --config "$out/config-a.json" --config "$out/config-b.json" --config "$out/config-c.json" --device cuda --out "$out/torch_baseline.json" > "$out/torch_baseline.log" 2>&1 || status=1
  tail -5 "$out/torch_baseline.log"
  python3 summarize.py "$out" || status=1
  run_llama
}

# A Llama-3.2-1B-shaped decoder (bf16, random weights, built on this machine by the bench) at position 1024,
# replayed as a CUDA graph; its floor divides its bytes by the read bandwidth torch_baseline.py measured.
run_llama() {
  echo "== Llama-3.2-1B-shaped decoder, bf16, position 1024 of 2048 (bench_hf_decode; PyTorch beside it: llama_torch.py)"
  ./bench_hf_decode --preset llama-1b --position 1024 --max-len 2048 --steps 100 > "$out/llama-1b.json" 2> "$out/llama-1b.err" || { status=1; cat "$out/llama-1b.err"; return; }
  if python3 -c "import transformers" 2> /dev/null; then
    python3 llama_torch.py --shape "$out/llama-1b.json" --steps 100 > "$out/llama-torch.json" 2> "$out/llama-torch.err" || { status=1; tail -5 "$out/llama-torch.err"; }
  else
    echo "  PyTorch beside it: not run (this machine's Python has no transformers)"
  fi
  python3 - "$out/llama-1b.json" "$out/torch_baseline.json" "$out/llama-torch.json" <<'PY' || status=1
import json, os, sys
v = json.load(open(sys.argv[1]))
hbm = json.load(open(sys.argv[2]))[0]["hbm"]
bw = hbm.get("measured_bytes_per_s", hbm["peak_bytes_per_s"])
floor = v["bytes_per_step"] / bw * 1e6
ours = v["gpu_us_per_step"]
print(f'  {v["parameters"] / 1e9:.3f} B parameters, {v["bytes_per_step"] / 1e9:.3f} GB read per step; GPU '
      f'{ours:.1f} us per step (CUDA graph); floor {floor:.1f} us at {bw / 1e12:.2f} TB/s (x{ours / floor:.2f})')
if os.path.exists(sys.argv[3]) and os.path.getsize(sys.argv[3]) > 0:
    t = json.load(open(sys.argv[3]))
    for name, key in [("eager", "eager"), ('torch.compile(mode="reduce-overhead")', "compiled_reduce_overhead")]:
        us = t[key]["gpu_us"]
        print(f'  PyTorch {t["torch"]}, transformers {t["transformers"]} StaticCache, {name}: {us:.1f} us per '
              f'step (x{us / floor:.2f} the floor; ours is {us / ours:.2f}x faster), {t["parameters"] / 1e9:.3f} B parameters')
PY
}

# Each setting's GPU time per step, one build, one session: configs (c) at 4096 and 8191, (b) at 512 and 1023
# and (a) at 8 decoding at a held position as a CUDA graph (the mean of 200 steps), then the Llama-3.2-1B shape.
run_sweep() {
  for cfg in a b c; do
    ./export-example "$cfg" "$out/program-$cfg" --backend cuda --memory device > /dev/null || { status=1; return; }
  done
  for setting in "$@"; do
    if [ "$setting" = base ]; then export KV_CUDA_DEFINES=""; else export KV_CUDA_DEFINES="$setting"; fi
    echo "== $setting"
    for spec in "c 4096" "c 8191" "b 512" "b 1023" "a 8"; do
      set -- $spec
      ./delegate-host run "$out/program-$1/program.toml" --position "$2" --hold-position --cuda-graph --steps 200 --json > "$out/sweep.json" 2> "$out/sweep.err" || { status=1; tail -3 "$out/sweep.err"; continue; }
      python3 - "$out/sweep.json" "$1" "$2" <<'PY' || status=1
import json, sys
v = json.load(open(sys.argv[1])); s = v["stats"]
print(f'  ({sys.argv[2]}) at {sys.argv[3]}: {s["mean_decode_gpu_us"]:8.1f} us per step, tokens {v["tokens"][:4]}, '
      f'host syncs/step {s.get("host_syncs_per_decode_step")}')
PY
    done
    ./bench_hf_decode --preset llama-1b --position 1024 --max-len 2048 --steps 100 > "$out/sweep-llama.json" 2> "$out/sweep.err" || { status=1; tail -3 "$out/sweep.err"; continue; }
    python3 - "$out/sweep-llama.json" <<'PY' || status=1
import json, sys
print(f'  Llama-3.2-1B shape at 1024: {json.load(open(sys.argv[1]))["gpu_us_per_step"]:8.1f} us per step')
PY
  done
}

# A timeline of each config's step (a tuning build's trace, `kernels/trace.cuh`): every block's start, wait,
# work and end, summarised per launch and phase by trace_summary.py; `run.sh trace "-DX=Y"` adds defines.
run_trace() {
  for cfg in a b c; do
    ./export-example "$cfg" "$out/program-$cfg" --backend cuda --memory device > /dev/null || { status=1; return; }
  done
  export KV_CUDA_DEFINES="-DKV_TRACE ${1:-}"
  for spec in "c 4096 f16" "c 8191 f16" "b 512 f16" "a 8 f32"; do
    set -- $spec
    echo "== trace: ($1) at $2, $KV_CUDA_DEFINES"
    KV_CUDA_TRACE="$out/trace-$1-$2" ./delegate-host run "$out/program-$1/program.toml" --position "$2" --hold-position --cuda-graph --steps 40 --json > "$out/trace.json" 2> "$out/trace.err" || { status=1; tail -3 "$out/trace.err"; continue; }
    python3 -c "import json,sys;print(f'  {json.load(open(sys.argv[1]))[\"stats\"][\"mean_decode_gpu_us\"]:.1f} us per step with the trace')" "$out/trace.json"
    python3 trace_summary.py "$out/trace-$1-$2.$3" --step-table --attention > "$out/trace-$1-$2.txt" || status=1
    rm -f "$out/trace-$1-$2.$3"
    if [ "$1 $2" = "c 4096" ]; then head -n 24 "$out/trace-$1-$2.txt"; else head -n 3 "$out/trace-$1-$2.txt"; fi
    sed -n '/^per pair/,$p' "$out/trace-$1-$2.txt" | head -n 12
  done
  echo "== trace: Llama-3.2-1B shape at 1024"
  KV_CUDA_TRACE="$out/trace-llama" ./bench_hf_decode --preset llama-1b --position 1024 --max-len 2048 --steps 20 > "$out/trace-llama.json" 2> "$out/trace.err" || { status=1; tail -3 "$out/trace.err"; return; }
  python3 trace_summary.py "$out/trace-llama.bf16" --step-table --attention > "$out/trace-llama.txt" || status=1
  rm -f "$out/trace-llama.bf16"
  head -n 3 "$out/trace-llama.txt"
  sed -n '/^per pair/,$p' "$out/trace-llama.txt" | head -n 14
}

# Every committed real model (fixtures/executorch/real/: Hugging Face exports, LayerNorm families, eager
# attention) on the CUDA delegate through delegate-host, with and without a CUDA graph: eager's tokens (f32;
# half types printed), no byte copied and no host synchronisation per decode step. The tree beside the bundle
# holds the fixtures (the device tool carries tracked files).
run_real() {
  echo "== real models on the CUDA delegate"
  python3 - "$here/../../fixtures/executorch/real" "$out" <<'PY' || status=1
import json, subprocess, sys
from pathlib import Path
root, out = Path(sys.argv[1]), Path(sys.argv[2])
expected = json.loads((root / "expected.json").read_text())
prompt = ",".join(map(str, expected["prompt"]))
failed = 0
for name, meta in expected["programs"].items():
    cuda = root / meta["cuda"]
    for graph in ([], ["--cuda-graph"]):
        cmd = ["./delegate-host", "run", str(cuda), "--prompt", prompt, "--steps", str(expected["steps"]), "--json"]
        done = subprocess.run(cmd + graph, capture_output=True, text=True)
        what = f"{meta['cuda']}{' graph' if graph else ''}"
        if done.returncode != 0:
            print(f"{what}: FAILED {done.stderr.strip()[-400:]}"); failed += 1; continue
        report = json.loads(done.stdout); stats = report["stats"]
        same = report["tokens"] == meta["tokens"]
        clean = stats.get("mean_decode_bytes_copied_total") == 0 and stats.get("host_syncs_per_decode_step") == 0
        print(f"{what}: tokens {'equal eager' if same else 'DIFFER'} ({meta['dtype']}) | bytes/step "
              f"{stats.get('mean_decode_bytes_copied_total')} | syncs/step {stats.get('host_syncs_per_decode_step')}"
              f" | GPU us/step {stats.get('mean_decode_gpu_us')}")
        if not same:
            n = next((i for i, (a, b) in enumerate(zip(report["tokens"], meta["tokens"])) if a != b), None)
            print(f"    first difference at token {n}: {report['tokens'][n:n+4]} against eager's {meta['tokens'][n:n+4]}")
        failed += (not clean) or (not same and meta["dtype"] == "f32")
(out / "real.txt").write_text(f"failed {failed}\n")
sys.exit(1 if failed else 0)
PY
  echo "== a chunked prefill export on the CUDA delegate against the reference delegate"
  python3 - "$here/../../fixtures/executorch/prefill" <<'PY' || status=1
import json, subprocess, sys
from pathlib import Path
root = Path(sys.argv[1])
long = [(i * 37 + 5) % 128 for i in range(11)]
failed = 0
for n in [2, 4, 9, 11]:
    prompt = ",".join(map(str, long[:n]))
    def run(program, *extra):
        done = subprocess.run(["./delegate-host", "run", str(root / program), "--prompt", prompt, "--steps", "16",
                               "--json", *extra], capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{program} {extra}: {done.stderr.strip()[-400:]}")
        return json.loads(done.stdout)
    want = run("llama_f32.pte")["tokens"]
    for extra in [(), ("--cuda-graph",)]:
        got = run("llama_f32.cuda.pte", *extra)
        s = got["stats"]
        ok = got["tokens"] == want and s.get("mean_decode_bytes_copied_total") == 0 and s.get("host_syncs_per_decode_step") == 0
        failed += not ok
        print(f"prompt of {n}{' graph' if extra else ''}: {'tokens equal the reference' if ok else 'DIFFER ' + str(got['tokens']) + ' vs ' + str(want)}")
sys.exit(1 if failed else 0)
PY
}

# Issue 45 item 3: each shape's exported graph (a hollow graph of fixtures/bench/, the payload transformers'
# recipe and the CudaPartitioner give, filled from a seed by bench_export_decode) beside the hand-built graph of
# the same shape (bench_hf_decode) and transformers + torch.compile(mode="reduce-overhead") on it
# (llama_torch.py), at position 1024 of 2048 as CUDA graphs; export_bench.py measures the read bandwidth in
# this session and prints each as µs per step and a ratio to the exported graph's floor (export-bench.json).
run_export_bench() {
  local shapes=("$@")
  [ ${#shapes[@]} -gt 0 ] || shapes=(llama-1b qwen2.5-0.5b tiny-26m)
  local fixtures="$here/../../fixtures/bench"
  for shape in "${shapes[@]}"; do
    case "$shape" in
      qwen2.5-0.5b) preset=qwen-0.5b ;;
      *) preset="$shape" ;;
    esac
    echo "== $shape: exported (bench_export_decode), hand-built (bench_hf_decode --preset $preset), PyTorch"
    ./bench_export_decode --graph "$fixtures/$shape.rgd" --position 1024 --steps 100 > "$out/export-$shape.json" 2> "$out/export-$shape.err" || { status=1; tail -3 "$out/export-$shape.err"; }
    ./bench_hf_decode --preset "$preset" --position 1024 --max-len 2048 --steps 100 > "$out/hand-$shape.json" 2> "$out/hand-$shape.err" || { status=1; tail -3 "$out/hand-$shape.err"; }
    if ! python3 -c "import transformers" 2> /dev/null; then
      echo "  PyTorch beside it: not run (this machine's Python has no transformers)"
    elif [ -s "$out/export-$shape.json" ]; then
      python3 llama_torch.py --shape "$out/export-$shape.json" --steps 100 > "$out/torch-$shape.json" 2> "$out/torch-$shape.err" || { status=1; tail -5 "$out/torch-$shape.err"; }
    fi
  done
  python3 export_bench.py "$out" --shapes "${shapes[@]}" --json "$out/export-bench.json" || status=1
}

# Issue 45 item 4: time to first token at the Llama-3.2-1B shape (bf16, the hand-built decoder's prefill graph,
# the whole prompt one call, products on tensor cores; bench_prefill) beside its compute floor, 2 x parameters x
# tokens FLOPs at the bf16 dense rate a large cuBLAS GEMM reaches in this run, and transformers +
# torch.compile's prefill of the same prompts (prefill_torch.py); tokens per second per length.
run_prefill_bench() {
  local lengths="${1:-128,1024,4096}"
  echo "== prefill, Llama-3.2-1B shape, bf16, prompts of $lengths tokens (bench_prefill; PyTorch: prefill_torch.py)"
  ./bench_prefill --preset llama-1b --lengths "$lengths" > "$out/prefill.json" 2> "$out/prefill.err" || { status=1; tail -5 "$out/prefill.err"; return; }
  if python3 -c "import transformers" 2> /dev/null; then
    python3 prefill_torch.py --shape "$out/prefill.json" > "$out/prefill-torch.json" 2> "$out/prefill-torch.err" || { status=1; tail -5 "$out/prefill-torch.err"; }
  else
    echo "  PyTorch beside it: not run (this machine's Python has no transformers)"
  fi
  python3 - "$out/prefill.json" "$out/prefill-torch.json" "$out/prefill-bench.json" <<'PY' || status=1
import json, os, sys
ours = json.load(open(sys.argv[1]))
theirs = json.load(open(sys.argv[2])) if os.path.exists(sys.argv[2]) and os.path.getsize(sys.argv[2]) > 0 else None
torch_by = {e["tokens"]: e for e in theirs["lengths"]} if theirs else {}
rate = ours["bf16_dense_flops_per_s"]
print(f'  bf16 dense rate {rate / 1e12:.0f} TFLOP/s ({ours["rate_probe"]}); chunk: {ours["chunk"]}')
print(f'  {"tokens":>7} {"floor ms":>9} {"ours ms":>9} {"x floor":>8} {"ours tok/s":>11} {"torch ms":>9} {"x floor":>8} {"torch tok/s":>12} {"speed-up":>9}')
rows = []
for e in ours["lengths"]:
    t = torch_by.get(e["tokens"], {}).get("compiled")
    row = {"tokens": e["tokens"], "floor_us": e["floor_us"], "ours_us": e["ttft_us"], "ours_x_floor": e["x_floor"],
           "ours_tokens_per_s": e["tokens_per_s"]}
    cells = [f'{e["tokens"]:>7}', f'{e["floor_us"] / 1e3:>9.2f}', f'{e["ttft_us"] / 1e3:>9.2f}', f'{e["x_floor"]:>8.2f}',
             f'{e["tokens_per_s"]:>11.0f}']
    if t:
        row.update(torch_compiled_us=t["gpu_us"], torch_x_floor=t["gpu_us"] / e["floor_us"],
                   torch_tokens_per_s=t["tokens_per_s"], speed_up=t["gpu_us"] / e["ttft_us"])
        cells += [f'{t["gpu_us"] / 1e3:>9.2f}', f'{row["torch_x_floor"]:>8.2f}', f'{t["tokens_per_s"]:>12.0f}',
                  f'{row["speed_up"]:>8.2f}x']
    else:
        cells.append("  PyTorch not run")
    print("  " + " ".join(cells))
    rows.append(row)
json.dump({"ours": ours, "torch": theirs, "rows": rows}, open(sys.argv[3], "w"), indent=1)
PY
}

# Everything new in one short call, for a lease with minutes left: every test executable at once, one test at a
# time each (correctness only: they share the GPU, so nothing timed; a test that fails beside the others runs
# again alone, and only a failure alone fails the run: on an H100 four threads each crashed cuda-rt's tests and
# failed device-loop tests that pass alone), then the real models, then the two benches that carry the goals
# (ours only, no PyTorch: prefill at 128/1024/4096 tokens and the 1B and 26M exports beside their floors), each
# step under its own time limit so one hang costs only its share.
run_quick() {
  local t0=$SECONDS pids=()
  for t in test_*; do
    [ -x "$t" ] || continue
    ( timeout 240 ./"$t" --test-threads=1 --include-ignored > "$out/$t.log" 2>&1; echo "exit $?" >> "$out/$t.log" ) &
    pids+=($!)
  done
  wait "${pids[@]}"
  for t in test_*; do
    [ -f "$out/$t.log" ] || continue
    echo "== $t: $(grep -E '^test result' "$out/$t.log" | tail -1) $(tail -1 "$out/$t.log")"
    grep -E "FAILED|panicked" "$out/$t.log" | head -5
    tail -1 "$out/$t.log" | grep -q "exit 0" && continue
    if tail -1 "$out/$t.log" | grep -q "exit 124"; then
      status=1; echo "   ran past its 240 s (last test started: $(grep -E '^test ' "$out/$t.log" | tail -1 | cut -c1-120))"; continue
    fi
    # Failed beside the others (they share the GPU): each failed test again alone, so that a failure of its
    # own shows apart from one of contention; a crash leaves no names, so the whole executable runs again.
    local failed
    failed=$(sed -n 's/^test \(.*\) \.\.\. FAILED$/\1/p' "$out/$t.log")
    echo "   again alone: ${failed:-every test (it ended without a result)}"
    if [ -n "$failed" ]; then
      for name in $failed; do
        timeout 60 ./"$t" --exact "$name" --include-ignored > "$out/$t.alone.log" 2>&1 && echo "   $name: passes alone" || { status=1; echo "   $name: fails alone"; grep -E "panicked|Error|error" "$out/$t.alone.log" | head -3 | cut -c1-300; }
      done
    else
      timeout 120 ./"$t" --test-threads=1 --include-ignored > "$out/$t.alone.log" 2>&1 && echo "   passes alone" || { status=1; echo "   fails alone"; grep -E "^test .*FAILED|panicked" "$out/$t.alone.log" | head -5 | cut -c1-300; }
    fi
  done
  echo "== tests took $((SECONDS - t0)) s"
  run_real
  timeout 60 ./bench_prefill --preset llama-1b --lengths 128,1024,4096 > "$out/prefill.json" 2> "$out/prefill.err" || { status=1; tail -3 "$out/prefill.err"; }
  for shape in llama-1b tiny-26m; do
    timeout 45 ./bench_export_decode --graph "$here/../../fixtures/bench/$shape.rgd" --position 1024 --steps 100 > "$out/export-$shape.json" 2> "$out/export-$shape.err" || { status=1; tail -3 "$out/export-$shape.err"; }
  done
  for f in "$out"/prefill.json "$out"/export-*.json; do
    [ -s "$f" ] && { echo "== $(basename "$f")"; head -c 1500 "$f"; echo; }
  done
  echo "== quick took $((SECONDS - t0)) s"
}

mode="${1:-test}"
case "$mode" in
  test) run_tests; run_real ;;
  quick) run_quick ;;
  real) run_real ;;
  bench) run_bench ;;
  isolated) run_isolated_only ;;
  sweep) shift; run_sweep "${@:-base}" ;;
  trace) shift; run_trace "${1:-}" ;;
  export-bench) shift; run_export_bench "$@" ;;
  prefill-bench) shift; run_prefill_bench "$@" ;;
  *) echo "usage: run.sh test|quick|real|bench|isolated|sweep [SETTING...]|trace [SETTING]|export-bench [SHAPE...]|prefill-bench [LENGTHS]" >&2; exit 2 ;;
esac
if [ -n "${OUT:-}" ]; then
  tar czf "$OUT/results-$mode.tgz" --exclude='program-*' -C "$out" .
fi
exit $status
