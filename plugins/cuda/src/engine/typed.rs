//! The launches of the typed steps (the fast path), with this call's addresses.

use cuda_rt::{DevicePtr, LaunchConfig};
use ref_graph::TensorId;

use super::{Engine, Queued};
use crate::kernels::{self, AddP, ArgmaxP, AttnP, GatherP, GemvP, Kernels, KvP, Launch, RmsP};
use crate::plan::{AttnShape, Float, KvLayout, Step};

fn cfg(grid: (u32, u32, u32), block: u32, shared: u32) -> LaunchConfig {
    LaunchConfig { grid, block: (block, 1, 1), shared_mem_bytes: shared }
}

/// Threads of a cache update's block, which takes one new row of every head of a cache: one a 16-byte run of
/// the row (`VEC` values of `float`), or one a value where a head is not whole runs; at most 256, looping.
fn kv_update_threads(l: KvLayout, float: Float) -> u32 {
    let vec = kernels::run_values(float);
    let per_head = if l.head_dim % vec == 0 { l.head_dim / vec } else { l.head_dim };
    l.heads.saturating_mul(per_head).next_multiple_of(32).clamp(32, 256)
}

/// Blocks of 256 threads of an add of `n` values, each thread a run ([`kernels::run_values`]), at most 1 024
/// (the threads loop over the rest).
fn add_blocks(n: u64, float: Float) -> u32 {
    n.div_ceil(256 * u64::from(kernels::run_values(float))).clamp(1, 1024) as u32
}

impl Engine {
    fn p(&self, id: TensorId) -> DevicePtr {
        self.ptrs[id.0]
    }

    /// The launches of one step, with this call's addresses.
    pub(super) fn lower(&self, step: &Step, into: &mut Vec<Queued>) {
        let Some(float) = self.plan.step_float(step) else {
            into.push(Queued::General(self.lower_general(step)));
            return;
        };
        let module =
            self.typed.iter().position(|(f, _)| *f == float).expect(
                "the plan lists the float type of every typed step, and one module is loaded per entry",
            );
        let mut push = |launch| into.push(Queued::Typed(module, launch));
        let err = self.err.device_ptr();
        let p = |id| self.p(id);
        let launch = match *step {
            Step::Gather { table, indices, out, rows, n, dim, plus, scale } => Launch::Gather(
                cfg((rows, 1, 1), 256, 0),
                GatherP {
                    table: p(table),
                    idx: p(indices),
                    table2: plus.map_or(0, |plus| p(plus.table)),
                    pos2: plus.map_or(0, |plus| p(plus.position)),
                    out: p(out),
                    err,
                    rows: rows as i32,
                    n: n as i32,
                    n2: plus.map_or(0, |plus| plus.n as i32),
                    dim: dim as i32,
                    scale: scale.map_or(0, p),
                },
            ),
            Step::Add { a, b, out, n } => Launch::Add(
                // A thread a 16-byte run of each operand.
                cfg((add_blocks(n, float), 1, 1), 256, 0),
                AddP { a: p(a), b: p(b), out: p(out), n: n as i64 },
            ),
            Step::Norm { input, out, rows, dim, norm, residual } => Launch::RmsNorm(
                cfg((rows, 1, 1), 256, 0),
                RmsP {
                    x: p(input),
                    w: p(norm.gain),
                    b: norm.bias.map_or(0, p),
                    out: p(out),
                    rows: rows as i32,
                    dim: dim as i32,
                    eps: norm.eps,
                    centred: i32::from(norm.centred),
                    res: residual.map_or(0, p),
                },
            ),
            Step::Gemv { .. } => self.gemv(step, float),
            Step::KvUpdate { ref caches, position, layout } => {
                self.kv_update(caches, position, layout, float)
            }
            Step::Attention { q, k, v, position, out, shape, splits, early } => {
                let kernels = &self.typed[module].1;
                self.attention([q, k, v, position, out], shape, (splits, early), float, kernels)
            }
            Step::Argmax { input, out, m, n } => {
                let (part_v, part_i, counter) = self.argmax_part;
                // A few values a thread, in as many blocks as the scratch holds.
                let blocks = n.div_ceil(4 * kernels::ARGMAX_THREADS).clamp(1, kernels::ARGMAX_BLOCKS);
                Launch::Argmax(
                    cfg((blocks, 1, 1), kernels::ARGMAX_THREADS, 0),
                    ArgmaxP { x: p(input), out: p(out), part_v, part_i, counter, m: m as i32, n: n as i32 },
                )
            }
            _ => unreachable!("step_float is None for every untyped step"),
        };
        push(launch);
    }

