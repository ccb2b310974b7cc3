//! The launches' sizes, pure rules of the plan's shapes and the device's SM count: how many blocks each kernel
//! takes, which entry a GEMV launch runs, how an attention cuts and merges its ranges, and the shared memory
//! it needs. Each constant mirrors a define of the source (the tests check they agree).

use super::tuning;
use crate::plan::Float;

/// Values of `float` a thread takes at once where a kernel moves 16-byte runs (`VEC` of the typed source,
/// `lanes16` of the general one): what their launches are sized by.
pub fn run_values(float: Float) -> u32 {
    if float == Float::F32 {
        4
    } else {
        8
    }
}

/// Threads of an attention block (`ATTN_WARPS` warps in the source).
pub const ATTN_THREADS: u32 = 128;
/// Largest head an attention block handles (a lane holds at most 8 elements of a row, 32 lanes a row).
pub const ATTN_MAX_HEAD: u32 = 256;
/// Whether a module for `float` on a device of compute capability `capability` has the tensor-core attention
/// (`attention_tc`: f16 or bf16 MMAs, sm_80 and later).
pub fn has_attention_tc(float: Float, capability: (i32, i32)) -> bool {
    float != Float::F32 && capability >= (8, 0)
}

/// Whether an attention over heads of `head_dim` values runs on tensor cores in a module that has them: heads
/// of 64 or 128 values in whole aligned 16-byte chunks (`vec_ok`; a lane's fragments are whole chunks).
pub fn attention_on_tensor_cores(vec_ok: bool, head_dim: u32) -> bool {
    vec_ok && matches!(head_dim, 64 | 128)
}

/// Query heads a tensor-core attention block takes, of the `group` that share a KV head: the most that divide
/// it, up to 8 (an MMA's N).
pub fn attention_heads_per_block(group: u32) -> u32 {
    let mut n = 8;
    while group % n != 0 {
        n /= 2;
    }
    n
}

/// Blocks of `attention_tc` an SM holds at once (`ATTN_TC_BLOCKS_PER_SM` in the source: its launch bound).
pub const ATTN_TC_BLOCKS_PER_SM: u32 = 3;

/// The most blocks a tensor-core attention launch takes: a wave on a device of `multiprocessors` SMs, or what
/// a tuning sweep sets with `-DKV_ATTN_TC_WAVE=N`. Read once an engine, when it is built.
pub fn attention_tc_wave(multiprocessors: u32) -> u32 {
    wave(multiprocessors, ("ATTN_TC_BLOCKS_PER_SM", ATTN_TC_BLOCKS_PER_SM), "KV_ATTN_TC_WAVE")
}

/// The blocks one wave of a kernel holds on `multiprocessors` SMs: `per_sm` (its launch bound's define and
/// value: a sweep's `-DNAME=N` sets both sides) an SM, or what a sweep sets with `-D{wave_rule}=N`.
fn wave(multiprocessors: u32, per_sm: (&str, u32), wave_rule: &str) -> u32 {
    let per_sm = tuning::override_of(per_sm.0, per_sm.1.into());
    let wave = tuning::override_of(wave_rule, u64::from(multiprocessors).saturating_mul(per_sm));
    u32::try_from(wave).unwrap_or(u32::MAX)
}

/// Ranges a tensor-core attention cuts each head's rows into, for `head_blocks` blocks of heads (and query
/// rows): as many as one `wave` holds, so every block is resident at once and none waits for a second wave;
/// at most the plan's `splits` (what the scratch holds) and at least 1.
pub fn attention_tc_splits(splits: u32, head_blocks: u32, wave: u32) -> u32 {
    (wave / head_blocks.max(1)).clamp(1, splits.max(1))
}

/// Threads of a clustered attention block (`ATTN_CLUSTER_WARPS` warps in the source).
pub const ATTN_CLUSTER_THREADS: u32 = 256;
/// The most blocks a clustered attention's merge reads (`ATTN_CLUSTER_MAX` in the source; sm_90's largest
/// cluster).
pub const ATTN_CLUSTER_MAX: u32 = 16;
/// The head size the clustered attention is built for (`attention_tc_cluster`: 128 would spill at its launch
/// bound of two blocks an SM; blocks of 4 warps for heads of 128 measured slower than the ticket merge, see
/// BENCHMARKS.md, "Sixteenth pass").
pub const ATTN_CLUSTER_HEAD: u32 = 64;

