//! What a program loaded from something other than its manifest's files brings along (a `.pte` program,
//! see [`crate::pte`]): its calls' blobs, borrowed from one mapped file, and the copies the host makes
//! between a method's storages.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use crate::blob_file::BlobFile;

/// Where a call's blob bytes are: its own mapped file (a manifest's call), or a range of a mapped file
/// other calls share (a delegate payload inside a `.pte`), borrowed, never copied.
pub(crate) enum BlobBytes {
    /// The call's own blob file.
    File(BlobFile),
    /// Bytes `range` of a shared file.
    Shared {
        /// The mapped file.
        file: Arc<BlobFile>,
        /// The blob's extent in it (checked by the caller to lie inside it).
        range: Range<usize>,
    },
}

impl BlobBytes {
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            BlobBytes::File(file) => file.bytes(),
            BlobBytes::Shared { file, range } => file.bytes().get(range.clone()).unwrap_or_default(),
        }
    }
}

/// Where a host copy reads or writes: a method's user input or output, or a program buffer (indices into
/// the manifest's declarations, in order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CopySlot {
    /// A user input of the method.
    Input(usize),
    /// A user output of the method.
    Output(usize),
    /// A program buffer.
    Buffer(usize),
}

/// A copy the host makes between a method's storages: the trivial operators of a `.pte` program
/// (see [`crate::pte`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HostCopy {
    /// Runs after this delegate call of the method; `None`: before the first.
    pub(crate) after: Option<usize>,
    /// The storage read.
    pub(crate) from: CopySlot,
    /// The storage written: the same size, memory kind and dtype.
    pub(crate) to: CopySlot,
}

/// What [`super::Program::load_attached`] takes besides the manifest: blobs keyed by (method, call index),
/// used instead of the call's blob path, and host copies per method.
#[derive(Default)]
pub(crate) struct Attached {
    pub(crate) blobs: BTreeMap<(String, usize), BlobBytes>,
    pub(crate) copies: BTreeMap<String, Vec<HostCopy>>,
    /// Where the program came from.
    pub(crate) origin: super::Origin,
}
