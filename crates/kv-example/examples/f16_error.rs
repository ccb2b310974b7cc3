//! Estimates how far an f16 executor (f16 storage of every tensor, f32 accumulation) lands from the f64
//! oracle, by simulating one: `cargo run --release -p kv-example --example f16_error -- [a|b|c] [steps]`.
//! Prints the largest absolute logits and cache error of prefill plus `steps` greedy decode steps.

use kv_example::model::RMS_EPS;
use kv_example::{BenchConfig, Config, Oracle, Weights};
use ref_graph::half::f16;
use ref_graph::ElemType;

fn r(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

fn vec_mat(x: &[f32], w: &[f32], cols: usize) -> Vec<f32> {
    let mut y = vec![0.0f32; cols];
    for (i, &xi) in x.iter().enumerate() {
        for (j, yj) in y.iter_mut().enumerate() {
            *yj += xi * w[i * cols + j];
        }
    }
    y.into_iter().map(r).collect()
}

fn rms_norm(x: &[f32], gain: &[f32]) -> Vec<f32> {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = 1.0 / (ms + RMS_EPS).sqrt();
    x.iter().zip(gain).map(|(v, g)| r(v * inv * g)).collect()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let which = args.next().and_then(|a| BenchConfig::from_name(&a)).unwrap_or(BenchConfig::B);
    let steps: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(4);
    let mut cfg = Config::bench(which);
    cfg.dtype = ElemType::F16;
    let w = Weights::generate(&cfg).stored_as(ElemType::F16);
    let mut oracle = Oracle::new(&cfg);
    let (dim, hd, len) = (cfg.dim(), cfg.head_dim, cfg.max_len);
    let mut k = vec![vec![0.0f32; cfg.cache_len()]; cfg.layers];
    let mut v = vec![vec![0.0f32; cfg.cache_len()]; cfg.layers];
    let (mut worst_logits, mut worst_cache) = (0.0f64, 0.0f64);
    let mut token = cfg.prompt[0];
    for position in 0..cfg.prompt_len() + steps {
        if position < cfg.prompt_len() {
            token = cfg.prompt[position];
        }
        let row = token as usize;
        let mut x: Vec<f32> =
            (0..dim).map(|i| r(w.tok_emb[row * dim + i] + w.pos_emb[position * dim + i])).collect();
        for (l, lw) in w.layers.iter().enumerate() {
            let h = rms_norm(&x, &lw.norm);
            let (q, kk, vv) = (vec_mat(&h, &lw.wq, dim), vec_mat(&h, &lw.wk, dim), vec_mat(&h, &lw.wv, dim));
            for head in 0..cfg.heads {
                for d in 0..hd {
                    k[l][(head * len + position) * hd + d] = kk[head * hd + d];
                    v[l][(head * len + position) * hd + d] = vv[head * hd + d];
                }
            }
            let mut attn = vec![0.0f32; dim];
            for head in 0..cfg.heads {
                let scores: Vec<f32> = (0..=position)
                    .map(|p| {
                        (0..hd).map(|d| q[head * hd + d] * k[l][(head * len + p) * hd + d]).sum::<f32>()
                            / (hd as f32).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
                let t: f32 = e.iter().sum();
                for (p, e) in e.iter().enumerate() {
                    for d in 0..hd {
                        attn[head * hd + d] += e / t * v[l][(head * len + p) * hd + d];
                    }
                }
            }
            let attn: Vec<f32> = attn.into_iter().map(r).collect();
            let o = vec_mat(&attn, &lw.wo, dim);
            x = x.iter().zip(&o).map(|(a, b)| r(a + b)).collect();
        }
        let logits = vec_mat(&rms_norm(&x, &w.final_norm), &w.w_out, cfg.vocab);
        let expected = oracle.decode(token, position).expect("in range");
        let err = logits.iter().zip(&expected).map(|(a, e)| (f64::from(*a) - e).abs()).fold(0.0, f64::max);
        worst_logits = worst_logits.max(err);
        for l in 0..cfg.layers {
            let (ek, ev) = oracle.cache(l);
            let e = k[l].iter().zip(ek).chain(v[l].iter().zip(ev)).map(|(a, e)| (f64::from(*a) - e).abs());
            worst_cache = worst_cache.max(e.fold(0.0, f64::max));
        }
        token = kv_example::argmax(&logits) as i64;
    }
    println!(
        "config {}: {} positions, max |logits - oracle| = {worst_logits:.3e}, max |caches - oracle| = {worst_cache:.3e}",
        which.name(),
        cfg.prompt_len() + steps
    );
}
