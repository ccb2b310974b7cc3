//! [`write_streamed`]: a native blob whose engine is written a chunk at a time (gigabytes of weights copied
//! from a file) instead of held in one slice.

use std::io;

use xxhash_rust::xxh3::Xxh3;

use super::{encode_head_for, v1, CURRENT};
use crate::model::Header;

/// [`write()`](super::write()) of an engine that is written rather than held in one slice (a payload of gigabytes copied
/// from a file a chunk at a time): `engine` writes the engine's bytes to the sink it is given. It is called
/// twice, first to size and checksum the engine for the header, then to write it after the header, so it
/// must write the same bytes both times. The second call's bytes are checksummed again as they are written.
///
/// # Errors
/// What `engine` or `out` returns; an `InvalidData` I/O error when the second call's bytes differ from the
/// first's (what `engine` copies from changed in between): `out` then holds a blob whose header does not
/// match its engine, to be discarded.
///
/// # Panics
/// As [`write()`](super::write()).
pub fn write_streamed<E: From<io::Error>>(
    header: &Header,
    mut engine: impl FnMut(&mut dyn io::Write) -> Result<(), E>,
    out: &mut impl io::Write,
) -> Result<(), E> {
    let mut first = Digest::default();
    engine(&mut first)?;
    let (size, xxh3) = first.finish();
    out.write_all(&encode_head_for(CURRENT, size, xxh3, |location| v1::encode_header(header, location)))?;
    let mut tee = Tee { out, digest: Digest::default() };
    engine(&mut tee)?;
    let (written, rehashed) = tee.digest.finish();
    if (written, rehashed) != (size, xxh3) {
        let problem = format!(
            "the engine changed while it was written: {size} bytes with checksum {xxh3:016x} when sized, \
             {written} bytes with checksum {rehashed:016x} when written"
        );
        return Err(io::Error::new(io::ErrorKind::InvalidData, problem).into());
    }
    Ok(())
}

/// A sink that counts and checksums what is written to it.
#[derive(Default)]
struct Digest {
    hasher: Xxh3,
    len: u64,
}

impl Digest {
    /// The length and XXH3-64 of everything written.
    fn finish(&self) -> (u64, u64) {
        (self.len, self.hasher.digest())
    }
}

impl io::Write for Digest {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.hasher.update(buf);
        self.len += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Writes to `out` and checksums what `out` accepted.
struct Tee<'a, W> {
    out: &'a mut W,
    digest: Digest,
}

impl<W: io::Write> io::Write for Tee<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.out.write(buf)?;
        io::Write::write_all(&mut self.digest, &buf[..n])?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::write_streamed;
    use crate::model::{Header, PayloadKind};
    use crate::native::to_vec;
    use crate::Blob;

    fn header() -> Header {
        Header {
            producer: None,
            backend_id: "ReferenceBackend".to_owned(),
            payload_kind: PayloadKind::ReferenceGraph,
            bindings: Vec::new(),
            aliases: Vec::new(),
            device_id: 0,
            hardware_compatible: false,
            hardware_target: None,
            engine_library_version: None,
            engine_metadata: None,
        }
    }

    /// An engine written in pieces gives the very bytes of the engine given whole.
    #[test]
    fn an_engine_written_in_chunks_gives_the_blob_of_the_whole_engine() {
        let engine: Vec<u8> = (0..100_003u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut streamed = Vec::new();
        write_streamed(
            &header(),
            |sink: &mut dyn Write| engine.chunks(4096).try_for_each(|chunk| sink.write_all(chunk)),
            &mut streamed,
        )
        .expect("written");
        assert!(streamed == to_vec(&header(), &engine), "the streamed blob differs");
        Blob::parse(&streamed).expect("parses").verify_payload().expect("checksum holds");
    }

    /// The engine's source changing between the pass that checksums it and the pass that writes it is an
    /// error, never a blob whose checksum is wrong reported as written.
    #[test]
    fn an_engine_that_changes_between_its_two_passes_is_refused() {
        let mut calls = 0;
        let err = write_streamed(
            &header(),
            |sink: &mut dyn Write| {
                calls += 1;
                sink.write_all(if calls == 1 { b"first bytes" } else { b"other bytes" })
            },
            &mut Vec::new(),
        )
        .expect_err("the engine changed");
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
        assert!(err.to_string().starts_with("the engine changed while it was written"), "{err}");
    }
}
