//! [`pack_file`]: a spec and its constants file on disk to a blob on disk, the weights never in memory.
//!
//! The graph is read from the description alone, each constant kept as its extent in the constants file
//! ([`Graph::from_description_extents`], checked against the file's length); the blob is then written by
//! [`blob_format::native::write_streamed`], header first, the payload's constants copied from the file a
//! chunk at a time ([`Graph::write_payload`]). The file is read twice (to checksum the payload for the
//! header, then to write it), both times through the descriptor opened when the spec was read; a file
//! truncated or rewritten in between is an error and no blob is left. The constants file is not memory-mapped:
//! a mapping's pages count as the packer's resident memory once read, and a file truncated while mapped
//! kills the process with `SIGBUS` (`host-runtime`'s `blob_file` says the same for the host).

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use blob_format::model::Header;
use ref_graph::{Extent, Graph, StreamError};

use crate::{description, spec_header, Error, Spec};

/// Reads `spec_path` (and the constants file it names), packs, and writes the blob to `out`: the same bytes
/// as [`pack`](crate::pack), with the constants copied from their file into `out` a chunk at a time, never
/// held in memory. On an error no blob is left at `out`.
pub fn pack_file(spec_path: &Path, out: &Path) -> Result<Header, Error> {
    let packing = Packing::open(spec_path)?;
    packing.write(out)?;
    Ok(packing.header)
}

/// A spec read and checked, its header decided, its constants still in their file.
pub(crate) struct Packing {
    pub(crate) header: Header,
    graph: Graph<Extent>,
    /// The constants file (its path and the descriptor the graph was checked against), if the spec names one.
    constants: Option<(PathBuf, File)>,
}

impl Packing {
    /// Reads and checks the spec at `spec_path` and opens the constants file it names.
    pub(crate) fn open(spec_path: &Path) -> Result<Packing, Error> {
        let text =
            std::fs::read(spec_path).map_err(|source| Error::Io { path: spec_path.to_owned(), source })?;
        let spec: Spec = serde_json::from_slice(&text)
            .map_err(|source| Error::Spec { path: spec_path.to_owned(), source })?;
        let description = description(&spec)?;
        let constants = match &spec.constants_file {
            Some(file) => Some(open_constants(&spec_path.parent().unwrap_or(Path::new(".")).join(file))?),
            None => None,
        };
        let section_len = constants.as_ref().map_or(0, |(_, _, len)| *len);
        let graph = Graph::from_description_extents(&description, section_len)?;
        let header = spec_header(&spec, &graph)?;
        Ok(Packing { header, graph, constants: constants.map(|(path, file, _)| (path, file)) })
    }

    /// Writes the blob to `out`, removing what was written if it fails.
    pub(crate) fn write(&self, out: &Path) -> Result<(), Error> {
        let written = self.write_into(out);
        if written.is_err() {
            // Best effort: the error being reported says what went wrong; a half-written blob must not stay.
            let _ = std::fs::remove_file(out);
        }
        written
    }

    fn write_into(&self, out: &Path) -> Result<(), Error> {
        let io = |source| Error::Io { path: out.to_owned(), source };
        let mut file = BufWriter::new(File::create(out).map_err(io)?);
        let streamed = match &self.constants {
            Some((_, constants)) => self.write_blob(&mut &*constants, &mut file),
            None => self.write_blob(&mut io::empty(), &mut file),
        };
        streamed.map_err(|err| match err {
            StreamError::Write(source) => io(source),
            err => Error::Constants { path: self.constants_path(), source: err },
        })?;
        file.flush().map_err(io)
    }

    /// The constants file's path (no constant is read without one).
    fn constants_path(&self) -> PathBuf {
        self.constants.as_ref().map_or_else(|| PathBuf::from("(no constants_file)"), |(path, _)| path.clone())
    }

