//! A CPU emulation of a [`Plan`] (tests only): every step computed on the host with the very index
//! arithmetic its kernel uses (the same strides, offsets, layouts, fusions and aliases, read from the plan),
//! each result rounded to its tensor's type. Run against the CPU reference delegate on the same graph, it
//! checks the planner's decisions without a GPU; the kernels' own arithmetic is checked on the GPU by
//! `tests/gpu.rs`.

use ref_graph::{half, Data, ElemType, Graph, TensorId, UnaryFn};

use super::{Home, Norm, Plan, RopeTables, Softcap, Step, Walk};

/// Host values of every storage of a plan, by root tensor (a `SameAs` tensor reads and writes its root's).
pub(super) struct Emulator<'g> {
    graph: &'g Graph,
    plan: Plan,
    bufs: Vec<Vec<f64>>,
}

fn round(v: f64, dtype: ElemType) -> f64 {
    match dtype {
        ElemType::F32 => v as f32 as f64,
        ElemType::F16 => half::f16::from_f32(v as f32).to_f64(),
        ElemType::Bf16 => half::bf16::from_f32(v as f32).to_f64(),
        ElemType::I64 => v,
    }
}

/// Element `i` of `x * cos + rotate_half(x) * sin` over heads of `2 * half` (`c`, `s`: its table values),
/// each product and the sum rounded to `dtype`, as the RoPE's ops round.
fn rope_at(x: &[f64], i: usize, half: usize, c: f64, s: f64, dtype: ElemType) -> f64 {
    let rot = if i % (2 * half) < half { -x[i + half] } else { x[i - half] };
    round(round(x[i] * c, dtype) + round(rot * s, dtype), dtype)
}

/// Every index of `walk.dims` with its offsets along the two stride lists (the kernels' decomposition).
fn walk_indices(walk: &Walk) -> impl Iterator<Item = (usize, u64, u64)> + '_ {
    let n: u64 = walk.dims.iter().product();
    (0..n).map(move |i| {
        let (mut rem, mut a, mut b) = (i, 0, 0);
        for d in (0..walk.dims.len()).rev() {
            let c = rem % walk.dims[d];
            rem /= walk.dims[d];
            a += c * walk.a[d];
            b += c * walk.b[d];
        }
        (i as usize, a, b)
    })
}

impl<'g> Emulator<'g> {
    pub(super) fn new(graph: &'g Graph, plan: Plan) -> Emulator<'g> {
        let mut bufs: Vec<Vec<f64>> = graph.tensors().iter().map(|t| vec![0.0; t.numel()]).collect();
        for (id, data) in graph.constants() {
            // As the kernels read it: in the plan's type (a half model's f32 norm gain, converted at init).
            let dtype = plan.dtypes[id.0];
            bufs[id.0] = match data {
                Data::F32(v) => v.iter().map(|&x| round(x as f64, dtype)).collect(),
                Data::F16(v) => v.iter().map(|x| x.to_f64()).collect(),
                Data::Bf16(v) => v.iter().map(|x| x.to_f64()).collect(),
                Data::I64(v) => v.iter().map(|&x| x as f64).collect(),
            };
        }
        Emulator { graph, plan, bufs }
    }

    fn root(&self, id: TensorId) -> usize {
        Home::root(&self.plan.homes, id).0
    }

    fn get(&self, id: TensorId) -> &[f64] {
        &self.bufs[self.root(id)]
    }

    fn put(&mut self, id: TensorId, i: u64, v: f64) {
        let dtype = self.graph.tensor(id).dtype;
        let root = self.root(id);
        self.bufs[root][i as usize] = round(v, dtype);
    }

    pub(super) fn set(&mut self, name: &str, values: &[f64]) {
        let id = self.graph.find(name).expect("tensor");
        assert_eq!(values.len(), self.graph.tensor(id).numel(), "{name}");
        let root = self.root(id);
        self.bufs[root] = values.to_vec();
    }

    pub(super) fn read(&self, name: &str) -> Vec<f64> {
        self.get(self.graph.find(name).expect("tensor")).to_vec()
    }

    /// Runs every step; `Err` names a bad id or position, as the kernels' error bits do.
    pub(super) fn run(&mut self) -> Result<(), &'static str> {
        for step in self.plan.steps.clone() {
            self.step(&step)?;
        }
        Ok(())
    }

