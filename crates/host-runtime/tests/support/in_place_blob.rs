//! A program of 4-float caches, each updated in place by one call of its own method through a native blob
//! whose output `cache_out` aliases input `cache` (a KV-cache update), for test delegates that stand in for
//! a real engine.

use std::path::{Path, PathBuf};

use blob_format::model::{Alias, AliasKind, Binding, DType, Dim, Header, PayloadKind, Role};

/// Writes `dir/program.toml` and its blob `dir/blob.blob` for `backend`: for each `(method, cache)`, a 4-float
/// buffer `cache` and a method whose one call updates it in place. Returns the manifest's path.
pub fn program(dir: &Path, backend: &str, methods: &[(&str, &str)]) -> PathBuf {
    write_blob(dir, "blob.blob", backend);
    let mut toml = String::from("format = 1\n");
    for (_, cache) in methods {
        toml += &format!("[buffers.{cache}]\ndtype = \"f32\"\nshape = [4]\n");
    }
    for (method, cache) in methods {
        toml += &format!(
            "[methods.{method}]\n[[methods.{method}.calls]]\nblob = \"blob.blob\"\nbackend = \"{backend}\"\n\
             args = [\"buffer:{cache}\", \"buffer:{cache}\"]\n"
        );
    }
    let manifest = dir.join("program.toml");
    std::fs::write(&manifest, toml).expect("manifest");
    manifest
}

/// Writes the blob for `backend` as `dir/file`.
fn write_blob(dir: &Path, file: &str, backend: &str) {
    let binding = |name: &str, role| Binding {
        name: name.to_owned(),
        role,
        dtype: Some(DType::F32),
        shape: Some(vec![Dim::Static(4)]),
        threaded: true,
    };
    let header = Header::new(
        backend,
        PayloadKind::Other("test".to_owned()),
        vec![binding("cache", Role::Input), binding("cache_out", Role::Output)],
        vec![Alias {
            output: "cache_out".to_owned(),
            input: "cache".to_owned(),
            kind: AliasKind::KvCacheUpdate,
        }],
    );
    std::fs::write(dir.join(file), blob_format::native::to_vec(&header, b"payload")).expect("blob");
}
