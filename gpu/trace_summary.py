"""Where a decode step's time goes, from the trace of a tuning build (`run.sh trace`).

Reads the ring `kernels::tuning::dump_trace` wrote (`kernels/trace.cuh`: each block's start, wait, end of its
main work and end, on the global timer) and prints, for the steps it holds, each launch of one step and the
mean of each phase over every step: how long after the previous launch ended its blocks passed their wait
(the dependency's release), and how long they took from there.

    python3 trace_summary.py TRACE [--step-table] [--attention]
"""

import sys

import numpy as np

# The kernels as `plugins/cuda/src/kernels/trace.cuh` numbers them (TRACE_*); a merging attention block is one
# of its launch.
KINDS = {1: "gather", 2: "add", 3: "rms", 4: "gemv", 5: "kv", 6: "attention", 7: "argmax", 8: "attention"}
ATTN, MERGE = 6, 8


def load(path):
    raw = np.fromfile(path, dtype="<u8")
    taken, ring = int(raw[0]), raw[1:].reshape(-1, 4)
    ring = ring[ring[:, 0] != 0]
    r = {
        "t0": ring[:, 0].astype(np.int64),
        "wait": (ring[:, 1] & 0xFFFFFFFF).astype(np.int64),
        "work": (ring[:, 1] >> 32).astype(np.int64),
        "end": (ring[:, 2] & 0xFFFFFFFF).astype(np.int64),
        "kind": ((ring[:, 2] >> 32) & 0xFF).astype(np.int64),
        "sm": (ring[:, 2] >> 40).astype(np.int64),
        "block": (ring[:, 3] & 0xFFFFFFFF).astype(np.int64),
        "grid": (ring[:, 3] >> 32).astype(np.int64),
    }
    return taken, r


def launches(r):
    """Blocks grouped into launches: every block of a launch passes its wait after every block of the launch
    before it ended, so in order of wait time a launch is a run of one kernel and grid size."""
    waited = r["wait"] > 0
    tw = r["t0"] + r["wait"]
    order = np.argsort(np.where(waited, tw, np.iinfo(np.int64).max), kind="stable")
    order = order[waited[order]]
    key = np.where(r["kind"] == MERGE, ATTN, r["kind"]) * (1 << 32) + r["grid"]
    out, cur = [], [order[0]]
    for i in order[1:]:
        if key[i] == key[cur[-1]]:
            cur.append(i)
        else:
            out.append(np.array(cur))
            cur = [i]
    out.append(np.array(cur))
    return out


def describe(r, idx):
    t0, tw = r["t0"][idx], r["t0"][idx] + r["wait"][idx]
    tend = r["t0"][idx] + r["end"][idx]
    work = r["t0"][idx] + np.where(r["work"][idx] > 0, r["work"][idx], r["end"][idx])
    merge = r["kind"][idx] == MERGE
    return {
        "kind": KINDS[int(r["kind"][idx[0]])],
        "grid": int(r["grid"][idx[0]]),
        "blocks": len(idx),
        "start_first": t0.min(),
        "start_median": np.median(t0),
        "start_last": t0.max(),
        "wait_first": tw.min(),
        "wait_median": np.median(tw),
        "wait_last": tw.max(),
        "work_median": np.median(work),
        "work_last": work.max(),
        "end_median": np.median(tend),
        "end_last": tend.max(),
        "merge_start": work[merge].min() if merge.any() else None,
        "merge_end": tend[merge].max() if merge.any() else None,
    }


def attention_tail(r, idx):
    """Where one attention launch's time goes, us from its first wait passed: its blocks' work done (median,
    90th percentile, last of the blocks that did not merge), the merging blocks' work done and merge, the
    launch's end; with -DKV_TRACE_MERGE (a merging block's work marked when its ticket is taken, its wait when
    its loads are done) the merge's loads and what follows them. None for a launch without a merge."""
    merge = r["kind"][idx] == MERGE
    if not merge.any():
        return None
    t0 = r["t0"][idx] - (r["t0"][idx] + r["wait"][idx]).min()
    work = (t0 + np.where(r["work"][idx] > 0, r["work"][idx], r["end"][idx])) / 1e3
    end = (t0 + r["end"][idx]) / 1e3
    loaded = (t0 + r["wait"][idx]) / 1e3
    marked = merge & (loaded > work)
    return {
        "work median": np.median(work),
        "90th pct.": np.percentile(work, 90),
        "last unmerged": work[~merge].max() if (~merge).any() else np.nan,  # a clustered launch: all merge
        "merging blocks' work done": work[merge].mean(),
        "merge mean": (end[merge] - work[merge]).mean(),
        "merge longest": (end[merge] - work[merge]).max(),
        "launch end": end.max(),
        "marked: ticket -> loads done": (loaded - work)[marked].mean() if marked.any() else np.nan,
        "marked: loads done -> end": (end - loaded)[marked].mean() if marked.any() else np.nan,
    }


