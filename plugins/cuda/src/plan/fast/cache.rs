//! A decode step's cache updates (K and V in one launch, or written by the GEMV that computes them) and its
//! attention.

#[allow(clippy::wildcard_imports)]
use super::*;

impl Lowering<'_> {
    /// A cache update (with the next one at the same position and of the same shapes: K and V in one
    /// launch); token-major updates the previous GEMV computes are written by that GEMV.
    pub(super) fn kv_update(&mut self, p: usize) -> Result<usize, Unsupported> {
        let Some(&Op::KvCacheUpdate { cache, update, position, out }) = self.ahead(p, 0) else {
            unreachable!("a kv update")
        };
        self.rehome(out, cache);
        let layout = self.kv_layout(cache, update)?;
        let mut caches = vec![(cache, update)];
        if let Some(&Op::KvCacheUpdate { cache: c2, update: u2, position: p2, out: o2 }) = self.ahead(p, 1) {
            // One row is in token-major order whichever way its update is shaped.
            let one_row = |l: KvLayout| KvLayout { head_major: l.head_major && l.rows > 1, ..l };
            let alike = one_row(self.kv_layout(c2, u2)?) == one_row(layout);
            if p2 == position && self.shape(c2) == self.shape(cache) && alike {
                self.rehome(o2, c2);
                caches.push((c2, u2));
            }
        }
        let taken = caches.len();
        // A head-major update of one row is in token-major order.
        let token_major = !layout.head_major || layout.rows == 1;
        if token_major && self.fuse_into_gemv(&caches, position, layout) {
            return Ok(taken);
        }
        self.steps.push(Step::KvUpdate { caches, position, layout });
        Ok(taken)
    }

    /// `cache` `[H, L, Dh]` or `[1, H, L, Dh]` and `update` token-major `[T, H * Dh]` or head-major `[H, T,
    /// Dh]` / `[1, H, T, Dh]` (the forms validation admits).
    fn kv_layout(&self, cache: TensorId, update: TensorId) -> Result<KvLayout, Unsupported> {
        let c = self.shape(cache);
        let c = &c[c.len().saturating_sub(3)..];
        let u = self.shape(update);
        let head_major = u.len() >= 3;
        let rows = if head_major { u[u.len() - 2] } else { u[0] };
        Ok(KvLayout {
            rows: u32_of(rows, "rows")?,
            heads: u32_of(c[0], "heads")?,
            len: u32_of(c[1], "cache length")?,
            head_dim: u32_of(c[2], "head size")?,
            head_major,
        })
    }

    /// Has the previous GEMV write `caches`' updates (each one of its outputs, or a view sharing its
    /// storage) into the caches: whether it did.
    fn fuse_into_gemv(&mut self, caches: &[(TensorId, TensorId)], position: TensorId, l: KvLayout) -> bool {
        let homes = &self.homes;
        // The last GEMV that computes an update (a parallel block's MLP projection may follow it), when no
        // step after it touches the caches (their rows may then be written earlier).
        let computes =
            |mat: &GemvMat, update: TensorId| Home::root(homes, mat.y) == Home::root(homes, update);
        let computes_one = |s: &Step| match s {
            Step::Gemv { mats, .. } => caches.iter().any(|&(_, u)| mats.iter().any(|mat| computes(mat, u))),
            _ => false,
        };
        let Some(at) = self.steps.iter().rposition(computes_one) else { return false };
        let touches = |s: &Step| {
            s.reads()
                .into_iter()
                .chain(s.writes())
                .any(|id| caches.iter().any(|&(cache, _)| Home::root(homes, id) == Home::root(homes, cache)))
        };
        if self.steps[at + 1..].iter().any(touches) {
            return false;
        }
        let Some(Step::Gemv { mats, cache_rows: cache_rows @ None, m, .. }) = self.steps.get_mut(at) else {
            return false;
        };
        if *m != l.rows || !caches.iter().all(|&(_, update)| mats.iter().any(|mat| computes(mat, update))) {
            return false;
        }
        for &(cache, update) in caches {
            if let Some(mat) = mats.iter_mut().find(|mat| computes(mat, update)) {
                mat.cache = Some(cache);
            }
        }
        *cache_rows = Some(CacheRows { position, heads: l.heads, len: l.len, head_dim: l.head_dim });
        true
    }

    /// Causal attention over the caches where they are: `q` token-major `[T, Hq * Dh]` or head-major
    /// `[Hq, T, Dh]` / `[1, Hq, T, Dh]`, caches `[Hkv, L, Dh]` / `[1, Hkv, L, Dh]`.
    pub(super) fn attention(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        position: TensorId,
        (scale, softcap): (Option<f32>, Option<f32>),
        out: TensorId,
    ) -> Result<(), Unsupported> {
        let c = self.shape(k);
        let c = &c[c.len().saturating_sub(3)..];
        let (kv_heads, len, head_dim) =
            (u32_of(c[0], "heads")?, u32_of(c[1], "cache length")?, u32_of(c[2], "head size")?);
        if head_dim > ATTN_MAX_HEAD {
            return Err(Unsupported(format!(
                "attention '{}' has head size {head_dim}; the CUDA delegate's attention handles up to {ATTN_MAX_HEAD}",
                self.graph.tensor(out).name
            )));
        }
        let s = self.shape(q);
        let head_major = s.len() >= 3;
        let (rows, heads) =
            if head_major { (s[s.len() - 2], s[s.len() - 3]) } else { (s[0], s[1] / u64::from(head_dim)) };
        let (rows, heads) = (u32_of(rows, "rows")?, u32_of(heads, "heads")?);
        if kv_heads == 0 || heads % kv_heads != 0 {
            return Err(Unsupported(format!(
                "attention '{}' has {heads} query heads over {kv_heads} KV heads, not a whole number per \
                 KV head",
                self.graph.tensor(out).name
            )));
        }
        let scale = scale.unwrap_or(1.0 / (head_dim as f32).sqrt());
        let shape = AttnShape { rows, heads, kv_heads, len, head_dim, head_major, scale, softcap };
        self.float(q)?;
        let splits = attention_splits(heads, rows, len);
        let heads_rows = rows as usize * heads as usize;
        let slots = heads_rows * splits as usize;
        let scratch = &mut self.attn_scratch;
        scratch.partials = scratch.partials.max(slots * head_dim as usize);
        scratch.maxima = scratch.maxima.max(slots * 2);
        scratch.counters = scratch.counters.max(heads_rows);
        let early = self.updated_at(k, position) && self.updated_at(v, position) && self.stable(position);
        self.steps.push(Step::Attention { q, k, v, position, out, shape, splits, early });
        Ok(())
    }

    /// Whether `cache` is a `KvCacheUpdate`'s output at `position` and every op that writes its storage
    /// writes it at that position (what it holds before the position is what the caller passed in).
    fn updated_at(&self, cache: TensorId, position: TensorId) -> bool {
        let ops = self.graph.ops();
        let Some(root) = ops.iter().find_map(|op| match *op {
            Op::KvCacheUpdate { cache: c, out, position: p, .. } if out == cache && p == position => Some(c),
            _ => None,
        }) else {
            return false;
        };
        ops.iter().all(|op| match *op {
            Op::KvCacheUpdate { cache: c, position: p, .. } => c != root || p == position,
            Op::Assign { target, .. } => target != root,
            _ => true,
        })
    }

    /// Whether `id` holds one value all call long: a constant, or an input no op writes.
    pub(super) fn fixed(&self, id: TensorId) -> bool {
        self.graph.constant(id).is_some() || self.stable(id)
    }

    /// Whether `id` is a graph input no op writes in place (it holds the caller's value all call long).
    fn stable(&self, id: TensorId) -> bool {
        self.graph.inputs().contains(&id)
            && !self.graph.ops().iter().any(|op| matches!(*op, Op::Assign { target, .. } if target == id))
    }
}