    fn step(&mut self, step: &Step) -> Result<(), &'static str> {
        match step {
            Step::Gather { .. } => self.gather(step)?,
            Step::RopeTables { position, inv_freq, cos, sin, rows, half, .. } => {
                let (pos, inv) = (self.get(*position)[0], self.get(*inv_freq).to_vec());
                let (half, width) = (*half as usize, 2 * *half as usize);
                for i in 0..*rows as usize * width {
                    let angle = (pos as i64 + (i / width) as i64) as f32 * inv[i % width % half] as f32;
                    self.put(*cos, i as u64, UnaryFn::Cos.apply(angle) as f64);
                    self.put(*sin, i as u64, UnaryFn::Sin.apply(angle) as f64);
                }
            }
            Step::Counters { sums } => {
                for sum in sums {
                    let v = self.get(sum.src)[0] + sum.add as f64;
                    self.put(sum.out, 0, v);
                }
            }
            Step::Positions { position, out, count } => {
                let p = self.get(*position)[0];
                (0..*count as u64).for_each(|t| self.put(*out, t, p + t as f64));
            }
            Step::Add { a, b, out, n } => {
                let (x, y) = (self.get(*a).to_vec(), self.get(*b).to_vec());
                (0..*n).for_each(|i| self.put(*out, i, x[i as usize] + y[i as usize]));
            }
            Step::Norm { input, out, rows, dim, norm, residual } => {
                let x = self.get(*input).to_vec();
                let res = residual.map(|r| self.get(r).to_vec());
                let dtype = self.graph.tensor(*out).dtype;
                let dim = *dim as usize;
                for r in 0..*rows as usize {
                    let row = self.normalised(&x[r * dim..(r + 1) * dim], norm);
                    for (d, v) in row.into_iter().enumerate() {
                        // The norm rounded to its type, then the residual's sum, as the two ops round.
                        let v = res.as_ref().map_or(v, |res| round(v, dtype) + res[r * dim + d]);
                        self.put(*out, (r * dim + d) as u64, v);
                    }
                }
            }
            Step::Gemv { .. } => self.gemv(step)?,
            Step::KvUpdate { .. } => self.kv_update(step)?,
            Step::Attention { .. } => self.attention(step)?,
            Step::Argmax { input, out, m, n } => {
                let x: Vec<f32> = self.get(*input).iter().map(|&v| v as f32).collect();
                let (m, n) = (*m as usize, *n as usize);
                self.put(*out, 0, ref_graph::argmax(&x[(m - 1) * n..m * n]) as f64);
            }
            _ => self.general(step),
        }
        Ok(())
    }
}