/// The most tiles of 16 rows a warp of a clustered attention takes from its block's range, or what a sweep
/// sets with `-DKV_ATTN_CLUSTER_TILES=N`: past that the ranges merge by tickets. Read once an engine.
pub fn attention_cluster_tiles() -> u32 {
    u32::try_from(tuning::override_of("KV_ATTN_CLUSTER_TILES", 8)).unwrap_or(u32::MAX)
}

/// What a device holds of the clustered attention: the most blocks one cluster of it, and the most clusters
/// of that many resident at once. The default: none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClusterRoom {
    pub blocks: u32,
    pub clusters: u32,
}

/// Ranges a tensor-core attention over a cache of `len` rows cuts each head's rows into when its blocks merge
/// in a cluster (`attention_tc_cluster`), for `clusters` clusters (blocks of heads, query rows) on a device
/// that holds `room` of it: the fewest blocks whose warps cover the cache with one tile of 16 rows each, or,
/// where a cluster has too few blocks for that, all it has, each warp taking at most `tiles` tiles. `None`
/// (the ticket merge of `attention_tc`) when a cluster cannot cover the cache so, when the launch's clusters
/// would not all be resident at once (a second wave), or for heads other than [`ATTN_CLUSTER_HEAD`]'s.
pub fn attention_tc_cluster(
    len: u32,
    head_dim: u32,
    clusters: u32,
    room: ClusterRoom,
    tiles: u32,
) -> Option<u32> {
    let rows_per_block = ATTN_CLUSTER_THREADS / 32 * 16;
    let most = room.blocks.min(ATTN_CLUSTER_MAX);
    let splits = len.div_ceil(rows_per_block).clamp(1, most.max(1));
    let covers = u64::from(splits) * u64::from(rows_per_block) * u64::from(tiles) >= u64::from(len);
    let fits = head_dim == ATTN_CLUSTER_HEAD && most > 1 && clusters <= room.clusters;
    (covers && fits).then_some(splits)
}

/// Warps of a GEMV block (`GEMV_WARPS` in the source).
pub const GEMV_WARPS: u32 = 8;
/// The most shared memory a GEMV block stages its activation row in (4 bytes a value): 48 KiB, the most a block
/// may have without raising the kernel's attribute, less 1 KiB for the kernels' own static shared memory (under
/// 100 bytes: with a row of 48 KiB the launch would ask for more than a block may have).
const GEMV_STAGE_BYTES: u32 = 47 << 10;
/// Fewest blocks of a GEMV launch that stages its activation row when it fuses no norm: two blocks an SM of the
/// H200. Measured there (same call, 200-step means, µs at (c) 4096 / 8191, (b) 512 / 1023, the Llama-3.2-1B
/// shape), staging launches of at least 1 024 blocks (the Llama shape's gate/up and vocabulary projections):
/// 545.4 / 657.0, 108.1 / 108.6, 1032.8; of 256 (also (c)'s normalised Q/K/V and the Llama shape's other
/// projections): 539.5 / 643.3, 108.1 / 108.6, 1029.6; of 128 (also (b)'s normalised Q/K/V and (c)'s output
/// projection, which fuses none): 546.7 / 649.2, 99.3 / 100.8, 1030.5. Staging pays wherever the launch fuses
/// an RMS norm (else every warp reads and normalises the whole row itself); a launch of one or two blocks an
/// SM that fuses none pays the barrier and the round trip for nothing. This rule (a norm, or 256 blocks)
/// measured 539.2 / 644.4, 98.9 / 99.3, 1029.1 in the next call.
pub const GEMV_STAGE_MIN_BLOCKS: u32 = 256;

/// [`GEMV_STAGE_MIN_BLOCKS`], or what a tuning sweep sets with `-DKV_GEMV_STAGE_MIN_BLOCKS=N` (read once).
pub fn gemv_stage_min_blocks() -> u32 {
    static MIN: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| {
        let min = tuning::override_of("KV_GEMV_STAGE_MIN_BLOCKS", GEMV_STAGE_MIN_BLOCKS.into());
        u32::try_from(min).unwrap_or(u32::MAX)
    })
}

