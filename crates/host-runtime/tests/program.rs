//! `Program` through the library API: buffers in their declared memory kinds, read back, reset, and the
//! typed errors a missing CUDA driver gives.

use std::path::{Path, PathBuf};

use delegate_abi::host::HostConfig;
use delegate_abi::MemoryKind;
use et_error::{ErrorCode, HasErrorCode};
use host_runtime::buffer::AllocError;
use host_runtime::generate::generate;
use host_runtime::manifest::Manifest;
use host_runtime::plugins::{Discovery, Registry};
use host_runtime::program::{Error, Mode, Program};

fn export(dir: &Path, memory: &str) -> PathBuf {
    kv_example::export::reference(&kv_example::Config::tiny(), dir).expect("export");
    let text = std::fs::read_to_string(dir.join("program.toml")).expect("manifest");
    let path = dir.join(format!("{memory}.toml"));
    std::fs::write(&path, text.replace("memory = \"host\"", &format!("memory = \"{memory}\"")))
        .expect("write");
    path
}

fn load(path: &Path, mode: Mode) -> Result<Program, Error> {
    let registry = Registry::discover(Discovery::new())
        .with_embedded(reference_delegate::delegate_root(), &HostConfig::default());
    Program::load(Manifest::load(path).expect("manifest"), &registry, mode)
}

#[test]
fn host_buffers_are_read_in_place_and_reset_to_zero() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut program = load(&export(dir.path(), "host"), Mode::ZeroCopy).expect("loads without CUDA");
    assert_eq!(program.buffer_memory("k_cache_0"), Some(MemoryKind::Host));
    let zeros = program.buffer("k_cache_0").expect("buffer");
    assert!(matches!(zeros, std::borrow::Cow::Borrowed(_)), "host memory is not copied to be read");
    assert!(zeros.iter().all(|&b| b == 0), "caches start zeroed");

    generate(&mut program, 2, |_, _| Ok(())).expect("generate");
    assert!(program.buffer("k_cache_0").expect("buffer").iter().any(|&b| b != 0), "prefill wrote the cache");
    program.reset_buffers().expect("reset");
    assert!(program.buffer("k_cache_0").expect("buffer").iter().all(|&b| b == 0));
    assert!(program.buffer("v_cache_0").expect("buffer").iter().all(|&b| b == 0));

    let err = program.buffer("k_cache_9").expect_err("no such buffer");
    assert_eq!(err.to_string(), "the program has no buffer 'k_cache_9'");
    assert_eq!(program.buffer_memory("k_cache_9"), None);
}

#[test]
fn managed_buffers_without_a_driver_are_a_typed_not_supported_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = export(dir.path(), "managed");
    for mode in [Mode::ZeroCopy, Mode::CopyBack] {
        match (host_runtime::cuda::Context::open(0), load(&path, mode)) {
            (Err(cuda), Err(err)) => {
                assert_eq!(err.error_code(), ErrorCode::NotSupported);
                assert!(
                    matches!(&err, Error::BufferMemory { buffer, memory: MemoryKind::Managed, source }
                        if buffer == "k_cache_0" && *source == AllocError::Cuda(cuda)),
                    "{err}"
                );
            }
            (Ok(_), Ok(mut program)) => {
                assert_eq!(program.buffer_memory("k_cache_0"), Some(MemoryKind::Managed));
                assert!(program.buffer("k_cache_0").expect("read").iter().all(|&b| b == 0));
                generate(&mut program, 2, |_, _| Ok(())).expect("generate");
                assert!(program.buffer("k_cache_0").expect("read").iter().any(|&b| b != 0));
                program.reset_buffers().expect("reset");
                assert!(program.buffer("k_cache_0").expect("read").iter().all(|&b| b == 0));
            }
            (cuda, program) => panic!("CUDA {:?} but load {:?}", cuda.err(), program.err()),
        }
    }
}

#[test]
fn a_buffer_larger_than_memory_is_a_typed_allocation_error_not_an_abort() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = export(dir.path(), "host");
    let mut text = std::fs::read_to_string(&path).expect("manifest");
    // 4 PB: more than any address space, so every allocator refuses it, overcommit or not.
    text.push_str("\n[buffers.huge]\ndtype = \"f32\"\nshape = [1000000000000000]\nmemory = \"host\"\n");
    std::fs::write(&path, text).expect("write");
    let err = load(&path, Mode::ZeroCopy).err().expect("refused");
    assert_eq!(err.error_code(), ErrorCode::MemoryAllocationFailed);
    assert_eq!(
        err.to_string(),
        "buffer 'huge' wants host memory but cannot allocate 4000000000000000 bytes of host memory"
    );
}
