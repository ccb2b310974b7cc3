//! A hollow exported graph (`.rgd`, written by `python -m kv_delegate.export_bench`): the reference-graph payload
//! of an exported program without its constant section, filled here from a seed.
//!
//! The file is JSON: `format`, `shape` (the model's sizes), `made_by`, `outside`, `bindings`, `description` (the
//! payload's JSON description, its constants at the offsets the lowering gave them) and `kept` (`{constant: hex
//! of its bytes}`: the constants of at most 64 KiB, which keep their exported values: norm weights, biases,
//! `inv_freq`, the lowering's scalars). [`Hollow::fill`] lays out a constant section under the description's
//! offsets, copies the kept constants in and fills every other one by its name and rank, as transformers
//! initialises a model: a matrix or embedding (rank 2 and more) from normal(0, 0.02) (its `initializer_range`),
//! a vector named `*bias` with zeros, any other vector (a norm weight) with ones. Each constant's values are a
//! function of the seed and its place in the description alone (SplitMix64, Box-Muller), so a fill is the same
//! on every machine and in any order; constants are filled on every core. The values do not matter for timing;
//! they are finite and keep the logits small.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use et_error::{ErrorCode, HasErrorCode};
use ref_graph::{ElemType, Graph, TensorDecl};
use serde::Deserialize;

/// The `format` this reader takes.
pub const FORMAT: &str = "kv-delegate hollow graph 1";
/// The standard deviation of a filled matrix (transformers' default `initializer_range`).
pub const STD: f32 = 0.02;

/// What can be wrong with a hollow graph file; each says which file and what.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The file cannot be read.
    #[error("{path}: cannot read the hollow graph: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    /// The file is not a hollow graph's JSON.
    #[error("{path}: not a hollow graph (kv_delegate.export_bench's JSON): {source}")]
    Json { path: PathBuf, source: serde_json::Error },
    /// The file is of another format or version.
    #[error("{path}: format {found:?}; this reader takes {FORMAT:?}")]
    Format { path: PathBuf, found: String },
    /// A constant of the description is not a declared tensor, or its size disagrees with its declaration.
    #[error("{path}: constant '{name}': {what}")]
    Constant { path: PathBuf, name: String, what: String },
    /// The filled graph is not a valid reference graph.
    #[error("{path}: the filled graph is refused: {source}")]
    Graph { path: PathBuf, source: ref_graph::Error },
}

impl HasErrorCode for Error {
    fn error_code(&self) -> ErrorCode {
        match self {
            Error::Read { .. } => ErrorCode::AccessFailed,
            Error::Json { .. } | Error::Format { .. } | Error::Constant { .. } | Error::Graph { .. } => {
                ErrorCode::InvalidProgram
            }
        }
    }
}

/// The model's sizes as the exporter wrote them (`bench_hf_decode`'s JSON keys).
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
pub struct Shape {
    /// The sizes both decode benches report (`support::report::json`).
    #[serde(flatten)]
    pub sizes: Sizes,
    /// The checkpoint it was exported from.
    pub model: String,
    /// Its parameter count, as the exporter counted it.
    pub parameters: u64,
}

/// A model's sizes: what a hollow graph's `shape` holds and what both decode benches describe the graph they
/// time by (`support::report::Sizes`).
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
pub struct Sizes {
    pub name: String,
    pub layers: u64,
    pub dim: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub ffn: u64,
    pub vocab: u64,
    pub max_len: u64,
    pub dtype: String,
    pub tied: bool,
    /// Q, K and V projections with biases (Qwen2).
    pub bias: bool,
}

