//! [`ProgramSpec`]: the manifest file as written, key for key (the crate docs describe every key). Tools that
//! write programs build one and call [`ProgramSpec::to_toml`]; hosts read a checked [`crate::Manifest`].

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::{Error, Location};

/// A whole `program.toml`, as written: names are strings, nothing is resolved or checked beyond the TOML
/// types. [`crate::Manifest::parse`] reads the same text and checks it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProgramSpec {
    /// Manifest format version, [`crate::FORMAT`].
    pub format: u32,
    /// Caller-owned mutable buffers by name, zero-initialised at load.
    #[serde(default)]
    pub buffers: BTreeMap<String, BufferSpec>,
    /// Methods by name.
    pub methods: BTreeMap<String, MethodSpec>,
    /// How a host generates tokens, when the program is a decoder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generate: Option<GenerateSpec>,
}

/// A caller-owned mutable buffer (`[buffers.NAME]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BufferSpec {
    /// Element type, e.g. `"f32"` (a `blob_format::model::DType` name).
    pub dtype: String,
    /// Static extents. TOML integers are signed: a negative extent is refused when the manifest is checked.
    pub shape: Vec<i64>,
    /// Memory kind: `"host"` (the default), `"device"`, `"managed"` or `"pinned"` ([`crate::MemoryKind`]).
    #[serde(default = "host")]
    pub memory: String,
    /// CUDA device ordinal of a device or managed buffer; absent means 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<i64>,
}

fn host() -> String {
    crate::MemoryKind::Host.name().to_owned()
}

/// A user input or output of a method (an entry of `inputs` or `outputs`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorSpec {
    /// Name, referenced by `input:NAME` / `output:NAME`.
    pub name: String,
    /// Element type.
    pub dtype: String,
    /// Static extents.
    pub shape: Vec<i64>,
    /// Memory kind, as for a buffer; absent means `"host"`. A `"device"` token input lets a host generate
    /// without host round trips.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    /// CUDA device ordinal of a device or managed input or output; absent means 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<i64>,
}

/// A method (`[methods.NAME]`): its user inputs and outputs and its ordered delegate calls.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MethodSpec {
    /// User inputs.
    #[serde(default)]
    pub inputs: Vec<TensorSpec>,
    /// User outputs.
    #[serde(default)]
    pub outputs: Vec<TensorSpec>,
    /// Delegate calls, run in order (at least one).
    pub calls: Vec<CallSpec>,
}

/// One delegate call (`[[methods.NAME.calls]]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallSpec {
    /// The blob, relative to the manifest's directory.
    pub blob: String,
    /// The ExecuTorch backend id that runs it.
    pub backend: String,
    /// One `input:NAME` / `output:NAME` / `buffer:NAME` per threaded blob binding, in delegate-argument order
    /// (see [`crate::ArgRef`]).
    pub args: Vec<String>,
}

/// How to generate (`[generate]`): prefill once over the prompt, then decode feeding back the argmax token.
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
    /// An `i64 [1]` output holding the argmax of the last logits row, computed by the delegate (on the
    /// device, for a device-resident program): a host feeds it back without reading the logits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_token_output: Option<String>,
    /// How many positions the caches hold (prompt plus decode steps), so a host can refuse a run that would
    /// overflow them before it starts; when absent, a host takes it from the buffers' shapes
    /// (`Manifest::positions_from_buffers`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_positions: Option<u64>,
}

impl GenerateSpec {
    /// Decode steps that fit after the prompt, when the program says how many positions it holds.
    pub fn max_decode_steps(&self) -> Option<usize> {
        self.max_positions
            .map(|max| usize::try_from(max).unwrap_or(usize::MAX).saturating_sub(self.prompt.len()))
    }
}

impl ProgramSpec {
    /// The manifest as TOML text. Fails only for values TOML cannot hold (an integer above `i64::MAX`).
    pub fn to_toml(&self) -> Result<String, Error> {
        toml::to_string(self).map_err(|source| Error::Write { source })
    }

    /// Reads TOML text as written, without the checks of [`crate::Manifest::parse`]; `path` names the text in
    /// errors.
    pub fn parse(path: &Path, text: &str) -> Result<ProgramSpec, Error> {
        toml::from_str(text).map_err(|err| Error::Invalid {
            path: path.to_owned(),
            location: err.span().map(|s| Location::of_offset(text, s.start)).unwrap_or_default(),
            message: err.message().trim().to_owned(),
        })
    }
}
