//! The general path's index walks (`src/kernels/walk.cuh`: `walk2`, 32-bit below 2^32 elements, and
//! `contiguous`, the elementwise kernels' flat path) run on the CPU by the host C++ compiler against a plain
//! 64-bit walk (`support/walk_emulation.cpp`): every index of random shapes and strides, and sampled indices of
//! launches around the 32-bit bound. Needs a C++17 compiler (`$CXX`, else `c++`); without one the test says so
//! and checks nothing, unless `KV_REQUIRE_CXX` is set. NVRTC compiles the same file for the GPU
//! (`kernels::general::tests`).

use std::path::Path;
use std::process::Command;

#[test]
fn the_kernels_index_walks_agree_with_a_plain_64_bit_walk() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().expect("temp dir");
    let compiler = std::env::var("CXX").unwrap_or_else(|_| "c++".to_owned());
    let exe = dir.path().join("walk_emulation");
    let built = Command::new(&compiler)
        .args(["-std=c++17", "-O2"])
        .arg(format!("-DWALK_SOURCE=\"{}\"", root.join("src/kernels/walk.cuh").display()))
        .arg(root.join("tests/support/walk_emulation.cpp"))
        .arg("-o")
        .arg(&exe)
        .output();
    match built {
        Ok(out) => assert!(out.status.success(), "{compiler}: {}", String::from_utf8_lossy(&out.stderr)),
        Err(err) => {
            assert!(
                std::env::var_os("KV_REQUIRE_CXX").is_none(),
                "KV_REQUIRE_CXX is set but {compiler}: {err}"
            );
            eprintln!("this test needs a C++17 compiler ({compiler}: {err}); nothing was checked");
            return;
        }
    }
    let out = Command::new(&exe).output().expect("the emulation runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.ends_with("0 disagreements\n"), "{text}");
}
