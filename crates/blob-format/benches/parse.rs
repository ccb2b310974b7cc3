//! Open + parse cost for native and TR02 blobs with a 1 KiB and a 1 GiB engine: parsing reads only the
//! header, so the two sizes must cost the same.
//!
//! The 1 GiB blobs are built once, without copying an engine: the head is written into a zeroed buffer of the
//! full size (the engine is all zeros, so the untouched pages stay shared zero pages).
#![allow(missing_docs)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::hint::black_box;
use std::io;

use blob_format::{native, upstream, Blob};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};

const KIB: usize = 1 << 10;
const GIB: usize = 1 << 30;

/// Keeps the first bytes written (the head) and only counts the rest (the engine).
struct HeadOnly {
    head: Vec<u8>,
    limit: usize,
    total: usize,
}

impl io::Write for HeadOnly {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let keep = buf.len().min(self.limit.saturating_sub(self.head.len()));
        self.head.extend_from_slice(&buf[..keep]);
        self.total += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A native blob around an all-zero engine of `size` bytes.
fn native_blob(size: usize) -> Vec<u8> {
    let engine = vec![0u8; size];
    let mut sink = HeadOnly { head: Vec::new(), limit: 64 * KIB, total: 0 };
    native::write(&common::tr02_fixture_header(), &engine, &mut sink).expect("writing to memory");
    let engine_offset = sink.total - size;
    let mut blob = vec![0u8; sink.total];
    blob[..engine_offset].copy_from_slice(&sink.head[..engine_offset]);
    blob
}

/// A TR02 blob around an all-zero engine of `size` bytes.
fn tr02_blob(size: usize) -> Vec<u8> {
    let mut head =
        upstream::write_tr02(&common::tr02_fixture_header(), &[]).expect("TR02 expresses this header");
    head[16..24].copy_from_slice(&(size as u64).to_le_bytes());
    let mut blob = vec![0u8; head.len() + size];
    blob[..head.len()].copy_from_slice(&head);
    blob
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("parse");
    for (label, size) in [("1KiB", KIB), ("1GiB", GIB)] {
        let blob = native_blob(size);
        assert_eq!(Blob::parse(&blob).expect("native blob parses").engine.len(), size);
        group.bench_with_input(BenchmarkId::new("native", label), &blob, |b, blob| {
            b.iter(|| Blob::parse(black_box(blob)).expect("parses").engine.len())
        });
        drop(blob);
        let blob = tr02_blob(size);
        assert_eq!(Blob::parse(&blob).expect("TR02 blob parses").engine.len(), size);
        group.bench_with_input(BenchmarkId::new("tr02", label), &blob, |b, blob| {
            b.iter(|| Blob::parse(black_box(blob)).expect("parses").engine.len())
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