#[derive(Deserialize)]
struct File {
    format: String,
    shape: Shape,
    made_by: BTreeMap<String, String>,
    description: serde_json::Value,
    #[serde(default)]
    kept: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct Description {
    tensors: Vec<TensorDecl>,
    constants: Vec<ConstantRef>,
    ops: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
struct ConstantRef {
    tensor: String,
    offset: u64,
    nbytes: u64,
}

/// One constant to lay out: where, its declaration, and its kept bytes if the file has them.
struct Slot {
    offset: usize,
    decl: TensorDecl,
    kept: Option<Vec<u8>>,
}

/// A hollow graph read from its file.
pub struct Hollow {
    path: PathBuf,
    /// The model's sizes.
    pub shape: Shape,
    /// The versions that exported it (torch, executorch, transformers).
    pub made_by: BTreeMap<String, String>,
    /// The description's ops, by op name.
    pub op_counts: BTreeMap<String, usize>,
    description: Vec<u8>,
    slots: Vec<Slot>,
    section: usize,
}

impl Hollow {
    /// Reads and checks `path`: format, every constant a declared tensor of its size, kept bytes of that size.
    pub fn read(path: &Path) -> Result<Hollow, Error> {
        let text = std::fs::read(path).map_err(|source| Error::Read { path: path.to_path_buf(), source })?;
        Hollow::parse(&text, path)
    }

    /// [`Hollow::read`] of a file's bytes `text`, named `path` in errors.
    pub fn parse(text: &[u8], path: &Path) -> Result<Hollow, Error> {
        let at = || path.to_path_buf();
        let file: File = serde_json::from_slice(text).map_err(|source| Error::Json { path: at(), source })?;
        if file.format != FORMAT {
            return Err(Error::Format { path: at(), found: file.format });
        }
        let description = serde_json::to_vec(&file.description).expect("a JSON value always serializes");
        let parsed: Description =
            serde_json::from_value(file.description).map_err(|source| Error::Json { path: at(), source })?;
        let mut op_counts = BTreeMap::new();
        for op in &parsed.ops {
            *op_counts.entry(op["op"].as_str().unwrap_or("?").to_owned()).or_insert(0) += 1;
        }
        let decls: BTreeMap<&str, &TensorDecl> =
            parsed.tensors.iter().map(|t| (t.name.as_str(), t)).collect();
        let mut kept = file.kept;
        let mut slots = Vec::with_capacity(parsed.constants.len());
        let mut section = 0usize;
        for c in &parsed.constants {
            let bad = |what: String| Error::Constant { path: at(), name: c.tensor.clone(), what };
            let decl = decls.get(c.tensor.as_str()).ok_or_else(|| bad("not a declared tensor".into()))?;
            let nbytes = decl.shape.iter().product::<u64>() * decl.dtype.size_bytes() as u64;
            if nbytes != c.nbytes {
                return Err(bad(format!(
                    "{} bytes, but {:?} {:?} is {nbytes}",
                    c.nbytes, decl.dtype, decl.shape
                )));
            }
            let kept = kept.remove(&c.tensor).map(|hex| decode_hex(&hex)).transpose().map_err(bad)?;
            if let Some(bytes) = &kept {
                if bytes.len() as u64 != nbytes {
                    return Err(bad(format!("{} kept bytes, but it is {nbytes}", bytes.len())));
                }
            }
            let end = c.offset.checked_add(nbytes).and_then(|end| usize::try_from(end).ok());
            section = section.max(end.ok_or_else(|| bad(format!("offset {} is out of range", c.offset)))?);
            slots.push(Slot { offset: c.offset as usize, decl: (*decl).clone(), kept });
        }
        if let Some(name) = kept.into_keys().next() {
            let what = "kept bytes for a tensor that is not a constant of the description".to_owned();
            return Err(Error::Constant { path: at(), name, what });
        }
        slots.sort_by_key(|s| s.offset);
        for pair in slots.windows(2) {
            if pair[0].offset + pair[0].decl.numel() * pair[0].decl.dtype.size_bytes() > pair[1].offset {
                let what = format!("overlaps '{}'", pair[1].decl.name);
                return Err(Error::Constant { path: at(), name: pair[0].decl.name.clone(), what });
            }
        }
        Ok(Hollow {
            path: at(),
            shape: file.shape,
            made_by: file.made_by,
            op_counts,
            description,
            slots,
            section,
        })
    }

    /// How many constants the file keeps the bytes of, and how many [`Hollow::fill`] draws.
    pub fn kept_and_filled(&self) -> (usize, usize) {
        let kept = self.slots.iter().filter(|s| s.kept.is_some()).count();
        (kept, self.slots.len() - kept)
    }

    /// The graph with its constants filled from `seed` (module docs), validated as a payload's graph is.
    pub fn fill(&self, seed: u64) -> Result<Graph, Error> {
        let mut section = vec![0u8; self.section];
        let mut rest: &mut [u8] = &mut section;
        let mut base = 0usize;
        let mut jobs: Vec<(usize, &Slot, &mut [u8])> = Vec::with_capacity(self.slots.len());
        for (index, slot) in self.slots.iter().enumerate() {
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(slot.offset - base);
            let (bytes, tail) = tail.split_at_mut(slot.decl.numel() * slot.decl.dtype.size_bytes());
            jobs.push((index, slot, bytes));
            rest = tail;
            base = slot.offset + bytes_len(slot);
        }
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut shares: Vec<Vec<(usize, &Slot, &mut [u8])>> = (0..threads).map(|_| Vec::new()).collect();
        let mut loads = vec![0usize; threads];
        jobs.sort_by_key(|(_, slot, _)| std::cmp::Reverse(bytes_len(slot)));
        for job in jobs {
            let least = (0..threads).min_by_key(|&t| loads[t]).expect("at least one thread");
            loads[least] += bytes_len(job.1);
            shares[least].push(job);
        }
        std::thread::scope(|scope| {
            for share in shares {
                scope.spawn(move || {
                    for (index, slot, bytes) in share {
                        fill_one(slot, bytes, seed ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
                    }
                });
            }
        });
        Graph::from_description(&self.description, &section)
            .map_err(|source| Error::Graph { path: self.path.clone(), source })
    }
}

fn bytes_len(slot: &Slot) -> usize {
    slot.decl.numel() * slot.decl.dtype.size_bytes()
}

/// One constant's bytes: kept, else by the rule of the module docs.
fn fill_one(slot: &Slot, bytes: &mut [u8], seed: u64) {
    if let Some(kept) = &slot.kept {
        bytes.copy_from_slice(kept);
        return;
    }
    let dtype = slot.decl.dtype;
    if slot.decl.shape.len() < 2 {
        let value = if slot.decl.name.ends_with("bias") { 0.0 } else { 1.0 };
        for chunk in bytes.chunks_exact_mut(dtype.size_bytes()) {
            put(dtype, chunk, value);
        }
        return;
    }
    let mut normal = Normal::new(seed);
    for chunk in bytes.chunks_exact_mut(dtype.size_bytes()) {
        put(dtype, chunk, normal.next() * STD);
    }
}

/// `value` as one element of `dtype`, little-endian (an `i64` constant is filled with zeros).
fn put(dtype: ElemType, chunk: &mut [u8], value: f32) {
    match dtype {
        ElemType::F32 => chunk.copy_from_slice(&value.to_le_bytes()),
        ElemType::F16 => chunk.copy_from_slice(&ref_graph::half::f16::from_f32(value).to_le_bytes()),
        ElemType::Bf16 => chunk.copy_from_slice(&ref_graph::half::bf16::from_f32(value).to_le_bytes()),
        _ => chunk.fill(0),
    }
}

/// Standard normal draws: SplitMix64 uniforms through Box-Muller, two a pair.
struct Normal {
    state: u64,
    spare: Option<f32>,
}

impl Normal {
    fn new(seed: u64) -> Normal {
        Normal { state: seed, spare: None }
    }

    /// A uniform in `(0, 1]`.
    fn uniform(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        ((z >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    fn next(&mut self) -> f32 {
        if let Some(spare) = self.spare.take() {
            return spare;
        }
        let radius = (-2.0 * self.uniform().ln()).sqrt();
        let angle = std::f64::consts::TAU * self.uniform();
        self.spare = Some((radius * angle.sin()) as f32);
        (radius * angle.cos()) as f32
    }
}

fn decode_hex(hex: &str) -> Result<Vec<u8>, String> {
    let digit = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let digits = hex.as_bytes();
    if digits.len() % 2 != 0 {
        return Err(format!("kept bytes: {} hex digits, an odd count", digits.len()));
    }
    digits
        .chunks_exact(2)
        .enumerate()
        .map(|(i, pair)| {
            let byte = digit(pair[0]).zip(digit(pair[1])).map(|(high, low)| high << 4 | low);
            byte.ok_or_else(|| format!("kept bytes: not hex at byte {i}"))
        })
        .collect()
}
