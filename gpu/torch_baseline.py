#!/usr/bin/env python3
"""PyTorch baseline of kv-example's decoder: the same model, op for op, with the same weights, so its greedy
tokens equal ours and its decode-step timings sit beside ours (issue 8).

    python3 gpu/torch_baseline.py --config a.json [--config b.json ...] [--device cuda|cpu] [--steps N]
                                  [--out results.json]

Each config is the JSON of `kv_example::Config::to_json` (keys vocab, heads, head_dim, max_len, layers, prompt,
seed, dtype "f32"|"f16", rms_eps). Weights come from the config seed through SplitMix64 in the order and with the
scales of crates/kv-example/src/weights.rs, bit for bit in f32 (f16 models round them to nearest even).

The model (crates/kv-example/src/model.rs):
    x = tok_emb[tokens] + pos_emb[pos .. pos+T]
    per layer: h = rms_norm(x) * g (f32, cast back); q, k, v = h Wq, h Wk, h Wv
               k_cache[:, pos:pos+T, :] = k (in place, caller-owned [H, max_len, Dh]); same for v
               x = x + causal_attention(q, k_cache, v_cache) Wo   (query t sees cache rows 0 ..= pos+t)
    logits = rms_norm(x) * g_final @ Wout; next token = argmax of the last row (first of equals)

Attention variants: "naive" (q K^T over the full cache, scaled and masked softmax in f32, then P V) and "sdpa"
(F.scaled_dot_product_attention with a boolean mask over the full cache). Positions live in a device tensor, so
one captured CUDA graph replays every step without an update and without a host synchronisation.

Prints one JSON object per (config, position) — positions max_len//2 and max_len-1 — with the greedy tokens,
the decode-step timings (cuda only) and the HBM floor (the bytes a step must read over the read bandwidth measured
at the start of the same run; the data sheet's peak on cpu); --out writes them all as a JSON list.
"""
import argparse
import json
import math
import platform
import sys
import time

import torch
import torch.nn.functional as F

try:
    import numpy as np
except ImportError:  # the torch generator below gives the same bits
    np = None

HBM_BYTES_PER_S = 4.8e12  # the H200's peak HBM3e bandwidth (its data sheet; the floor uses the measured one)


