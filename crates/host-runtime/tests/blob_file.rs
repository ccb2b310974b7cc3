//! Files the host reads are snapshots: what happens to a file afterwards cannot reach the host (a mapped file
//! that is truncated kills the reader with SIGBUS; this test process would die).

use std::io::Write;

use host_runtime::blob_file::BlobFile;

#[test]
fn a_file_truncated_or_replaced_after_it_was_read_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("old.blob");
    let original: Vec<u8> = (0..3 * 4096u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(&path, &original).expect("write");
    let file = BlobFile::open(&path).expect("a regular file");

    // `cp new.blob old.blob`: truncated to zero, then rewritten shorter and different.
    let mut replaced = std::fs::File::create(&path).expect("truncate");
    replaced.write_all(b"new and shorter").expect("rewrite");
    drop(replaced);

    assert_eq!(file.bytes().len(), original.len());
    assert_eq!(file.bytes(), &original[..], "every page, including those past the file's new end");
}

#[test]
fn what_is_not_a_regular_file_is_refused_before_it_is_opened() {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = BlobFile::open(dir.path()).err().expect("a directory is refused");
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    assert_eq!(err.to_string(), "not a regular file (it is a directory)");
    let err = BlobFile::open(std::path::Path::new("/dev/zero")).err().expect("a device is refused");
    assert_eq!(err.to_string(), "not a regular file (it is a character device)");
    let empty = dir.path().join("empty.blob");
    std::fs::write(&empty, b"").expect("write");
    assert!(BlobFile::open(&empty).expect("an empty file reads").bytes().is_empty());
}
