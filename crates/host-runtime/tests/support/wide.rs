//! A program whose one call binds many arguments to a delegate that does nothing (`delegate_abi::testing`),
//! for measuring what the host itself costs per `execute`: one user input, `caches` buffers updated in place
//! (each an in/out argument and its in-place output), `reads` buffers only read, and one user output.

use std::path::{Path, PathBuf};

use blob_format::model::{Alias, AliasKind, Binding, DType, Dim, Header, PayloadKind, Role};
use delegate_abi::testing::{self, Fixture};
use delegate_abi::PluginInfo;

/// The backend the do-nothing delegate serves.
pub const BACKEND: &str = "NoopBackend";

/// The do-nothing delegate.
pub struct Noop;

impl Fixture for Noop {
    fn info() -> PluginInfo {
        testing::info("noop", BACKEND)
    }
}

/// Writes `program.toml` and `call.blob` into `dir`; returns the manifest path and the number of arguments.
pub fn write(dir: &Path, caches: usize, reads: usize) -> (PathBuf, usize) {
    let binding = |name: String, role| Binding {
        name,
        role,
        dtype: Some(DType::F32),
        shape: Some(vec![Dim::Static(4)]),
        threaded: true,
    };
    let mut bindings = vec![binding("x".into(), Role::Input)];
    let mut args = vec!["input:x".to_owned()];
    let mut buffers = String::new();
    for c in 0..caches {
        bindings.push(binding(format!("c{c}"), Role::Input));
        args.push(format!("buffer:c{c}"));
        buffers += &format!("[buffers.c{c}]\ndtype = \"f32\"\nshape = [4]\n\n");
    }
    for r in 0..reads {
        bindings.push(binding(format!("r{r}"), Role::Input));
        args.push(format!("buffer:r{r}"));
        buffers += &format!("[buffers.r{r}]\ndtype = \"f32\"\nshape = [4]\n\n");
    }
    for c in 0..caches {
        bindings.push(binding(format!("c{c}_out"), Role::Output));
        args.push(format!("buffer:c{c}"));
    }
    bindings.push(binding("y".into(), Role::Output));
    args.push("output:y".to_owned());
    let aliases = (0..caches)
        .map(|c| Alias {
            output: format!("c{c}_out"),
            input: format!("c{c}"),
            kind: AliasKind::KvCacheUpdate,
        })
        .collect();
    let header = Header::new(BACKEND, PayloadKind::Other("noop".to_owned()), bindings, aliases);
    std::fs::write(dir.join("call.blob"), blob_format::native::to_vec(&header, b"noop")).expect("blob");
    let text = format!(
        "format = 1\n\n{buffers}[methods.step]\ninputs = [{{ name = \"x\", dtype = \"f32\", shape = [4] }}]\n\
         outputs = [{{ name = \"y\", dtype = \"f32\", shape = [4] }}]\n\
         calls = [{{ blob = \"call.blob\", backend = \"{BACKEND}\", args = {args:?} }}]\n"
    );
    let path = dir.join("program.toml");
    std::fs::write(&path, text).expect("manifest");
    (path, args.len())
}