impl Emulator<'_> {
    fn gather(&mut self, step: &Step) -> Result<(), &'static str> {
        let Step::Gather { table, indices, out, rows, n, dim, plus, scale } = *step else { unreachable!() };
        let (t, idx) = (self.get(table).to_vec(), self.get(indices).to_vec());
        let dim = dim as usize;
        for (r, &id) in idx.iter().enumerate().take(rows as usize) {
            if id < 0.0 || id >= n as f64 {
                return Err("token");
            }
            let mut row: Vec<f64> = t[id as usize * dim..(id as usize + 1) * dim].to_vec();
            if let Some(plus) = plus {
                let id2 = self.get(plus.position)[0] + r as f64;
                if id2 < 0.0 || id2 >= plus.n as f64 {
                    return Err("position");
                }
                let t2 = self.get(plus.table);
                row.iter_mut().enumerate().for_each(|(d, v)| *v += t2[id2 as usize * dim + d]);
            }
            if let Some(scale) = scale {
                let factor = self.get(scale)[0];
                row.iter_mut().for_each(|v| *v *= factor);
            }
            row.into_iter().enumerate().for_each(|(d, v)| self.put(out, (r * dim + d) as u64, v));
        }
        Ok(())
    }

    fn gemv(&mut self, step: &Step) -> Result<(), &'static str> {
        let Step::Gemv { a, norm, ref mats, cache_rows, m, k, glu, rope, activation, softcap, .. } = *step
        else {
            unreachable!()
        };
        let k = k as usize;
        let x = self.get(a).to_vec();
        for row in 0..m as usize {
            let mut xs = x[row * k..(row + 1) * k].to_vec();
            if let Some(norm) = norm {
                xs = self.normalised(&xs, &norm);
            }
            // Each product's row as it would have been stored; a SwiGLU GEMV's gate and up rows.
            let mut glu_rows: Vec<Vec<f64>> = Vec::new();
            for mat in mats {
                let n = mat.n as usize;
                let w = self.get(mat.w).to_vec();
                // The weight row (and bias element) of each column, as the kernel picks it.
                let w_row = |col: usize| mat.rows.of(col as u32) as usize;
                // The graph's `[K, N]` constant, which the kernel reads through its transposed upload.
                let rows = w.len() / k;
                let weight = |i: usize, col: usize| {
                    if mat.transposed {
                        w[i * rows + w_row(col)]
                    } else {
                        w[w_row(col) * k + i]
                    }
                };
                let bias = mat.bias.map(|b| self.get(b).to_vec());
                let res = mat.residual.map(|r| self.get(r).to_vec());
                let res2 = mat.residual2.map(|r| self.get(r).to_vec());
                let dtype = self.graph.tensor(mat.y).dtype;
                let mut ys: Vec<f64> = (0..n)
                    .map(|col| {
                        let s = (0..k).map(|i| xs[i] * weight(i, col)).sum::<f64>()
                            + bias.as_ref().map_or(0.0, |b| b[w_row(col)])
                            + res.as_ref().map_or(0.0, |r| r[row * n + col])
                            + res2.as_ref().map_or(0.0, |r| r[row * n + col]);
                        let s = round(s, dtype);
                        // A gated GEMV's activation is the gate's, applied below.
                        let own = activation.filter(|_| glu.is_none());
                        let s = own.map_or(s, |f| round(f.apply(s as f32) as f64, dtype));
                        softcap.map_or(s, |c| self.capped(s, c, dtype))
                    })
                    .collect();
                if let (true, Some(t)) = (mat.roped, rope) {
                    ys = self.rotated(&ys, t, dtype);
                }
                if glu.is_some() {
                    glu_rows.push(ys);
                    continue;
                }
                for (col, &s) in ys.iter().enumerate() {
                    self.put(mat.y, (row * n + col) as u64, s);
                    if let (Some(cache), Some(c)) = (mat.cache, cache_rows) {
                        let r = self.get(c.position)[0] + row as f64;
                        if r < 0.0 || r >= c.len as f64 {
                            return Err("position");
                        }
                        let (dh, len) = (c.head_dim as usize, c.len as usize);
                        self.put(cache, (((col / dh) * len + r as usize) * dh + col % dh) as u64, s);
                    }
                }
            }
            if let (Some(out), [gate, up]) = (glu, &glu_rows[..]) {
                // silu(gate) (or the gated GELU's gelu) rounded to the type, times up, rounded: the two ops as
                // they would have run.
                let dtype = self.graph.tensor(out).dtype;
                let func = activation.unwrap_or(UnaryFn::Silu);
                for (col, (&g, &u)) in gate.iter().zip(up).enumerate() {
                    let act = round(func.apply(g as f32) as f64, dtype);
                    self.put(out, (row * gate.len() + col) as u64, act * u);
                }
            }
        }
        Ok(())
    }

    /// `s` soft-capped as [`Softcap`] says, each op's result rounded to `dtype`.
    fn capped(&self, s: f64, c: Softcap, dtype: ElemType) -> f64 {
        let (divisor, factor) = (self.get(c.divisor)[0], self.get(c.factor)[0]);
        let t = round(UnaryFn::Tanh.apply(round(s / divisor, dtype) as f32) as f64, dtype);
        round(t * factor, dtype)
    }

    /// `row` normalised as [`Norm`] says (in f64; the kernels compute in f32 and round once).
    fn normalised(&self, row: &[f64], norm: &Norm) -> Vec<f64> {
        let n = row.len() as f64;
        let mean = if norm.centred { row.iter().sum::<f64>() / n } else { 0.0 };
        let centred: Vec<f64> = row.iter().map(|v| v - mean).collect();
        let inv = 1.0 / (centred.iter().map(|v| v * v).sum::<f64>() / n + norm.eps as f64).sqrt();
        let (gain, bias) = (self.get(norm.gain), norm.bias.map(|b| self.get(b)));
        (0..row.len()).map(|d| centred[d] * inv * gain[d] + bias.map_or(0.0, |b| b[d])).collect()
    }

    /// `ys` (heads of `t.head`, each rotated in its first `2 * t.half` columns) rotated with one row of
    /// tables, each product and the sum rounded to `dtype`, as the RoPE's ops round.
    fn rotated(&self, ys: &[f64], t: RopeTables, dtype: ElemType) -> Vec<f64> {
        let (c, s) = (self.get(t.cos), self.get(t.sin));
        let (half, head) = (t.half as usize, t.head as usize);
        (0..ys.len())
            .map(|col| {
                let r = col % head;
                if r >= 2 * half {
                    return ys[col];
                }
                let rot = if r < half { -ys[col + half] } else { ys[col - half] };
                round(round(ys[col] * c[r], dtype) + round(rot * s[r], dtype), dtype)
            })
            .collect()
    }

    fn kv_update(&mut self, step: &Step) -> Result<(), &'static str> {
        let Step::KvUpdate { ref caches, position, layout: l } = *step else { unreachable!() };
        let (u_ts, u_hs) = l.update_strides();
        let pos = self.get(position)[0];
        for &(cache, update) in caches {
            let upd = self.get(update).to_vec();
            for (t, h) in (0..l.rows).flat_map(|t| (0..l.heads).map(move |h| (t, h))) {
                let row = pos + t as f64;
                if row < 0.0 || row >= l.len as f64 {
                    return Err("position");
                }
                for d in 0..l.head_dim {
                    let dst = ((h * l.len) as u64 + row as u64) * l.head_dim as u64 + d as u64;
                    self.put(cache, dst, upd[(t * u_ts + h * u_hs + d) as usize]);
                }
            }
        }
        Ok(())
    }

    fn attention(&mut self, step: &Step) -> Result<(), &'static str> {
        let Step::Attention { q, k, v, position, out, shape: s, .. } = *step else { unreachable!() };
        let (q_ts, q_hs) = s.q_strides();
        let (qv, kv, vv) = (self.get(q).to_vec(), self.get(k).to_vec(), self.get(v).to_vec());
        let pos = self.get(position)[0];
        let dh = s.head_dim as usize;
        for (t, h) in (0..s.rows).flat_map(|t| (0..s.heads).map(move |h| (t, h))) {
            let qpos = pos + t as f64;
            if qpos < 0.0 || qpos >= s.len as f64 {
                return Err("position");
            }
            let base = (t * q_ts + h * q_hs) as usize;
            let kvh = (h / s.group()) as usize;
            let rows = 0..=qpos as usize;
            let krow = |j: usize| (kvh * s.len as usize + j) * dh;
            let scores: Vec<f64> = rows
                .clone()
                .map(|j| (0..dh).map(|d| qv[base + d] * s.scale as f64 * kv[krow(j) + d]).sum())
                .map(|x: f64| s.softcap.map_or(x, |c| c as f64 * (x / c as f64).tanh()))
                .collect();
            let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|x| (x - mx).exp()).collect();
            let den: f64 = e.iter().sum();
            for d in 0..dh {
                let num: f64 = rows.clone().map(|j| e[j] * vv[krow(j) + d]).sum();
                self.put(out, (base + d) as u64, num / den);
            }
        }
        Ok(())
    }

    fn general(&mut self, step: &Step) {
        match step {
            Step::Binary { op, a, b, out, walk, .. } => {
                let (x, y) = (self.get(*a).to_vec(), self.get(*b).to_vec());
                for (i, ia, ib) in walk_indices(walk).collect::<Vec<_>>() {
                    let (x, y) = (x[ia as usize], y[ib as usize]);
                    let r = [x + y, x - y, x * y, x / y][*op as usize];
                    self.put(*out, i as u64, r);
                }
            }
            Step::Unary { func, input, out, n, .. } => {
                let x = self.get(*input).to_vec();
                (0..*n).for_each(|i| self.put(*out, i, func.apply(x[i as usize] as f32) as f64));
            }
            Step::Mean { input, out, rows, dim, .. } => {
                let (x, dim) = (self.get(*input).to_vec(), *dim as usize);
                for r in 0..*rows as usize {
                    self.put(*out, r as u64, x[r * dim..(r + 1) * dim].iter().sum::<f64>() / dim as f64);
                }
            }
            Step::Cast { input, out, n, to, .. } => {
                let x = self.get(*input).to_vec();
                let conv = |v: f64| if *to == ElemType::I64 { (v as f32).trunc() as f64 } else { v };
                (0..*n).for_each(|i| self.put(*out, i, conv(x[i as usize])));
            }
            Step::Rope { x, cos, sin, out, dtype, half, walk } => {
                let (xv, c, s) = (self.get(*x).to_vec(), self.get(*cos).to_vec(), self.get(*sin).to_vec());
                let half = *half as usize;
                for (i, ic, is) in walk_indices(walk).collect::<Vec<_>>() {
                    self.put(*out, i as u64, rope_at(&xv, i, half, c[ic as usize], s[is as usize], *dtype));
                }
            }
            Step::Copy { src, dst, walk, src_off, dst_off, .. } => {
                let x = self.get(*src).to_vec();
                for (_, is, id) in walk_indices(walk).collect::<Vec<_>>() {
                    self.put(*dst, dst_off + id, x[(src_off + is) as usize]);
                }
            }
            // A plan's steps never hold the GEMM path's `Glu`: only its expansion of a GEMV step does.
            other => unreachable!("a typed step or a GEMM-path launch: {other:?}"),
        }
    }
}