/// The dynamic shared memory (bytes) of a GEMV launch of `blocks` blocks over rows of `k` values that stages
/// its activation row (`gemv_stream` and the `_waves` entries in `kernels/linear.cu`), or `None` when it reads
/// the row from global memory: only whole 16-byte chunks (`vec_ok`) that fit, and only a launch that fuses an
/// RMS norm (`norm`) or has at least `min_blocks` blocks ([`gemv_stage_min_blocks`]).
pub fn gemv_stage(vec_ok: bool, k: u32, blocks: u32, norm: bool, min_blocks: u32) -> Option<u32> {
    let bytes = k.checked_mul(4)?;
    (vec_ok && bytes <= GEMV_STAGE_BYTES && (norm || blocks >= min_blocks)).then_some(bytes)
}

/// GEMV blocks an SM holds at once (`GEMV_BLOCKS_PER_SM` in the source: the kernels' launch bound, which
/// budgets their registers).
pub const GEMV_BLOCKS_PER_SM: u32 = 3;

/// The most blocks a staged GEMV launch takes on a device of `multiprocessors` SMs: one wave,
/// [`GEMV_BLOCKS_PER_SM`] an SM (a tuning sweep's `-DGEMV_BLOCKS_PER_SM=N` sets both sides), or what a sweep
/// sets with `-DKV_GEMV_WAVE=N` (0: no limit). Read once an engine, when it is built.
pub fn gemv_wave(multiprocessors: u32) -> u32 {
    wave(multiprocessors, ("GEMV_BLOCKS_PER_SM", GEMV_BLOCKS_PER_SM), "KV_GEMV_WAVE")
}

/// Blocks across of a GEMV launch of `groups` groups of columns: one a group, but at most `wave` (unless 0)
/// when the launch stages its activation row, whose blocks then take several groups with one staging: as
/// few blocks as take the same most groups each, so that every block takes that many but the last few (the
/// Llama-3.2-1B shape's gate/up: 1 024 groups of both matrices on 342 blocks of 3, not 396 of 2 or 3, whose
/// last third ran on 232 blocks).
pub fn gemv_blocks(groups: u32, staged: bool, wave: u32) -> u32 {
    if staged && wave > 0 && groups > wave {
        groups.div_ceil(groups.div_ceil(wave))
    } else {
        groups
    }
}

/// Blocks of a `_deep` GEMV entry an SM holds at once (`GEMV_DEEP_BLOCKS_PER_SM` in the source: its launch
/// bound, whose register budget holds twice the loads in flight a lane).
pub const GEMV_DEEP_BLOCKS_PER_SM: u32 = 2;

/// The most blocks (all rows) a staged GEMV launch may have to take the `_deep` entries: a wave of them on a
/// device of `multiprocessors` SMs, [`GEMV_DEEP_BLOCKS_PER_SM`] an SM, or what a sweep sets with
/// `-DKV_GEMV_DEEP_WAVE=N` (0: never). Read once an engine, when it is built.
pub fn gemv_deep_wave(multiprocessors: u32) -> u32 {
    wave(multiprocessors, ("GEMV_DEEP_BLOCKS_PER_SM", GEMV_DEEP_BLOCKS_PER_SM), "KV_GEMV_DEEP_WAVE")
}

/// The compiled body a GEMV launch runs; each kind (plain, gate/up, rotated) has all three.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemvEntry {
    /// A block a group of columns (`gemv`).
    Group = 0,
    /// Blocks that each take several groups with one staging of the row (`gemv_waves`).
    Waves = 1,
    /// A block a group, a staged launch few enough blocks to sit [`GEMV_DEEP_BLOCKS_PER_SM`] an SM: twice the
    /// weight loads in flight a lane, all requested before its wait (`gemv_deep`), so its rows stream while
    /// the previous kernel finishes. Measured on the H200, same call: the Llama shape's output and down
    /// projections (256 blocks) took 29 us off its step; alone under Nsight Compute the down projection is
    /// no faster (48-50 % of the DRAM bandwidth either way).
    Deep = 2,
}

/// The weight loads of 16 bytes a group entry's lane requests before its wait (`GEMV_PRE` in the source).
pub const GEMV_PRE: u32 = 4;

