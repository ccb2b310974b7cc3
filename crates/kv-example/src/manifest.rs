//! The program manifest (`program.toml`) as serde structs: caller-owned buffers, methods made of delegate
//! calls, and how to generate.
//!
//! ```toml
//! format = 1
//! [buffers.k_cache_0]          # caller-owned mutable buffers, zero-initialised at load
//! dtype = "f32"
//! shape = [2, 16, 16]
//! memory = "host"
//! [methods.decode]
//! inputs = [{ name = "tokens", dtype = "i64", shape = [1] }, { name = "input_pos", dtype = "i64", shape = [1] }]
//! outputs = [{ name = "logits", dtype = "f32", shape = [1, 64] }]
//! [[methods.decode.calls]]
//! blob = "decode.blob"         # relative to the manifest
//! backend = "ReferenceBackend"
//! args = ["input:tokens", "input:input_pos", "buffer:k_cache_0", "buffer:v_cache_0", "buffer:k_cache_0",
//!         "buffer:v_cache_0", "output:logits"]
//! [generate]
//! prefill = "prefill"
//! decode = "decode"
//! prompt = [1, 7, 3, 12]
//! token_input = "tokens"
//! position_input = "input_pos"
//! logits_output = "logits"
//! ```
//!
//! A call's `args` has one entry per threaded blob binding, in delegate-argument order: `input:NAME` (a user
//! input of the method), `output:NAME` (a user output), `buffer:NAME` (a mutable buffer; at an input position
//! the delegate reads and updates it, at an output position it is the buffer-mutation output slot).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The manifest format this crate writes.
pub const FORMAT: u32 = 1;

/// A whole `program.toml`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Manifest format version, [`FORMAT`].
    pub format: u32,
    /// Caller-owned mutable buffers by name, zero-initialised at load.
    #[serde(default)]
    pub buffers: BTreeMap<String, BufferSpec>,
    /// Methods by name.
    pub methods: BTreeMap<String, MethodSpec>,
    /// How `delegate-host run` generates, when the program is a decoder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generate: Option<GenerateSpec>,
}

/// A caller-owned mutable buffer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BufferSpec {
    /// Element type, e.g. `"f32"`.
    pub dtype: String,
    /// Extents.
    pub shape: Vec<u64>,
    /// Memory kind: `"host"`, `"device"`, `"managed"` or `"pinned"`.
    pub memory: String,
}

/// A user input or output of a method.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorSpec {
    /// Name, referenced by `input:NAME` / `output:NAME`.
    pub name: String,
    /// Element type.
    pub dtype: String,
    /// Extents.
    pub shape: Vec<u64>,
}

/// A method: its user inputs and outputs and its ordered delegate calls.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MethodSpec {
    /// User inputs.
    pub inputs: Vec<TensorSpec>,
    /// User outputs.
    pub outputs: Vec<TensorSpec>,
    /// Delegate calls, run in order.
    pub calls: Vec<CallSpec>,
}

/// One delegate call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallSpec {
    /// The blob, relative to the manifest.
    pub blob: String,
    /// The ExecuTorch backend id that runs it.
    pub backend: String,
    /// One `input:`/`output:`/`buffer:` reference per threaded blob binding, in delegate-argument order.
    pub args: Vec<String>,
}

/// How to generate: prefill once over the prompt, then decode feeding back the argmax token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerateSpec {
    /// The prefill method.
    pub prefill: String,
    /// The decode method.
    pub decode: String,
    /// The prompt token ids.
    pub prompt: Vec<i64>,
    /// The input that takes token ids.
    pub token_input: String,
    /// The input that takes the position of the first token.
    pub position_input: String,
    /// The output with the logits.
    pub logits_output: String,
    /// How many positions the caches hold (prompt plus decode steps), so a host can refuse a run that would
    /// overflow them before it starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_positions: Option<u64>,
}

impl Manifest {
    /// The manifest as TOML text.
    pub fn to_toml(&self) -> Result<String, toml::ser::Error> {
        toml::to_string(self)
    }

    /// Parses TOML text.
    pub fn from_toml(text: &str) -> Result<Manifest, toml::de::Error> {
        toml::from_str(text)
    }
}
