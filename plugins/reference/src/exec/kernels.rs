//! The arithmetic of each op on plain slices, row-major, `f32`. Shapes are the caller's to get right (the
//! executor passes only validated shapes); data-dependent values (indices, positions) are checked here.

use super::Error;

/// `out[t, :] = table[indices[t], :]` for a table of `cols` columns.
///
/// Fails with [`Error::IndexOutOfRange`] (naming `table_name`) when an index is outside the table.
pub fn gather(
    table: &[f32],
    cols: usize,
    indices: &[i64],
    out: &mut [f32],
    table_name: &str,
) -> Result<(), Error> {
    let rows = table.len() / cols;
    for (t, (&index, out_row)) in indices.iter().zip(out.chunks_exact_mut(cols)).enumerate() {
        let row = usize::try_from(index)
            .ok()
            .filter(|&r| r < rows)
            .ok_or_else(|| Error::IndexOutOfRange { table: table_name.to_owned(), row: t, index, rows })?;
        out_row.copy_from_slice(&table[row * cols..(row + 1) * cols]);
    }
    Ok(())
}

/// `out[m, n] = sum_k a[m, k] b[k, n]` with `a` `[M, K]`, `b` `[K, N]`, `out` `[M, N]`.
pub fn mat_mul(a: &[f32], b: &[f32], k: usize, n: usize, out: &mut [f32]) {
    for (a_row, out_row) in a.chunks_exact(k).zip(out.chunks_exact_mut(n)) {
        out_row.fill(0.0);
        for (&a_mk, b_row) in a_row.iter().zip(b.chunks_exact(n)) {
            for (o, &b_kn) in out_row.iter_mut().zip(b_row) {
                *o += a_mk * b_kn;
            }
        }
    }
}

/// `out = a + b`, elementwise.
pub fn add(a: &[f32], b: &[f32], out: &mut [f32]) {
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = x + y;
    }
}

/// `out[m, :] = x[m, :] / sqrt(mean(x[m, :]^2) + eps) * weight` over rows of `weight.len()` columns.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let cols = weight.len();
    for (x_row, out_row) in x.chunks_exact(cols).zip(out.chunks_exact_mut(cols)) {
        let mean_square = x_row.iter().map(|&v| v * v).sum::<f32>() / cols as f32;
        let scale = 1.0 / (mean_square + eps).sqrt();
        for ((o, &v), &w) in out_row.iter_mut().zip(x_row).zip(weight) {
            *o = v * scale * w;
        }
    }
}

/// The geometry of a KV cache `[heads, len, head_dim]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheShape {
    /// Number of heads.
    pub heads: usize,
    /// Number of rows (maximum sequence length).
    pub len: usize,
    /// Size of one head.
    pub head_dim: usize,
}

/// Writes `update` (`[rows, heads * head_dim]`) into cache rows `position .. position + rows` of every head.
/// The caller has checked `position + rows <= shape.len`.
pub fn kv_cache_update(cache: &mut [f32], shape: CacheShape, update: &[f32], position: usize) {
    let CacheShape { heads, len, head_dim } = shape;
    for (t, update_row) in update.chunks_exact(heads * head_dim).enumerate() {
        for (h, src) in update_row.chunks_exact(head_dim).enumerate() {
            let start = (h * len + position + t) * head_dim;
            cache[start..start + head_dim].copy_from_slice(src);
        }
    }
}