/// The entry of a GEMV launch of `groups` groups of columns on `blocks` blocks across and `rows` rows, staged
/// or not, whose lanes load `row_loads` 16-byte chunks of each weight row: `_waves` when its blocks take
/// several groups; `_deep` when it is staged, its blocks number at most `deep_wave` ([`gemv_deep_wave`]) and
/// its rows are longer than the loads a group entry requests before its wait ([`GEMV_PRE`]; on the H200 a
/// deep launch of shorter rows only costs: config (b)'s Q/K/V, rows of 2 loads a lane, 85.3 -> 91.7 us a step).
pub fn gemv_entry(
    groups: u32,
    blocks: u32,
    rows: u32,
    staged: bool,
    row_loads: u32,
    deep_wave: u32,
) -> GemvEntry {
    if groups > blocks {
        GemvEntry::Waves
    } else if staged && row_loads > GEMV_PRE && blocks.saturating_mul(rows) <= deep_wave {
        GemvEntry::Deep
    } else {
        GemvEntry::Group
    }
}

/// Threads of an argmax block (`ARGMAX_THREADS` in the source).
pub const ARGMAX_THREADS: u32 = 256;
/// Most blocks an argmax launch takes (its scratch holds one value and one index per block).
pub const ARGMAX_BLOCKS: u32 = 128;

/// Dynamic shared memory of an attention block of `threads` threads over `hpb` heads of `head_dim` values
/// (`tc`: `attention_tc`'s layout, 8 columns a warp; `cluster`: merging in its cluster): the warps' maxima
/// and sums, then their outputs, or for the ticket merge the larger of those and its groups' states (6
/// floats a thread, or a head's value when there are more), then the cluster's partial (the heads' values, a
/// max and sum a head).
pub fn attention_shared(tc: bool, hpb: u32, head_dim: u32, threads: u32, cluster: bool) -> u32 {
    let warps = threads / 32;
    let columns = if tc { 8 } else { 1 };
    let outputs = warps * hpb * head_dim;
    let (middle, partial) = if cluster {
        (outputs, hpb * (head_dim + 2))
    } else {
        (outputs.max(6 * threads.max(hpb * head_dim)), 0)
    };
    (2 * warps * columns + middle + partial) * 4
}

#[cfg(test)]
mod tests {
    use super::super::SOURCE;
    use super::*;

    /// A GEMV stages its row when its row is whole 16-byte chunks that fit the block's shared memory and it
    /// fuses an RMS norm or has two blocks an SM or more: every projection of the Llama-3.2-1B shape and the
    /// Q/K/V projections of configs (b) and (c), not their output projections.
    #[test]
    fn gemvs_stage_their_row_when_normalised_or_many_blocks_and_it_fits() {
        let stage = |vec_ok, k, blocks, norm| gemv_stage(vec_ok, k, blocks, norm, GEMV_STAGE_MIN_BLOCKS);
        assert_eq!(stage(true, 2048, 16_384 / GEMV_WARPS, true), Some(8192), "gate/up");
        assert_eq!(stage(true, 2048, 128_256_u32.div_ceil(GEMV_WARPS), true), Some(8192), "vocabulary");
        assert_eq!(stage(true, 8192, 2048 / GEMV_WARPS, false), Some(32 << 10), "down");
        assert_eq!(stage(true, 2048, 2048 / GEMV_WARPS, false), Some(8192), "output");
        assert_eq!(stage(true, 2048, 3072 / GEMV_WARPS, true), Some(8192), "Q/K/V");
        assert_eq!(stage(true, 1024, 3072 / GEMV_WARPS, true), Some(4096), "(c)'s Q/K/V");
        assert_eq!(stage(true, 1024, 1024 / GEMV_WARPS, false), None, "(c)'s output projection");
        assert_eq!(stage(true, 512, 1536 / GEMV_WARPS, true), Some(2048), "(b)'s Q/K/V");
        assert_eq!(stage(true, 512, 512 / GEMV_WARPS, false), None, "(b)'s output projection");
        assert_eq!(stage(false, 2048, 4096, true), None, "not whole aligned chunks");
        assert_eq!(stage(true, 12_032, 4096, false), Some(47 << 10), "the largest row that fits");
        assert_eq!(stage(true, 12_288, 4096, true), None, "48 KiB and the kernel's static shared memory");
        assert_eq!(stage(true, u32::MAX, 4096, true), None, "no overflow");
        assert_eq!(gemv_stage(true, 2048, 4096, false, 4097), None, "a sweep's higher threshold");
    }