def measured_read_bandwidth(dev, mib=1024, iters=20):
    """Bytes per second one streaming read of `mib` MiB achieves on `dev` (a sum over an f16 tensor, the mean of
    `iters` after a warm-up, timed with CUDA events): the bandwidth the floor divides by, measured in the run
    whose steps it judges."""
    x = torch.ones(mib * 2**20 // 2, dtype=torch.float16, device=dev)
    for _ in range(3):
        x.sum(dtype=torch.float32)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        x.sum(dtype=torch.float32)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / iters
    del x
    torch.cuda.empty_cache()
    return mib * 2**20 / seconds

# ---------------------------------------------------------------------------------------------------------------
# Weights: SplitMix64, vectorised. Output i (1-based) of a generator seeded with s mixes s + i * gamma (wrapping),
# so a range of outputs is one array: numpy uint64 (whose array arithmetic wraps), or, where numpy is missing,
# torch int64 (two's complement: the same bits, with logical shifts masked by hand). Both are checked bit for bit
# against Rust's weights (--check-weights, --rng).
_GAMMA, _M1, _M2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_CHUNK = 1 << 22  # values per pass: bounds the temporaries (~100 MiB) for any tensor size


def _i64(u):
    """The int64 with the bits of the uint64 `u`."""
    return u - (1 << 64) if u >= 1 << 63 else u


def _mix_numpy(first, n, seed):
    z = np.arange(first, first + n, dtype=np.uint64)
    z *= np.uint64(_GAMMA)
    z += np.uint64(seed)
    z ^= z >> np.uint64(30)
    z *= np.uint64(_M1)
    z ^= z >> np.uint64(27)
    z *= np.uint64(_M2)
    z ^= z >> np.uint64(31)
    return torch.from_numpy((z >> np.uint64(40)).astype(np.int64))  # the top 24 bits


def _mix_torch(first, n, seed):
    lsr = lambda z, k: (z >> k) & ((1 << (64 - k)) - 1)  # logical shift right of int64 bits
    z = torch.arange(first, first + n, dtype=torch.int64) * _i64(_GAMMA) + _i64(seed)
    z = (z ^ lsr(z, 30)) * _i64(_M1)
    z = (z ^ lsr(z, 27)) * _i64(_M2)
    z = z ^ lsr(z, 31)
    return lsr(z, 40)


def _f32(x):
    """A 0-dim f32 tensor: arithmetic with it stays in f32, as Rust's."""
    return torch.tensor(x, dtype=torch.float32)


class SplitMix64:
    """crates/kv-example/src/weights.rs's SplitMix64, drawing whole tensors at once."""

    def __init__(self, seed, rng):
        self.seed = seed
        self.mix = _mix_numpy if rng == "numpy" else _mix_torch
        self.drawn = 0  # outputs consumed so far

    def uniform(self, length, scale):
        """`length` draws of `(2 * ((next >> 40) as f32 / 2^24) - 1) * scale`, all in f32 (`scale` an f32
        tensor), as weights.rs: a CPU f32 tensor."""
        out = torch.empty(length, dtype=torch.float32)
        for start in range(0, length, _CHUNK):
            n = min(_CHUNK, length - start)
            unit = self.mix(self.drawn + start + 1, n, self.seed).to(torch.float32) / _f32(1 << 24)
            out[start:start + n] = (_f32(2.0) * unit - _f32(1.0)) * scale
        self.drawn += length
        return out


def weight_tensors(cfg, rng):
    """Yields (name, shape, f32 CPU tensor) in Weights::generate's draw order, one tensor at a time."""
    gen = SplitMix64(cfg["seed"], rng)
    dim, vocab = cfg["heads"] * cfg["head_dim"], cfg["vocab"]
    proj = _f32(1.0) / torch.sqrt(_f32(float(dim)))  # 1.0 / (dim as f32).sqrt()
    two_proj = _f32(2.0) * proj

    def gain():
        return _f32(1.0) + gen.uniform(dim, _f32(0.1))

    yield "tok_emb", (vocab, dim), gen.uniform(vocab * dim, _f32(0.5))
    yield "pos_emb", (cfg["max_len"], dim), gen.uniform(cfg["max_len"] * dim, _f32(0.5))
    for l in range(cfg["layers"]):
        yield f"layer{l}.norm", (dim,), gain()
        yield f"layer{l}.wq", (dim, dim), gen.uniform(dim * dim, two_proj)
        yield f"layer{l}.wk", (dim, dim), gen.uniform(dim * dim, two_proj)
        yield f"layer{l}.wv", (dim, dim), gen.uniform(dim * dim, proj)
        yield f"layer{l}.wo", (dim, dim), gen.uniform(dim * dim, proj)
    yield "final_norm", (dim,), gain()
    yield "w_out", (dim, vocab), gen.uniform(dim * vocab, two_proj)


def check_weights(cfg, path, rng):
    """Compares every drawn weight bit for bit with a dump of Rust's (`cargo run -p kv-example --example
    baseline_inputs`, little-endian f32); returns (values compared, first mismatch or None)."""
    with open(path, "rb") as f:
        rust = torch.frombuffer(bytearray(f.read()), dtype=torch.int32)
    offset = 0
    for name, _, values in weight_tensors(cfg, rng):
        ours = values.view(torch.int32)
        theirs = rust[offset:offset + ours.numel()]
        if theirs.numel() != ours.numel():
            return offset, f"{path} ends inside {name}"
        bad = torch.nonzero(ours != theirs)
        if bad.numel():
            i = int(bad[0])
            return offset, f"{name}[{i}]: ours {int(ours[i]) & 0xFFFFFFFF:#010x}, Rust's {int(theirs[i]) & 0xFFFFFFFF:#010x}"
        offset += ours.numel()
    if offset != rust.numel():
        return offset, f"{path} holds {rust.numel()} values, the model {offset}"
    return offset, None


# ---------------------------------------------------------------------------------------------------------------
# The model.
class Model:
    def __init__(self, cfg, dtype, device, rng="numpy" if np is not None else "torch"):
        self.cfg, self.dtype, self.device = cfg, dtype, device
        self.H, self.Dh, self.S = cfg["heads"], cfg["head_dim"], cfg["max_len"]
        self.D, self.V, self.L = self.H * self.Dh, cfg["vocab"], cfg["layers"]
        self.eps = float(cfg.get("rms_eps", 1e-5))
        w = {}
        for name, shape, values in weight_tensors(cfg, rng):
            # f32 -> dtype happens in torch (round to nearest even), one tensor at a time.
            w[name] = values.reshape(shape).to(device=device, dtype=dtype)
            del values
        self.tok_emb, self.pos_emb = w["tok_emb"], w["pos_emb"]
        self.layers = [tuple(w[f"layer{l}.{n}"] for n in ("norm", "wq", "wk", "wv", "wo")) for l in range(self.L)]
        self.final_norm, self.w_out = w["final_norm"], w["w_out"]
        self.rows = torch.arange(self.S, device=device)
        self.scale = 1.0 / math.sqrt(self.Dh)
        esize = torch.empty((), dtype=dtype).element_size()
        self.weight_bytes = sum(t.numel() for t in w.values()) * esize
        self.cache_bytes = 2 * self.L * self.H * self.S * self.Dh * esize  # every K and V cache

    def new_caches(self):
        """Caller-owned caches, [heads, max_len, head_dim] per layer, zero."""
        z = lambda: torch.zeros(self.H, self.S, self.Dh, device=self.device, dtype=self.dtype)
        return [z() for _ in range(self.L)], [z() for _ in range(self.L)]

    def rms_norm(self, x, g):
        xf = x.float()
        scale = 1.0 / torch.sqrt((xf * xf).mean(-1, keepdim=True) + self.eps)
        return (xf * scale * g.float()).to(self.dtype)

    def forward(self, tokens, pos, kc, vc, variant):
        """Logits [T, vocab] of `tokens` ([T] i64, device) at positions pos[0] .. pos[0]+T-1 (pos: [1] i64,
        device); writes cache rows pos .. pos+T-1 of every layer in place."""
        T, H, Dh = tokens.shape[0], self.H, self.Dh
        positions = pos + torch.arange(T, device=self.device)
        x = self.tok_emb.index_select(0, tokens) + self.pos_emb.index_select(0, positions)
        visible = self.rows.view(1, self.S) <= positions.view(T, 1)  # [T, S]: query t sees rows 0 ..= pos+t
        for (g, wq, wk, wv, wo), k_cache, v_cache in zip(self.layers, kc, vc):
            h = self.rms_norm(x, g)
            q, k, v = h @ wq, h @ wk, h @ wv
            # k_cache[:, pos:pos+T, :] = k.view(T, H, Dh).transpose(0, 1), with pos on the device: in place.
            k_cache.index_copy_(1, positions, k.view(T, H, Dh).transpose(0, 1))
            v_cache.index_copy_(1, positions, v.view(T, H, Dh).transpose(0, 1))
            qh = q.view(T, H, Dh).transpose(0, 1)  # [H, T, Dh]
            if variant == "sdpa":
                a = F.scaled_dot_product_attention(
                    qh.unsqueeze(0), k_cache.unsqueeze(0), v_cache.unsqueeze(0), attn_mask=visible.view(1, 1, T, self.S)
                ).squeeze(0)
            else:
                s = (qh @ k_cache.transpose(1, 2)).float() * self.scale  # [H, T, S]
                p = s.masked_fill(~visible, float("-inf")).softmax(-1)
                a = p.to(self.dtype) @ v_cache
            x = x + a.transpose(0, 1).reshape(T, self.D) @ wo
        return self.rms_norm(x, self.final_norm) @ self.w_out

    def bytes_read(self, pos):
        """Bytes one decode step at `pos` must read: the weights (two embedding rows, not the tables) and the
        valid cache prefix (K and V rows 0 ..= pos of every layer)."""
        esize = torch.empty((), dtype=self.dtype).element_size()
        emb_tables = (self.V + self.S) * self.D * esize
        prefix = 2 * self.L * self.H * (pos + 1) * self.Dh * esize
        return self.weight_bytes - emb_tables + 2 * self.D * esize + prefix


# ---------------------------------------------------------------------------------------------------------------
# Generation.
def generate_eager(model, steps, variant):
    """Prefill over the prompt at position 0, then `steps` decode steps feeding back the argmax; one token per
    step, prefill's first (host-runtime/src/generate.rs). No host synchronisation until the end."""
    dev = model.device
    kc, vc = model.new_caches()
    prompt = torch.tensor(model.cfg["prompt"], dtype=torch.int64, device=dev)
    pos = torch.zeros(1, dtype=torch.int64, device=dev)
    out = [model.forward(prompt, pos, kc, vc, variant)[-1].argmax()]
    pos = pos + prompt.shape[0]
    for _ in range(steps):
        out.append(model.forward(out[-1].view(1), pos, kc, vc, variant)[-1].argmax())
        pos = pos + 1
    return [int(t) for t in torch.stack(out).tolist()]


def capture(fn):
    """A CUDA graph of `fn`, warmed up on a side stream as the anchors do (the warm-up runs `fn` twice)."""
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return g


def generate_graph(model, steps, variant):
    """Eager prefill, then `steps` replays of one captured decode step that reads the token and the position
    from device memory, writes the argmax into both the next token and a history buffer, and advances the
    position: tokens are read back once at the end."""
    dev = model.device
    kc, vc = model.new_caches()
    prompt = torch.tensor(model.cfg["prompt"], dtype=torch.int64, device=dev)
    tok = torch.zeros(1, dtype=torch.int64, device=dev)
    pos = torch.zeros(1, dtype=torch.int64, device=dev)
    idx = torch.zeros(1, dtype=torch.int64, device=dev)
    hist = torch.zeros(max(steps, 1) + 2, dtype=torch.int64, device=dev)  # +2: the warm-up's writes

    def step():
        nxt = model.forward(tok, pos, kc, vc, variant)[-1].argmax().view(1)
        hist.index_copy_(0, idx, nxt)
        tok.copy_(nxt)
        pos.add_(1)
        idx.add_(1)

    pos.fill_(len(model.cfg["prompt"]))
    g = capture(step)
    # The warm-up and capture ran steps; redo prefill so the run starts from a clean state.
    for c in kc + vc:
        c.zero_()
    first = model.forward(prompt, torch.zeros(1, dtype=torch.int64, device=dev), kc, vc, variant)[-1].argmax()
    tok.copy_(first.view(1))
    pos.fill_(len(model.cfg["prompt"]))
    idx.zero_()
    for _ in range(steps):
        g.replay()
    return [int(first)] + [int(t) for t in hist[:steps].tolist()]


# ---------------------------------------------------------------------------------------------------------------
# Timing (cuda).
def time_cuda(fn, iters, warm, host_iters=20):
    """GPU time per call (CUDA events around `iters` back-to-back calls), wall time per call (the same run,
    host clock, through the final synchronisation), and host time per call (the host clock around one call
    issued onto an idle GPU, mean of `host_iters`: the launch cost alone, not throttled by a full queue)."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    wall = (time.perf_counter() - t0) / iters
    gpu = start.elapsed_time(end) / 1e3 / iters
    host = 0.0
    for _ in range(host_iters):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        host += time.perf_counter() - t
    torch.cuda.synchronize()
    return {"gpu_us": gpu * 1e6, "wall_us": wall * 1e6, "host_us": host / host_iters * 1e6}


def time_position(model, posv, iters, warm):
    """Decode-step timings at position `posv`: the step rewrites row posv and feeds its argmax back (the
    position stays, so every call costs the same)."""
    dev = model.device
    kc, vc = model.new_caches()
    for c in kc + vc:  # content does not change the work; non-zero keeps softmax honest
        c.normal_(0.0, 0.5)
    tok = torch.tensor([model.cfg["prompt"][0]], dtype=torch.int64, device=dev)
    pos = torch.tensor([posv], dtype=torch.int64, device=dev)
    out = {}
    for variant in ("naive", "sdpa"):
        def step(variant=variant):
            tok.copy_(model.forward(tok, pos, kc, vc, variant)[-1].argmax().view(1))

        out[f"{variant}_eager"] = time_cuda(step, iters, warm)
        g = capture(step)
        out[f"{variant}_graph"] = time_cuda(g.replay, iters, warm)
        del g
    # Upstream's copy-back: reflect every cache into a separate output slot, then write it back.
    slots = [torch.empty_like(c) for c in kc + vc]

    def copy_back():
        for cache, slot in zip(kc + vc, slots):
            slot.copy_(cache)
            cache.copy_(slot)

    out["copy_back_two_copies"] = time_cuda(copy_back, max(iters // 2, 5), warm)
    del slots, kc, vc
    torch.cuda.empty_cache()
    return out


# ---------------------------------------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", action="append", required=True, help="config JSON (Config::to_json); repeatable")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    ap.add_argument("--steps", type=int, default=None,
                    help="decode steps of the greedy generation (default: min(32, max_len - prompt length))")
    ap.add_argument("--iters", type=int, default=50, help="timed decode steps per measurement (cuda)")
    ap.add_argument("--warm", type=int, default=5, help="untimed warm-up calls per measurement (cuda)")
    ap.add_argument("--dtype", choices=["config", "f32", "f16"], default="config",
                    help="override the config's dtype (e.g. f32 for a quick CPU check of an f16 config)")
    ap.add_argument("--check-weights", metavar="WEIGHTS_F32",
                    help="compare the drawn weights bit for bit with Rust's dump (single --config)")
    ap.add_argument("--expect-tokens", metavar="T0,T1,...",
                    help="fail unless every generation's tokens equal these (single --config)")
    ap.add_argument("--rng", choices=["numpy", "torch"], default="numpy" if np is not None else "torch",
                    help="array library of the weight generator (same bits; numpy is faster)")
    ap.add_argument("--out", help="also write every result object, as a JSON list, to this file")
    args = ap.parse_args()
    if (args.check_weights or args.expect_tokens) and len(args.config) != 1:
        ap.error("--check-weights and --expect-tokens take a single --config")

    torch.backends.cuda.matmul.allow_tf32 = False  # f32 matmuls in f32
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False  # f16 matmuls accumulate in f32
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device(args.device)
    device_name = torch.cuda.get_device_name(dev) if args.device == "cuda" else (platform.processor() or "cpu")
    results, failed = [], False
    bandwidth = measured_read_bandwidth(dev) if args.device == "cuda" else HBM_BYTES_PER_S
    for path in args.config:
        with open(path) as f:
            cfg = json.load(f)
        if args.check_weights:
            n, err = check_weights(cfg, args.check_weights, args.rng)
            print(json.dumps({"config_path": path, "weights_compared": n, "weights_bit_identical": err is None,
                              "weights_mismatch": err}), flush=True)
            failed |= err is not None
        dname = cfg.get("dtype", "f32") if args.dtype == "config" else args.dtype
        dtype = {"f32": torch.float32, "f16": torch.float16}[dname]
        max_steps = cfg["max_len"] - len(cfg["prompt"])
        steps = min(32, max_steps) if args.steps is None else args.steps
        if not 0 <= steps <= max_steps:
            ap.error(f"{path}: {steps} decode steps do not fit ({max_steps} at most)")

        t = time.perf_counter()
        model = Model(cfg, dtype, dev, args.rng)
        if args.device == "cuda":
            torch.cuda.synchronize()
        weights_s = time.perf_counter() - t

        t = time.perf_counter()
        tokens = {v: generate_eager(model, steps, v) for v in ("naive", "sdpa")}
        if args.device == "cuda" and max_steps >= 2:  # the capture's warm-up runs two steps past the prompt
            tokens.update({f"{v}_graph": generate_graph(model, steps, v) for v in ("naive", "sdpa")})
        tokens = {("naive_eager" if k == "naive" else "sdpa_eager" if k == "sdpa" else k): v for k, v in tokens.items()}
        generate_s = time.perf_counter() - t
        agree = len({tuple(v) for v in tokens.values()}) == 1
        if args.expect_tokens:
            expected = [int(x) for x in args.expect_tokens.split(",")]
            mismatched = [k for k, v in tokens.items() if v != expected]
            failed |= bool(mismatched)
            if mismatched:
                print(f"tokens differ from --expect-tokens in {mismatched}", file=sys.stderr)

        for posv in (cfg["max_len"] // 2, cfg["max_len"] - 1):
            r = {
                "config_path": path, "config": cfg, "dtype": dname, "device": args.device,
                "device_name": device_name, "torch": torch.__version__, "pos": posv, "steps": steps,
                "tokens": tokens["naive_eager"], "tokens_by_variant": tokens, "tokens_agree": agree,
                "weights_s": round(weights_s, 3), "generate_s": round(generate_s, 3),
                "cache_bytes": model.cache_bytes, "weight_bytes": model.weight_bytes,
                "cache_bytes_copied_per_step": {"in_place": 0, "copy_back": 2 * model.cache_bytes},
                # The decode loops never read a device value back (token and position stay on the device).
                "host_syncs_per_step": 0,
            }
            need = model.bytes_read(posv)
            floor_us = need / bandwidth * 1e6
            r["hbm"] = {"bytes_read_per_step": need, "peak_bytes_per_s": HBM_BYTES_PER_S,
                        "measured_bytes_per_s": bandwidth, "floor_us": floor_us}
            if args.device == "cuda":
                tm = time_position(model, posv, args.iters, args.warm)
                cb = tm["copy_back_two_copies"]["gpu_us"]
                for v in ("naive", "sdpa"):
                    tm[f"{v}_graph_plus_copy_back"] = {"gpu_us": tm[f"{v}_graph"]["gpu_us"] + cb}
                r["timings"] = tm
                r["floor_ratio"] = {k: v["gpu_us"] / floor_us for k, v in tm.items() if k != "copy_back_two_copies"}
            else:
                r["timings"] = None  # CPU timings say nothing about the GPU
            results.append(r)
            print(json.dumps(r), flush=True)
        del model
        if args.device == "cuda":
            torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