/// Causal attention of `q` (`[rows, heads * head_dim]`) over caches `k`, `v` of `shape`: query `t` attends to
/// rows `0 ..= position + t`. `scores` is scratch of at least `shape.len` elements. The caller has checked
/// `position + rows <= shape.len`.
pub fn causal_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    shape: CacheShape,
    position: usize,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let CacheShape { heads, len, head_dim } = shape;
    let scale = 1.0 / (head_dim as f32).sqrt();
    let width = heads * head_dim;
    for (t, (q_row, out_row)) in q.chunks_exact(width).zip(out.chunks_exact_mut(width)).enumerate() {
        let visible = position + t + 1;
        for h in 0..heads {
            let q_h = &q_row[h * head_dim..(h + 1) * head_dim];
            let k_h = &k[h * len * head_dim..(h * len + visible) * head_dim];
            let v_h = &v[h * len * head_dim..(h * len + visible) * head_dim];
            let scores = &mut scores[..visible];
            for (s, k_row) in scores.iter_mut().zip(k_h.chunks_exact(head_dim)) {
                *s = q_h.iter().zip(k_row).map(|(a, b)| a * b).sum::<f32>() * scale;
            }
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut total = 0.0f32;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                total += *s;
            }
            let out_h = &mut out_row[h * head_dim..(h + 1) * head_dim];
            out_h.fill(0.0);
            for (&s, v_row) in scores.iter().zip(v_h.chunks_exact(head_dim)) {
                let weight = s / total;
                for (o, &x) in out_h.iter_mut().zip(v_row) {
                    *o += weight * x;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mat_mul_multiplies() {
        // [[1, 2], [3, 4]] x [[5, 6, 7], [8, 9, 10]]
        let mut out = [0.0; 6];
        mat_mul(&[1.0, 2.0, 3.0, 4.0], &[5.0, 6.0, 7.0, 8.0, 9.0, 10.0], 2, 3, &mut out);
        assert_eq!(out, [21.0, 24.0, 27.0, 47.0, 54.0, 61.0]);
    }

    #[test]
    fn rms_norm_normalises_each_row() {
        let mut out = [0.0; 4];
        rms_norm(&[3.0, 4.0, 1.0, 1.0], &[1.0, 2.0], 0.0, &mut out);
        let rms = (12.5f32).sqrt();
        assert_eq!(out, [3.0 / rms, 8.0 / rms, 1.0, 2.0]);
    }

    #[test]
    fn gather_picks_rows_and_refuses_out_of_range_ids() {
        let table = [0.0, 1.0, 10.0, 11.0, 20.0, 21.0];
        let mut out = [0.0; 4];
        gather(&table, 2, &[2, 0], &mut out, "emb").expect("in range");
        assert_eq!(out, [20.0, 21.0, 0.0, 1.0]);
        let err = gather(&table, 2, &[1, 3], &mut out, "emb").expect_err("3 is out of range");
        assert_eq!(err.to_string(), "index 3 at row 1 of the indices is outside table 'emb' with 3 rows");
        assert!(gather(&table, 2, &[-1], &mut out[..2], "emb").is_err());
    }

    #[test]
    fn kv_cache_update_writes_rows_of_every_head_only() {
        let shape = CacheShape { heads: 2, len: 3, head_dim: 2 };
        let mut cache = [9.0; 12];
        // two rows at position 1: row t = [h0 (2 values), h1 (2 values)]
        kv_cache_update(&mut cache, shape, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], 1);
        assert_eq!(cache, [9.0, 9.0, 1.0, 2.0, 5.0, 6.0, 9.0, 9.0, 3.0, 4.0, 7.0, 8.0]);
    }

    #[test]
    fn causal_attention_sees_only_rows_up_to_its_position() {
        let shape = CacheShape { heads: 1, len: 3, head_dim: 1 };
        let k = [0.0, 0.0, 0.0];
        let v = [1.0, 3.0, 100.0];
        let mut scores = [0.0; 3];
        let mut out = [0.0; 2];
        // Equal scores: query 0 at position 0 averages row 0; query 1 averages rows 0 and 1; row 2 is unseen.
        causal_attention(&[1.0, 1.0], &k, &v, shape, 0, &mut scores, &mut out);
        assert_eq!(out, [1.0, 2.0]);
    }

    #[test]
    fn causal_attention_weights_by_softmax_of_scaled_scores() {
        let shape = CacheShape { heads: 1, len: 2, head_dim: 4 };
        let k = [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        let v = [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0];
        let mut scores = [0.0; 2];
        let mut out = [0.0; 4];
        causal_attention(&[2.0, 0.0, 0.0, 0.0], &k, &v, shape, 1, &mut scores, &mut out);
        // scores = [2 / sqrt(4), 0] = [1, 0]
        let w0 = 1.0f32.exp() / (1.0f32.exp() + 1.0);
        assert!((out[0] - w0).abs() < 1e-6 && (out[1] - (1.0 - w0)).abs() < 1e-6, "{out:?}");
    }
}
