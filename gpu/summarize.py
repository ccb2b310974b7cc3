"""Joins one `run.sh bench` directory into the side-by-side table of BENCHMARKS.md (markdown on stdout) and
`summary.json` (the same rows, for `cargo xtask plot-bench`): per config and position, PyTorch eager / CUDA graph
(naive and SDPA attention) beside ours zero-copy, zero-copy + CUDA graph and copy-back, with GPU time per step,
host time per step, cache bytes copied per step, host synchronisations per step and the ratio to the HBM floor.

usage: python3 summarize.py OUT_DIR"""
import glob, json, os, sys

out = sys.argv[1]
torch_rows = json.load(open(os.path.join(out, "torch_baseline.json")))
rows, lines = [], []
names = {1: "a", 8: "b", 32: "c"}
lines.append("| config | position | run | GPU µs/step | host µs/step | cache bytes copied/step | host syncs/step | × HBM floor |")
lines.append("|---|---|---|---:|---:|---:|---:|---:|")
for t in torch_rows:
    cfg, pos = t["config"], t["pos"]
    name = names.get(cfg["layers"], str(cfg["layers"]))
    floor = t["hbm"]["floor_us"]
    label = f'({name}) {cfg["layers"]}L {cfg["heads"]}x{cfg["head_dim"]} max {cfg["max_len"]} {t["dtype"]}'
    entries = []
    tm = t.get("timings") or {}
    for key, run in [("naive_eager", "PyTorch eager"), ("sdpa_eager", "PyTorch eager, SDPA"),
                     ("naive_graph", "PyTorch CUDA graph"), ("sdpa_graph", "PyTorch CUDA graph, SDPA")]:
        if key in tm:
            entries.append((run, tm[key]["gpu_us"], tm[key]["host_us"], 0, 0))
    if "naive_graph_plus_copy_back" in tm:
        entries.append(("PyTorch CUDA graph + upstream copy-back", tm["naive_graph_plus_copy_back"]["gpu_us"], None,
                        t["cache_bytes_copied_per_step"]["copy_back"], 0))
    bench = os.path.join(out, f"bench-{name}-{pos}.json")
    if os.path.exists(bench):
        for m in json.load(open(bench))["modes"]:
            run = "ours, " + {("zero-copy", False): "zero-copy", ("zero-copy", True): "zero-copy + CUDA graph",
                              ("copy-back", False): "copy-back (upstream's layout)"}.get((m["mode"], m["cuda_graph"]), m["mode"])
            entries.append((run, m["gpu_median_us"], m["median_us"], m["bytes_copied_per_step"], m["host_syncs_per_step"]))
    for run, gpu, host, copied, syncs in entries:
        ratio = gpu / floor if gpu else None
        rows.append({"config": name, "label": label, "position": pos, "run": run, "gpu_us": gpu, "host_us": host,
                     "cache_bytes_copied": copied, "host_syncs": syncs, "floor_us": floor, "floor_ratio": ratio})
        fmt = lambda v, p=1: "–" if v is None else f"{v:.{p}f}"
        lines.append(f"| {label} | {pos} | {run} | {fmt(gpu)} | {fmt(host)} | {copied} | {fmt(syncs, 0)} | {fmt(ratio, 2)} |")

print("\n".join(lines))
print()
for t in torch_rows:
    h = t["hbm"]
    bw = h.get("measured_bytes_per_s", h["peak_bytes_per_s"])
    print(f'floor, ({names.get(t["config"]["layers"], "?")}) at {t["pos"]}: {h["bytes_read_per_step"] / 1e6:.1f} MB per step '
          f'at {bw / 1e12:.2f} TB/s (a streaming read measured in this run) = {h["floor_us"]:.1f} µs')
print()
for path in sorted(glob.glob(os.path.join(out, "tokens-*.json"))):
    name = path.split("tokens-")[1].split(".")[0]
    ours = json.load(open(path))["tokens"]
    theirs = next((t for t in torch_rows if names.get(t["config"]["layers"]) == name), None)
    if theirs is None:
        continue
    n = min(len(ours), len(theirs["tokens"]))
    same = {k: v[:n] == ours[:n] for k, v in theirs["tokens_by_variant"].items()}
    print(f"config ({name}): our {n} tokens vs PyTorch's: {same}; ours {ours[:n]}")
    rows.append({"config": name, "tokens_ours": ours[:n], "tokens_torch": theirs["tokens_by_variant"], "tokens_equal": same})
json.dump(rows, open(os.path.join(out, "summary.json"), "w"), indent=1)