    fn gemv(&self, step: &Step, float: Float) -> Launch {
        let Step::Gemv { a, norm, ref mats, cache_rows, m, k, early, glu, rope, activation, softcap } = *step
        else {
            unreachable!("called for a GEMV")
        };
        let p = |id| self.p(id);
        let (mut w, mut bias, mut res, mut y, mut cache, mut n) =
            ([0; 3], [0; 3], [0; 3], [0; 3], [0; 3], [0; 3]);
        let mut res2 = [0; 3];
        let (mut row_off, mut row_group, mut row_stride) = ([0; 3], [1; 3], [0; 3]);
        for (i, mat) in mats.iter().enumerate() {
            w[i] = if mat.transposed { self.transposed[mat.w.0] } else { p(mat.w) };
            bias[i] = mat.bias.map_or(0, p);
            res[i] = mat.residual.map_or(0, p);
            res2[i] = mat.residual2.map_or(0, p);
            y[i] = p(mat.y);
            cache[i] = mat.cache.map_or(0, p);
            n[i] = mat.n as i32;
            (row_off[i], row_group[i], row_stride[i]) =
                (mat.rows.offset as i32, mat.rows.group.max(1) as i32, mat.rows.stride as i32);
        }
        if let Some(out) = glu {
            y[0] = p(out); // the gate and up products are never written, only silu(gate) * up (or gelu)
        }
        let norm_w = norm.map_or(0, |n| p(n.gain));
        let norm_b = norm.and_then(|n| n.bias).map_or(0, p);
        let aligned = [p(a), norm_w, norm_b].iter().chain(&w[..mats.len()]).all(|&ptr| ptr % 16 == 0);
        let geometry = cache_rows.map_or((0, 0, 0), |r| (r.heads as i32, r.len as i32, r.head_dim as i32));
        let columns: u32 = mats.iter().map(|mat| mat.n).sum();
        let vec_ok = aligned && k % kernels::vec_width(float) == 0;
        let groups = columns.div_ceil(kernels::GEMV_WARPS);
        let min_blocks = kernels::gemv_stage_min_blocks();
        let stage = kernels::gemv_stage(vec_ok, k, groups.saturating_mul(m), norm.is_some(), min_blocks);
        let blocks = kernels::gemv_blocks(groups, stage.is_some(), self.gemv_wave);
        let config = cfg((blocks, m, 1), kernels::GEMV_WARPS * 32, stage.unwrap_or(0));
        let row_loads = k.div_ceil(32 * kernels::vec_width(float));
        let entry = kernels::gemv_entry(groups, blocks, m, stage.is_some(), row_loads, self.gemv_deep_wave);
        let params = GemvP {
            a: p(a),
            w,
            bias,
            res,
            y,
            cache,
            norm_w,
            norm_b,
            pos: cache_rows.map_or(0, |r| p(r.position)),
            err: self.err.device_ptr(),
            n,
            m: m as i32,
            k: k as i32,
            nmat: mats.len() as i32,
            vec_ok: i32::from(vec_ok),
            eps: norm.map_or(0.0, |n| n.eps),
            h: geometry.0,
            l: geometry.1,
            dh: geometry.2,
            early: i32::from(early),
            cos: rope.map_or(0, |t| p(t.cos)),
            sin: rope.map_or(0, |t| p(t.sin)),
            rope_half: rope.map_or(0, |t| t.half as i32),
            rope_mats: mats.iter().enumerate().map(|(i, mat)| i32::from(mat.roped) << i).sum(),
            staged: i32::from(stage.is_some()),
            groups: groups as i32,
            centred: i32::from(norm.is_some_and(|n| n.centred)),
            activation: activation.map_or(0, kernels::activation_code),
            row_off,
            row_group,
            row_stride,
            rope_dh: rope.map_or(1, |t| t.head.max(1) as i32),
            res2,
            cap_div: softcap.map_or(0, |c| p(c.divisor)),
            cap_mul: softcap.map_or(0, |c| p(c.factor)),
        };
        match (glu, rope) {
            (Some(_), _) => Launch::GemvGlu(config, params, entry),
            (None, Some(_)) => Launch::GemvRope(config, params, entry),
            (None, None) => Launch::Gemv(config, params, entry),
        }
    }

