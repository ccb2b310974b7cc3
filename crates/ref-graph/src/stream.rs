//! A payload written a constant at a time from a constant section the graph does not hold
//! ([`Graph::write_payload`]): what lets a packer lay out gigabytes of weights with a buffer's worth of memory.

use std::io::{self, Read, Seek, SeekFrom, Write};

use et_error::{ErrorCode, HasErrorCode};

use crate::{Extent, Graph, CONSTANT_ALIGN};

/// The bytes copied from the section to the payload at a time.
const CHUNK: usize = 1 << 20;
/// Padding before a constant: fewer than [`CONSTANT_ALIGN`] zeros.
const ZEROS: [u8; CONSTANT_ALIGN as usize] = [0; CONSTANT_ALIGN as usize];

/// Why [`Graph::write_payload`] stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// A constant could not be read from the section: the section ends before it (it was truncated after
    /// the graph was read), or reading failed.
    #[error(
        "reading constant '{name}' ({nbytes} bytes at offset {offset} of the constant section): {source}"
    )]
    Section {
        /// The constant's tensor.
        name: String,
        /// Its offset in the section.
        offset: u64,
        /// Its length.
        nbytes: u64,
        /// The I/O error (`UnexpectedEof` for a section shorter than when the graph was read).
        #[source]
        source: io::Error,
    },
    /// The payload could not be written.
    #[error("writing the payload: {0}")]
    Write(#[from] io::Error),
}

impl HasErrorCode for StreamError {
    fn error_code(&self) -> ErrorCode {
        ErrorCode::AccessFailed
    }
}

impl Graph<Extent> {
    /// Writes the payload [`Graph::encode`] would write for this graph with its constants' values, copying
    /// each constant from `section` (the constant section its extents point into, from its start) a chunk at
    /// a time: the same bytes, with the constants never held in memory.
    ///
    /// # Errors
    /// [`StreamError::Section`] naming the constant that could not be read (the section is shorter than when
    /// the graph was read from its description, or reading failed); [`StreamError::Write`] for what `out`
    /// returns.
    pub fn write_payload<R, W>(&self, section: &mut R, out: &mut W) -> Result<(), StreamError>
    where
        R: Read + Seek + ?Sized,
        W: Write + ?Sized,
    {
        let layout = self.constant_layout();
        out.write_all(&self.payload_head(&layout))?;
        let mut buffer = vec![0u8; CHUNK];
        let mut written = 0u64;
        for placed in &layout {
            let padding = usize::try_from(placed.offset - written).expect("padding is under CONSTANT_ALIGN");
            out.write_all(&ZEROS[..padding])?;
            let extent = placed.values;
            let failed = |source| StreamError::Section {
                name: self.tensor(placed.id).name.clone(),
                offset: extent.offset,
                nbytes: extent.nbytes,
                source,
            };
            section.seek(SeekFrom::Start(extent.offset)).map_err(failed)?;
            let mut left = extent.nbytes;
            while left > 0 {
                let take = usize::try_from(left).map_or(CHUNK, |left| left.min(CHUNK));
                section.read_exact(&mut buffer[..take]).map_err(failed)?;
                out.write_all(&buffer[..take])?;
                left -= take as u64;
            }
            written = placed.offset + placed.nbytes;
        }
        Ok(())
    }
}