def main():
    path = sys.argv[1]
    taken, r = load(path)
    gaps = np.diff(np.unique(r["t0"]))
    print(f"{taken} blocks recorded, {len(r['t0'])} in the ring; timer step (smallest gap between starts) "
          f"{gaps.min() if len(gaps) else 0} ns")
    groups = launches(r)
    ls = [describe(r, idx) for idx in groups]
    # Steps end at an argmax; keep the whole steps after the first.
    ends = [i for i, l in enumerate(ls) if l["kind"] == "argmax"]
    steps = [ls[a + 1:b + 1] for a, b in zip(ends, ends[1:])]
    if not steps:
        print("no whole step in the trace")
        return
    lengths = [len(s) for s in steps]
    n = max(set(lengths), key=lengths.count)  # the usual step; a step the ring cut short is left out
    steps = [s for s in steps if len(s) == n]
    print(f"{len(steps)} whole steps of {n} launches")
    if "--attention" in sys.argv:
        attn = [g for g, l in zip(groups[ends[0] + 1:ends[-1] + 1], ls[ends[0] + 1:ends[-1] + 1])
                if l["kind"] == "attention"]
        tails = [t for t in (attention_tail(r, idx) for idx in attn) if t is not None]
        if tails:
            means = ", ".join(f"{k} {np.mean([t[k] for t in tails]):.2f}" for k in tails[0]
                              if not np.isnan(tails[0][k]))
            print(f"attention, {len(tails)} launches with a merge, us from the first wait passed (means): {means}")
    pick = steps[len(steps) // 2]
    if "--step-table" in sys.argv:
        base = pick[0]["start_first"]
        print("one step, us from its first launch's first block: launch, blocks, starts (first/median/last), "
              "waits passed (first/median/last), work done (median/last), ends (median/last), merge")
        for l in pick:
            f = lambda v: f"{(v - base) / 1e3:7.2f}" if v is not None else "      -"
            print(f"  {l['kind']:9} {l['blocks']:4}/{l['grid']:<4} start {f(l['start_first'])} {f(l['start_median'])} "
                  f"{f(l['start_last'])} | wait {f(l['wait_first'])} {f(l['wait_median'])} {f(l['wait_last'])} | work "
                  f"{f(l['work_median'])} {f(l['work_last'])} | end {f(l['end_median'])} {f(l['end_last'])}"
                  f" | merge {f(l['merge_start'])} {f(l['merge_end'])}")
    total = np.mean([s[-1]["end_last"] - s[0]["wait_first"] for s in steps]) / 1e3
    print(f"step, first wait passed to last block's end: {total:.1f} us (mean of {len(steps)} steps)")
    # Each pair of consecutive launches (by kernel and grid), averaged over the steps.
    phases = {}
    for s in steps:
        for prev, l in zip(s, s[1:]):
            k = (prev["kind"] + "/" + str(prev["grid"]), l["kind"] + "/" + str(l["grid"]))
            ph = phases.setdefault(k, {"n": 0, "release": [], "wait_spread": [], "to_work": [], "to_end": [],
                                       "tail": [], "merge": [], "start_before": [], "span": []})
            ph["n"] += 1
            ph["release"].append(l["wait_first"] - prev["end_last"])
            ph["wait_spread"].append(l["wait_last"] - l["wait_first"])
            ph["to_work"].append(l["work_median"] - l["wait_first"])
            ph["to_end"].append(l["end_last"] - l["wait_first"])
            ph["tail"].append(l["end_last"] - l["end_median"])
            ph["start_before"].append(prev["end_last"] - l["start_median"])
            ph["span"].append(l["end_last"] - prev["end_last"])
            if l["merge_start"] is not None:
                ph["merge"].append(l["merge_end"] - l["merge_start"])
    print("per pair (previous -> this), means in us over the steps: count a step; release = this launch's first "
          "wait passed - previous launch's last end; spread of its waits; wait -> median work done; wait -> "
          "last end; last end - median end (tail); previous end - median start (how early its blocks sat); "
          "span = this last end - previous last end; merge = last merging block's work done -> end")
    for k, ph in sorted(phases.items(), key=lambda kv: -kv[1]["n"] * np.mean(kv[1]["span"])):
        m = lambda v: f"{np.mean(v) / 1e3:6.2f}" if v else "     -"
        print(f"  {k[0]:>15} -> {k[1]:<15} x{ph['n'] / len(steps):5.1f}  release {m(ph['release'])}  spread "
              f"{m(ph['wait_spread'])}  work {m(ph['to_work'])}  end {m(ph['to_end'])}  tail {m(ph['tail'])}  "
              f"early {m(ph['start_before'])}  span {m(ph['span'])}  merge {m(ph['merge'])}")


if __name__ == "__main__":
    main()