    /// A tensor-core attention block takes the query heads of one KV head, as many as divide its group up
    /// to an MMA's 8 columns; only f16 and bf16 on sm_80 and later, heads of 64 or 128 whole chunks.
    #[test]
    fn tensor_core_attention_takes_whole_groups_of_heads() {
        let per_block: Vec<u32> = [1, 2, 3, 4, 6, 8, 12, 16, 32].map(attention_heads_per_block).into();
        assert_eq!(per_block, [1, 2, 1, 4, 2, 8, 4, 8, 8]);
        assert!(has_attention_tc(Float::Bf16, (8, 0)) && has_attention_tc(Float::F16, (9, 0)));
        assert!(!has_attention_tc(Float::F32, (9, 0)) && !has_attention_tc(Float::F16, (7, 5)));
        assert!(attention_on_tensor_cores(true, 64) && attention_on_tensor_cores(true, 128));
        assert!(!attention_on_tensor_cores(false, 128), "unaligned rows");
        assert!(!attention_on_tensor_cores(true, 96) && !attention_on_tensor_cores(true, 256));
    }

    /// The source defines `define` (a kernel's launch bound, blocks an SM) as the Rust constant `per_sm`, and
    /// `wave` of the H200's 132 SMs is `h200` (unless a tuning build's sweep overrides it).
    fn assert_launch_bound(define: &str, per_sm: u32, wave: fn(u32) -> u32, h200: u32) {
        let line = format!("#define {define} {per_sm}");
        assert!(
            SOURCE.contains(&format!("{line}\n")) || SOURCE.contains(&format!("{line} ")),
            "the source's {define} is not {per_sm}"
        );
        if !cfg!(feature = "tuning") {
            assert_eq!(wave(132), h200, "{define}: a wave of 132 SMs");
        }
    }

    /// A tensor-core attention launch fits one wave (the H200: 132 SMs, 396 blocks), within the plan's
    /// scratch; its launch bound matches the source's.
    #[test]
    fn tensor_core_attention_fits_a_wave() {
        assert_launch_bound("ATTN_TC_BLOCKS_PER_SM", ATTN_TC_BLOCKS_PER_SM, attention_tc_wave, 396);
        assert_eq!(attention_tc_splits(80, 8, 396), 49, "config (c): 8 heads, 49 ranges each");
        assert_eq!(attention_tc_splits(20, 8, 396), 20, "the Llama shape: the plan's 20 ranges");
        assert_eq!(attention_tc_splits(80, 8 * 64, 396), 1, "more head blocks than a wave");
        assert_eq!(attention_tc_splits(0, 0, 396), 1, "never 0");
    }

    /// A tensor-core attention merges in a cluster where one cluster's warps cover the whole cache a tile
    /// each (the fewest blocks that do), or where all a cluster's blocks cover it in at most `tiles` tiles a
    /// warp, and all the launch's clusters are resident at once; by tickets otherwise. The constants match the
    /// source's.
    #[test]
    fn clustered_attention_covers_the_cache_in_a_few_tiles_a_warp() {
        for line in [
            format!("#define ATTN_CLUSTER_MAX {ATTN_CLUSTER_MAX} "),
            format!("#define ATTN_CLUSTER_WARPS {} ", ATTN_CLUSTER_THREADS / 32),
        ] {
            assert!(SOURCE.contains(&line), "the source lacks `{line}`");
        }
        // The H200: 16 blocks a cluster, 14 such clusters resident.
        let h200 = ClusterRoom { blocks: 16, clusters: 14 };
        let cluster = |len, room| attention_tc_cluster(len, 64, 8, room, 8);
        assert_eq!(cluster(2048, h200), Some(16), "the Llama shape at 2048 rows: a tile a warp");
        assert_eq!(cluster(1024, h200), Some(8), "config (b): 1024 rows");
        assert_eq!(cluster(1025, h200), Some(9), "a row past 8 blocks' tiles");
        assert_eq!(cluster(100, h200), Some(1), "one block: no merge");
        assert_eq!(cluster(8192, h200), Some(16), "8 192 rows: 4 tiles a warp");
        assert_eq!(cluster(16_384, h200), Some(16), "16 384 rows: 8 tiles a warp");
        assert_eq!(cluster(16_385, h200), None, "a row past 8 tiles a warp");
        assert_eq!(attention_tc_cluster(4096, 64, 8, h200, 1), None, "2 tiles a warp, 1 allowed");
        assert_eq!(attention_tc_cluster(2048, 64, 15, h200, 8), None, "more clusters than the device holds");
        assert_eq!(attention_tc_cluster(1024, 128, 8, h200, 8), None, "heads of 128: the ticket merge");
        let portable = ClusterRoom { blocks: 8, ..h200 };
        assert_eq!(cluster(2048, portable), Some(8), "clusters of 8: two tiles a warp");
        assert_eq!(attention_tc_cluster(2048, 64, 8, portable, 1), None, "clusters of 8, a tile a warp");
        let large = ClusterRoom { blocks: 32, ..h200 };
        assert_eq!(cluster(2048, large), Some(16), "at most the merge's 16");
        assert_eq!(cluster(1024, ClusterRoom::default()), None, "no clusters on the device");
        assert_eq!(cluster(1024, ClusterRoom { blocks: 1, ..h200 }), None, "clusters of one block");
        // A clustered block holds its warps' maxima, sums and outputs (8 warps: 512 B, then 8 KiB a head),
        // then its partial (264 B a head), and none of the ticket merge's scratch: (b)'s one head a block takes
        // 2.8 KiB, where a block of the ticket merge takes 6.5 KiB.
        let shared = |hpb, cluster| attention_shared(true, hpb, 64, ATTN_CLUSTER_THREADS, cluster);
        assert_eq!(shared(1, true), 512 + 2048 + 264, "one head a block");
        assert_eq!(shared(4, true), 512 + 4 * 2048 + 4 * 264, "four heads a block");
        assert_eq!(shared(1, false), 6656, "the ticket merge's block");
    }

