#!/usr/bin/env python3
"""The table of `run.sh export-bench` (issue 45 item 3): per shape, the exported graph (`bench_export_decode`),
the hand-built graph of the same shape (`bench_hf_decode`) and transformers + torch.compile on it
(`llama_torch.py`), each as GPU µs per decode step and as a ratio to the floor: the exported graph's bytes per
step over the read bandwidth measured here, in the same run (`torch_baseline.measured_read_bandwidth`).

    python3 export_bench.py OUT_DIR --shapes llama-1b qwen2.5-0.5b tiny-26m [--json FILE]

Reads `OUT_DIR/export-SHAPE.json`, `hand-SHAPE.json` and `torch-SHAPE.json` (a missing or empty one is shown as
not run); prints the table (and each exported step's launches beside chains of as many) and writes every
figure, with the bandwidth and the device, to `--json`. Exits 1 when an exported graph did not run."""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def load(path):
    """The JSON object in `path`, or None when the file is missing or empty."""
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return None
    with open(path) as f:
        return json.load(f)


def row(out_dir, shape, bandwidth):
    """One shape's figures: µs per step and ratio to the floor of each variant that ran."""
    exported = load(os.path.join(out_dir, f"export-{shape}.json"))
    hand = load(os.path.join(out_dir, f"hand-{shape}.json"))
    torch_run = load(os.path.join(out_dir, f"torch-{shape}.json"))
    result = {"shape": shape, "exported": exported, "hand_built": hand, "torch": torch_run}
    if exported is None:
        return result
    floor = exported["bytes_per_step"] / bandwidth * 1e6
    result["floor_us"] = floor
    us = {"exported": exported["gpu_us_per_step"]}
    if hand is not None:
        us["hand_built"] = hand["gpu_us_per_step"]
    if torch_run is not None:
        us["torch_eager"] = torch_run["eager"]["gpu_us"]
        us["torch_compiled"] = torch_run["compiled_reduce_overhead"]["gpu_us"]
    result["us_per_step"] = us
    result["x_floor"] = {k: v / floor for k, v in us.items()}
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--shapes", nargs="+", required=True)
    ap.add_argument("--json", help="where to write every figure")
    args = ap.parse_args()
    import torch
    from torch_baseline import measured_read_bandwidth

    bandwidth = measured_read_bandwidth("cuda")
    rows = [row(args.out_dir, shape, bandwidth) for shape in args.shapes]
    print(f"floor: each exported graph's bytes per step at {bandwidth / 1e12:.2f} TB/s (read bandwidth measured in "
          f"this run, {torch.cuda.get_device_name(0)})")
    header = ["shape", "params", "GB/step", "floor us", "exported", "hand-built", "torch compiled", "torch eager",
              "exported/hand"]
    print("  ".join(f"{h:>14}" for h in header))
    failed = False
    for r in rows:
        e = r["exported"]
        if e is None:
            print(f"{r['shape']:>14}  the exported graph did not run")
            failed = True
            continue
        us, x = r["us_per_step"], r["x_floor"]
        cell = lambda k: f"{us[k]:8.1f} x{x[k]:.2f}" if k in us else "not run"  # noqa: E731
        ratio = f"{us['exported'] / us['hand_built']:.3f}" if "hand_built" in us else "-"
        cells = [r["shape"], f"{e['parameters'] / 1e6:.1f} M", f"{e['bytes_per_step'] / 1e9:.3f}",
                 f"{r['floor_us']:.1f}", cell("exported"), cell("hand_built"), cell("torch_compiled"),
                 cell("torch_eager"), ratio]
        print("  ".join(f"{c:>14}" for c in cells))
        if "launches_per_step" in e:
            print(f"{'':>14}  exported: {e['launches_per_step']} launches a step; an empty chain of as many "
                  f"overlapped launches takes {e['empty_chain_us_per_step']:.1f} us (the step's launch floor), "
                  f"a relay chain (each launch reading the last one's output) {e.get('relay_chain_us_per_step', 0):.1f} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "measured_bytes_per_s": bandwidth,
                       "torch": torch.__version__, "rows": rows}, f, indent=1)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
