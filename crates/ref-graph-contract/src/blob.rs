//! Reading a blob for an executor of reference graphs, and whether it can take one.

use blob_format::model::{Format, PayloadKind};
use blob_format::Blob;
use delegate_abi::Compatibility;
use ref_graph::{Graph, PAYLOAD_MAGIC, PAYLOAD_VERSION_MAJOR};

use crate::Error;

/// The native wire-format versions every executor of reference graphs reads.
pub const WIRE_FORMAT_VERSIONS: &str = ">=1.0, <2";

/// Why a blob's header does not fit an executor of reference graphs that serves `backend`, or `None` when it
/// does; `delegate` names the executor in the reason ("the reference delegate"), so every executor of this
/// payload refuses blobs for the same reasons, in the same words.
pub fn header_mismatch(blob: &Blob<'_>, backend: &str, delegate: &str) -> Option<String> {
    if !matches!(blob.format, Format::Native { major: 1, .. }) {
        return Some(format!(
            "{delegate} reads native {WIRE_FORMAT_VERSIONS} blobs, this one is {}",
            blob.format
        ));
    }
    if blob.header.backend_id != backend {
        return Some(format!("the blob is for backend '{}', not '{backend}'", blob.header.backend_id));
    }
    if blob.header.payload_kind != PayloadKind::ReferenceGraph {
        return Some(format!(
            "the blob's payload is '{}', not '{}'",
            blob.header.payload_kind,
            PayloadKind::ReferenceGraph
        ));
    }
    None
}

/// Reads a blob for an executor of reference graphs that serves `backend` (named `delegate` in reasons): the
/// blob parsed, its header fit for it ([`header_mismatch`], else [`Error::Incompatible`]), its payload verified
/// and decoded into a valid graph.
pub fn read_blob<'a>(bytes: &'a [u8], backend: &str, delegate: &str) -> Result<(Blob<'a>, Graph), Error> {
    let blob = Blob::parse(bytes)?;
    if let Some(reason) = header_mismatch(&blob, backend, delegate) {
        return Err(Error::Incompatible(reason));
    }
    blob.verify_payload()?;
    let graph = Graph::decode(blob.engine)?;
    Ok((blob, graph))
}

/// Whether an executor of reference graphs that serves `backend` (named `delegate` in reasons) can take
/// `blob`: a native blob for that backend ([`header_mismatch`]), then the executor's own `refuse` reason if it
/// has one, then the payload's major version ([`payload_compatibility`]).
pub fn blob_compatibility(
    blob: &[u8],
    backend: &str,
    delegate: &str,
    refuse: impl FnOnce(&Blob<'_>) -> Option<String>,
) -> Compatibility {
    let parsed = match Blob::parse(blob) {
        Ok(parsed) => parsed,
        Err(err) => return Compatibility::Unsupported { reason: err.to_string() },
    };
    if let Some(reason) = header_mismatch(&parsed, backend, delegate).or_else(|| refuse(&parsed)) {
        return Compatibility::Unsupported { reason };
    }
    payload_compatibility(parsed.engine)
}

/// Whether `payload` is a reference graph of a major version this build reads, from its first six bytes.
pub fn payload_compatibility(payload: &[u8]) -> Compatibility {
    match payload.get(..6) {
        Some([a, b, c, d, lo, hi]) if [*a, *b, *c, *d] == PAYLOAD_MAGIC => {
            let major = u16::from_le_bytes([*lo, *hi]);
            if major == PAYLOAD_VERSION_MAJOR {
                Compatibility::Supported
            } else {
                Compatibility::Unsupported {
                    reason: format!(
                        "reference-graph payload version {major}.x; this build reads {PAYLOAD_VERSION_MAJOR}.x"
                    ),
                }
            }
        }
        _ => Compatibility::Unsupported { reason: "the payload is not a reference graph".to_owned() },
    }
}