    /// A staged launch of more groups than a wave has at most a wave of blocks (the H200: 132 SMs, 396), as
    /// few as take the same most groups each; any other launch a block a group; the wave matches the source's
    /// launch bound.
    #[test]
    fn staged_gemvs_take_at_most_a_wave_of_blocks() {
        assert_launch_bound("GEMV_BLOCKS_PER_SM", GEMV_BLOCKS_PER_SM, gemv_wave, 396);
        assert_eq!(gemv_blocks(2048, true, 396), 342, "the Llama shape's gate/up: 6 groups each");
        assert_eq!(gemv_blocks(128_256_u32.div_ceil(GEMV_WARPS), true, 396), 392, "its vocabulary: 41 each");
        assert_eq!(gemv_blocks(792, true, 396), 396, "two groups each");
        assert_eq!(gemv_blocks(397, true, 396), 199, "one more than a wave: two each");
        assert_eq!(gemv_blocks(384, true, 396), 384, "its Q/K/V: less than a wave");
        assert_eq!(gemv_blocks(2048, false, 396), 2048, "not staged");
        assert_eq!(gemv_blocks(2048, true, 0), 2048, "a sweep's no limit");
    }

    /// A launch whose blocks take several groups runs `_waves`; a staged launch of at most two blocks an SM
    /// (the H200: 264) `_deep`; any other a block a group. The rule's constant matches the source's bound.
    #[test]
    fn gemv_launches_pick_their_entry_by_blocks_and_staging() {
        assert_launch_bound("GEMV_DEEP_BLOCKS_PER_SM", GEMV_DEEP_BLOCKS_PER_SM, gemv_deep_wave, 264);
        assert!(SOURCE.contains(&format!("#define GEMV_PRE {GEMV_PRE}\n")));
        let entry =
            |groups, blocks, rows, staged, loads| gemv_entry(groups, blocks, rows, staged, loads, 264);
        assert_eq!(entry(2048, 342, 1, true, 8), GemvEntry::Waves, "the Llama shape's gate/up");
        assert_eq!(entry(256, 256, 1, true, 32), GemvEntry::Deep, "its down projection");
        assert_eq!(entry(256, 256, 1, true, 8), GemvEntry::Deep, "its output projection");
        assert_eq!(entry(384, 384, 1, true, 8), GemvEntry::Group, "its Q/K/V: three blocks an SM");
        assert_eq!(
            entry(192, 192, 1, true, 2),
            GemvEntry::Group,
            "config (b)'s Q/K/V: rows of 2 loads a lane"
        );
        assert_eq!(entry(192, 192, 1, false, 8), GemvEntry::Group, "not staged");
        assert_eq!(entry(192, 192, 2, true, 8), GemvEntry::Group, "two rows: 384 blocks");
        assert_eq!(gemv_entry(256, 256, 1, true, 8, 0), GemvEntry::Group, "a sweep's never");
    }
}