    fn kv_update(
        &self,
        caches: &[(TensorId, TensorId)],
        position: TensorId,
        l: KvLayout,
        float: Float,
    ) -> Launch {
        let (mut cache, mut upd) = ([0; 2], [0; 2]);
        for (i, &(c, u)) in caches.iter().enumerate() {
            cache[i] = self.p(c);
            upd[i] = self.p(u);
        }
        let (u_ts, u_hs) = l.update_strides();
        Launch::KvUpdate(
            cfg((l.rows, caches.len() as u32, 1), kv_update_threads(l, float), 0),
            KvP {
                cache,
                upd,
                pos: self.p(position),
                err: self.err.device_ptr(),
                n: caches.len() as i32,
                tq: l.rows as i32,
                h: l.heads as i32,
                l: l.len as i32,
                dh: l.head_dim as i32,
                u_ts: u_ts as i32,
                u_hs: u_hs as i32,
            },
        )
    }

    /// The launch of an attention; `t` is (q, k, v, position, out), `split` (ranges per head, early);
    /// `kernels`: the module it runs in (whether it has `attention_tc`, and clusters).
    fn attention(
        &self,
        t: [TensorId; 5],
        s: AttnShape,
        split: (u32, bool),
        float: Float,
        kernels: &Kernels,
    ) -> Launch {
        let (splits, early) = split;
        let [q, k, v, position, out] = t.map(|id| self.p(id));
        let vec = kernels::vec_width(float);
        let dh = s.head_dim;
        // Whole 16-byte vectors a lane, at most 32 lanes a row (a power of two: a row's lanes are adjacent
        // lanes of one warp); else one element at a time, strided.
        let vec_lanes = dh / vec;
        let vec_ok = [q, k, v].iter().all(|&ptr| ptr % 16 == 0)
            && dh % vec == 0
            && vec_lanes.is_power_of_two()
            && vec_lanes <= 32;
        let lanes = if vec_ok { vec_lanes } else { dh.next_power_of_two().min(32) };
        let tc = kernels.has_attention_tc() && kernels::attention_on_tensor_cores(vec_ok, dh);
        let hpb = if tc { kernels::attention_heads_per_block(s.group()) } else { 1 };
        let head_blocks = s.heads / hpb;
        let (room, tiles) = (kernels.attention_cluster(), self.attn_cluster_tiles);
        let clusters = head_blocks * s.rows;
        let cluster = if tc { kernels::attention_tc_cluster(s.len, dh, clusters, room, tiles) } else { None };
        let (splits, threads) = match cluster {
            Some(blocks) => (blocks, kernels::ATTN_CLUSTER_THREADS),
            None if tc => {
                let splits = kernels::attention_tc_splits(splits, head_blocks * s.rows, self.attn_tc_wave);
                (splits, kernels::ATTN_THREADS)
            }
            None => (splits, kernels::ATTN_THREADS),
        };
        let (q_ts, q_hs) = s.q_strides();
        let shared = kernels::attention_shared(tc, hpb, dh, threads, cluster.is_some());
        let config = cfg((head_blocks, splits, s.rows), threads, shared);
        let p = AttnP {
            q,
            k,
            v,
            out,
            pos: position,
            o_part: self.attn_part,
            ml: self.attn_ml,
            counters: self.attn_counters,
            err: self.err.device_ptr(),
            tq: s.rows as i32,
            h: s.heads as i32,
            l: s.len as i32,
            dh: dh as i32,
            splits: splits as i32,
            vec_ok: i32::from(vec_ok),
            scale: s.scale,
            lanes: lanes as i32,
            q_ts: q_ts as i32,
            q_hs: q_hs as i32,
            group: s.group() as i32,
            early: i32::from(early),
            hpb: hpb as i32,
            softcap: s.softcap.unwrap_or(0.0),
        };
        if cluster.is_some() {
            Launch::AttentionTcCluster(config, p)
        } else if tc {
            Launch::AttentionTc(config, p)
        } else {
            Launch::Attention(config, p)
        }
    }
}
