//! The model's hyper-parameters.

use et_error::{ErrorCode, HasErrorCode};
use ref_graph::ElemType;

/// Hyper-parameters of the example decoder, plus the prompt, the weight seed and the float type.
///
/// The model dimension is `heads * head_dim`; caches are `[heads, max_len, head_dim]` of [`Config::dtype`]
/// per layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Vocabulary size (rows of the token embedding, columns of the logits).
    pub vocab: usize,
    /// Attention heads.
    pub heads: usize,
    /// Size of one head.
    pub head_dim: usize,
    /// Maximum sequence length: cache rows and position-embedding rows.
    pub max_len: usize,
    /// Decoder layers.
    pub layers: usize,
    /// The prompt prefill runs over; its length is the prefill blob's static row count.
    pub prompt: Vec<i64>,
    /// Seed of the deterministic weights.
    pub seed: u64,
    /// The float type of the exported graph: every weight (rounded to nearest even from the generated `f32`
    /// weights), cache, activation and the logits. [`ElemType::F32`] or [`ElemType::F16`].
    pub dtype: ElemType,
}

/// The benchmark configurations of the GPU path (issue 8), see [`Config::bench`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BenchConfig {
    /// (a) upstream's model, [`Config::tiny`]: 1 layer, 2 heads x 16, max length 16, f32.
    A,
    /// (b) 8 layers, 8 heads x 64, max length 1024, f16, vocab 512, a 16-token prompt (16 MiB of cache).
    B,
    /// (c) 32 layers, 8 heads x 128, max length 8192, f16, vocab 1024, a 16-token prompt (1 GiB of cache).
    C,
}

impl BenchConfig {
    /// Every benchmark configuration.
    pub const ALL: [BenchConfig; 3] = [BenchConfig::A, BenchConfig::B, BenchConfig::C];

    /// `"a"`, `"b"` or `"c"`.
    pub const fn name(self) -> &'static str {
        match self {
            BenchConfig::A => "a",
            BenchConfig::B => "b",
            BenchConfig::C => "c",
        }
    }

    /// Parses a [`BenchConfig::name`] (case-insensitive).
    pub fn from_name(name: &str) -> Option<BenchConfig> {
        Self::ALL.into_iter().find(|c| c.name().eq_ignore_ascii_case(name))
    }
}

/// Why a [`Config`] cannot describe a model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A size is zero.
    #[error("config field '{field}' must be at least 1")]
    Zero {
        /// The field.
        field: &'static str,
    },
    /// The prompt is empty or longer than the cache.
    #[error("the prompt has {len} tokens; it needs 1 to {max_len} (max_len)")]
    PromptLength {
        /// Prompt length.
        len: usize,
        /// The cache length.
        max_len: usize,
    },
    /// The float type is not a float type.
    #[error("config field 'dtype' is {dtype}; the example computes in f32 or f16")]
    DType {
        /// The type given.
        dtype: ElemType,
    },
    /// A prompt token is outside the vocabulary.
    #[error("prompt token {token} at index {index} is outside the vocabulary of {vocab}")]
    PromptToken {
        /// Index in the prompt.
        index: usize,
        /// The token.
        token: i64,
        /// Vocabulary size.
        vocab: usize,
    },
}

impl HasErrorCode for ConfigError {
    fn error_code(&self) -> ErrorCode {
        ErrorCode::InvalidArgument
    }
}

impl Config {
    /// Upstream's test model (UPSTREAM.md section 6): vocab 64, 2 heads x 16 (dim 32), max length 16, one
    /// layer, a 4-token prompt.
    pub fn tiny() -> Config {
        Config {
            vocab: 64,
            heads: 2,
            head_dim: 16,
            max_len: 16,
            layers: 1,
            prompt: vec![1, 7, 3, 12],
            seed: 0x6b76_0001,
            dtype: ElemType::F32,
        }
    }

    /// A bigger model for benchmarks: vocab 256, 8 layers, 8 heads x 64 (dim 512), max length 1024, a
    /// 16-token prompt.
    pub fn big() -> Config {
        Config {
            vocab: 256,
            heads: 8,
            head_dim: 64,
            max_len: 1024,
            layers: 8,
            prompt: (0..16).map(|i| (i * 37 + 5) % 256).collect(),
            seed: 0x6b76_0002,
            dtype: ElemType::F32,
        }
    }

    /// The benchmark configuration `which`: (a) is [`Config::tiny`]; (b) and (c) are f16 models with a
    /// 16-token prompt `(i * 37 + 5) % vocab` and seeds of their own.
    ///
    /// ```
    /// use kv_example::{BenchConfig, Config};
    /// use ref_graph::ElemType;
    ///
    /// assert_eq!(Config::bench(BenchConfig::A), Config::tiny());
    /// let c = Config::bench(BenchConfig::C);
    /// assert_eq!((c.layers, c.heads, c.head_dim, c.max_len, c.vocab), (32, 8, 128, 8192, 1024));
    /// assert_eq!(c.dtype, ElemType::F16);
    /// // Every layer's K and V cache, in bytes: 1 GiB.
    /// assert_eq!(2 * c.layers * c.cache_len() * 2, 1 << 30);
    /// ```
    pub fn bench(which: BenchConfig) -> Config {
        let f16 = |vocab: usize, heads, head_dim, max_len, layers, seed| Config {
            vocab,
            heads,
            head_dim,
            max_len,
            layers,
            prompt: (0..16).map(|i| (i * 37 + 5) % vocab as i64).collect(),
            seed,
            dtype: ElemType::F16,
        };
        match which {
            BenchConfig::A => Config::tiny(),
            BenchConfig::B => f16(512, 8, 64, 1024, 8, 0x6b76_000b),
            BenchConfig::C => f16(1024, 8, 128, 8192, 32, 0x6b76_000c),
        }
    }

    /// The model dimension, `heads * head_dim`.
    pub fn dim(&self) -> usize {
        self.heads * self.head_dim
    }

    /// The prompt length (prefill's row count).
    pub fn prompt_len(&self) -> usize {
        self.prompt.len()
    }

    /// Most decode steps that fit after prefill: `max_len - prompt_len` (12 for [`Config::tiny`]: the prompt
    /// takes positions 0..4 and decode fills 4..16).
    pub fn max_decode_steps(&self) -> usize {
        self.max_len.saturating_sub(self.prompt.len())
    }

    /// Shape of one cache, `[heads, max_len, head_dim]`.
    pub fn cache_shape(&self) -> [usize; 3] {
        [self.heads, self.max_len, self.head_dim]
    }

    /// Elements in one cache.
    pub fn cache_len(&self) -> usize {
        self.heads * self.max_len * self.head_dim
    }

    /// Checks that the config describes a model.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (field, value) in [
            ("vocab", self.vocab),
            ("heads", self.heads),
            ("head_dim", self.head_dim),
            ("max_len", self.max_len),
            ("layers", self.layers),
        ] {
            if value == 0 {
                return Err(ConfigError::Zero { field });
            }
        }
        if !self.dtype.is_float() {
            return Err(ConfigError::DType { dtype: self.dtype });
        }
        if self.prompt.is_empty() || self.prompt.len() > self.max_len {
            return Err(ConfigError::PromptLength { len: self.prompt.len(), max_len: self.max_len });
        }
        if let Some((index, &token)) = self
            .prompt
            .iter()
            .enumerate()
            .find(|(_, &t)| usize::try_from(t).map_or(true, |t| t >= self.vocab))
        {
            return Err(ConfigError::PromptToken { index, token, vocab: self.vocab });
        }
        Ok(())
    }
}
