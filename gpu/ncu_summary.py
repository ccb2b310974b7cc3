"""Per-kernel time of one Nsight Compute CSV run (`ncu --csv --print-units base --metrics
gpu__time_duration.sum,dram__bytes_read.sum ...`): for each kernel and grid, launches, mean time and DRAM bytes
read per launch, and the sum. Nsight Compute runs kernels one at a time at base clocks, so the times are each
kernel alone (no launch overlaps them) and the sum is above a step's time in the benchmark.

usage: python3 ncu_summary.py NCU.csv"""
import collections, csv, sys

rows = list(csv.reader(open(sys.argv[1])))
start = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
if start is None:
    sys.exit(f"{sys.argv[1]}: Nsight Compute profiled no kernel")
head = rows[start]
ki, gi, mi, vi = (head.index(c) for c in ("Kernel Name", "Grid Size", "Metric Name", "Metric Value"))
kernels = collections.defaultdict(lambda: collections.defaultdict(list))
for r in rows[start + 1:]:
    if len(r) == len(head):
        kernels[(r[ki].split("(")[0], r[gi])][r[mi]].append(float(r[vi].replace(",", "")))
total = 0.0
for (name, grid), m in kernels.items():
    times = m["gpu__time_duration.sum"]
    n, us = len(times), sum(times) / len(times) / 1000
    mb = sum(m["dram__bytes_read.sum"]) / n / 1e6
    total += sum(times) / 1000
    print(f"  {name:12} grid {grid:14} x{n:3}  {us:7.2f} us  {mb:7.2f} MB read  {mb / us if us else 0:5.2f} TB/s")
print(f"  sum {total:.1f} us")
