//! The C functions called as a C program calls them (same symbols, same pointers): registration serves the
//! embedded delegates in ExecuTorch's registry, once; the names and the version are what the header says.

use std::ffi::CStr;

use kv_delegate::{kvd_backend_count, kvd_backend_name, kvd_last_error, kvd_register_backends, kvd_version};

fn names() -> Vec<String> {
    (0..kvd_backend_count())
        .map(|i| {
            let name = kvd_backend_name(i);
            assert!(!name.is_null(), "index {i} is below the count");
            // SAFETY: a non-null name is a NUL-terminated id alive for the process (the header's promise).
            unsafe { CStr::from_ptr(name) }.to_str().expect("an ASCII id").to_owned()
        })
        .collect()
}

#[test]
fn registering_serves_the_embedded_delegates_once_and_names_them() {
    // Before: nothing registered, no name, no error.
    assert_eq!(kvd_backend_count(), 0);
    assert!(kvd_backend_name(0).is_null());
    assert_eq!(kvd_register_backends(), 0, "{:?}", kv_delegate::last_error());
    let names = names();
    // The CUDA delegate serves only where a driver and a GPU are: CudaBackend is listed there alone.
    assert!(names.iter().any(|n| n == "ReferenceBackend"), "ReferenceBackend not in {names:?}");
    for id in &names {
        assert!(executorch_bridge_has(id), "ExecuTorch's registry has no {id}");
    }
    assert!(kvd_backend_name(names.len()).is_null(), "past the end is NULL");
    // SAFETY: a null buffer is allowed; nothing failed on this thread.
    assert_eq!(unsafe { kvd_last_error(std::ptr::null_mut(), 0) }, 0);
    // Again: nothing changes, the same pointers.
    let first = kvd_backend_name(0);
    assert_eq!(kvd_register_backends(), 0);
    assert_eq!(names, self::names());
    assert_eq!(kvd_backend_name(0), first);
}

/// Whether ExecuTorch's registry (not ours) has `id`.
fn executorch_bridge_has(id: &str) -> bool {
    executorch_bridge::is_registered(id)
}

#[test]
fn the_version_is_the_headers_and_the_crates() {
    // SAFETY: `kvd_version` returns a static NUL-terminated string.
    let version = unsafe { CStr::from_ptr(kvd_version()) }.to_str().expect("ASCII");
    assert_eq!(version, env!("CARGO_PKG_VERSION"));
    assert_eq!(kv_delegate::VERSION.to_str(), Ok(version));
    let header = include_str!("../include/kv_delegate.h");
    assert!(
        header.contains(&format!("#define KVD_VERSION \"{version}\"")),
        "include/kv_delegate.h's KVD_VERSION is not {version}"
    );
}