    fn write_blob<R: io::Read + io::Seek>(
        &self,
        section: &mut R,
        out: &mut impl Write,
    ) -> Result<(), StreamError> {
        blob_format::native::write_streamed(&self.header, |sink| self.graph.write_payload(section, sink), out)
    }
}

/// The constants file at `path`, opened for the whole packing, with its length.
fn open_constants(path: &Path) -> Result<(PathBuf, File, u64), Error> {
    let io = |source| Error::Io { path: path.to_owned(), source };
    let file = File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    Ok((path.to_owned(), file, len))
}

#[cfg(test)]
mod tests {
    use ref_graph::{ElemType, GraphBuilder};
    use serde_json::json;

    use super::*;

    /// A spec (and its constants file) in `dir` for a graph of one 64-byte constant.
    fn spec_in(dir: &Path) -> PathBuf {
        let mut b = GraphBuilder::new();
        let tokens = b.input("tokens", ElemType::I64, &[1]).expect("fresh");
        let emb = b.constant_f32("emb", &[8, 2], (0..16).map(|i| i as f32).collect()).expect("sized");
        let row = b.gather("row", emb, tokens).expect("typed");
        b.output(row).expect("declared");
        let payload = b.finish().expect("valid").encode();
        let json_len = u32::from_le_bytes(payload[8..12].try_into().expect("4 bytes")) as usize;
        let description: serde_json::Value =
            serde_json::from_slice(&payload[16..16 + json_len]).expect("json");
        std::fs::write(dir.join("c.bin"), &payload[(16 + json_len).div_ceil(16) * 16..]).expect("written");
        let spec = json!({
            "backend": "ReferenceBackend", "graph": description, "constants_file": "c.bin",
            "bindings": [{"name": "tokens", "role": "input"}, {"name": "row", "role": "output"}],
            "producer": {"name": "packing tests", "version": "1"},
        });
        std::fs::write(dir.join("spec.json"), spec.to_string()).expect("written");
        dir.join("spec.json")
    }

    /// The constants are read when the blob is written, after the spec was checked against the file's
    /// length: a file cut in between is an error naming it and the constant, and no blob is left behind.
    #[test]
    fn a_constants_file_cut_after_the_spec_was_checked_is_an_error_and_leaves_no_blob() {
        let dir = tempfile::tempdir().expect("tempdir");
        let packing = Packing::open(&spec_in(dir.path())).expect("a valid spec");
        let constants = dir.path().join("c.bin");
        std::fs::OpenOptions::new().write(true).open(&constants).expect("opens").set_len(40).expect("cut");
        let out = dir.path().join("out.blob");
        let err = packing.write(&out).expect_err("the constants end early");
        let message = err.to_string();
        assert!(
            message.starts_with(&format!("{}: reading constant 'emb'", constants.display())),
            "{message}"
        );
        assert_eq!(et_error::HasErrorCode::error_code(&err), et_error::ErrorCode::AccessFailed);
        assert!(!out.exists(), "a half-written blob stayed");
    }

    /// A constants file replaced (a new file renamed over it) after the spec was checked does not reach
    /// the blob: the packer reads the file it opened and checked.
    #[test]
    fn a_constants_file_replaced_after_the_spec_was_checked_is_not_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spec = spec_in(dir.path());
        let original = std::fs::read(dir.path().join("c.bin")).expect("read");
        let packing = Packing::open(&spec).expect("a valid spec");
        std::fs::write(dir.path().join("other.bin"), vec![0xff; original.len()]).expect("written");
        std::fs::rename(dir.path().join("other.bin"), dir.path().join("c.bin")).expect("replaced");
        let out = dir.path().join("out.blob");
        packing.write(&out).expect("written");
        std::fs::write(dir.path().join("c.bin"), &original).expect("restored");
        let again = dir.path().join("again.blob");
        pack_file(&spec, &again).expect("packs");
        let read = |path: &Path| std::fs::read(path).expect("read");
        assert!(read(&out) == read(&again), "the replacement was read");
    }
}
