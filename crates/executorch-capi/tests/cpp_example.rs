//! The libraries as C and C++ users link them (docs/cpp.md's link lines, `c++`/`cc` or `$CXX`/`$CC`):
//! `examples/cpp/decode.cpp` linked once against `libkv_delegate.a` and once against `libkv_delegate.so`, each
//! run on a committed program (`fixtures/executorch/buffers_2m_planned.pte`: `prefill` + `decode`, caches
//! shared across methods and updated in place) and checked against torch eager's tokens committed beside it
//! (`expected.json`); every other committed program decoded to eager's tokens too; the hostile fixture (a
//! delegate output in the program's constant data) and a device refused before ExecuTorch loads anything; a
//! delegate's failure reaching the application with its reason; `examples/c` from C99; an id the application
//! already took refused by ExecuTorch (`tests/cpp/taken_id.cpp`); the example's tokens picked by the library's
//! sampler (`kvd_sampler_*`) and its reply ended by its stop checker (`kvd_stop_checker_*`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const PROGRAM: &str = "buffers_2m_planned.pte";
/// A run that takes longer is stuck (a decode of 12 steps takes milliseconds).
const RUN_LIMIT: Duration = Duration::from_secs(60);

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn fixtures() -> PathBuf {
    crate_dir().join("../../fixtures/executorch")
}

/// The wheel's `executorch/` directory (`cargo xtask test` sets `EXECUTORCH_ROOT`; this crate does not build
/// without it).
fn executorch_root() -> PathBuf {
    let root = std::env::var_os("EXECUTORCH_ROOT")
        .map(PathBuf::from)
        .expect("EXECUTORCH_ROOT is set (cargo xtask test sets it; the crate does not build without it)");
    assert!(root.join("lib/libexecutorch.so").is_file(), "{} has no lib/libexecutorch.so", root.display());
    root
}

/// Where cargo put the libraries built for this test: `<target>/<profile>/deps/`, beside the test binary
/// (`cargo test` builds the lib target with every crate type there; only `cargo build` copies them up to
/// `<target>/<profile>/`, so a copy there may be older than this test).
fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    let dir = exe.parent().expect("<target>/<profile>/deps/TEST").to_path_buf();
    for lib in ["libkv_delegate.a", "libkv_delegate.so"] {
        assert!(dir.join(lib).is_file(), "{} has no {lib}: cargo builds it with this test", dir.display());
    }
    dir
}

/// The tokens eager torch decoded, committed beside the program, and the prompt and steps they are for.
fn expected() -> (Vec<i64>, Vec<i64>, usize) {
    expected_in(&fixtures()).0
}

/// [`expected`] for the programs of `dir` (its `expected.json`), and the names of those programs.
fn expected_in(dir: &Path) -> ((Vec<i64>, Vec<i64>, usize), Vec<String>) {
    let path = dir.join("expected.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let json: serde_json::Value = serde_json::from_str(&text).expect("expected.json is JSON");
    let ints = |key: &str| -> Vec<i64> {
        json[key]
            .as_array()
            .unwrap_or_else(|| panic!("expected.json has no '{key}' list"))
            .iter()
            .map(|v| v.as_i64().expect("an integer"))
            .collect()
    };
    let steps = json["steps"].as_u64().expect("expected.json has 'steps'") as usize;
    let programs =
        json["programs"].as_object().expect("expected.json has 'programs'").keys().cloned().collect();
    ((ints("prompt"), ints("tokens"), steps), programs)
}

/// How the example links our library: statically (the archive, then the system libraries Rust's standard
/// library needs) or dynamically (with a run path to it).
#[derive(Debug, Clone, Copy)]
enum Link {
    Static,
    Shared,
}

/// Compiles and links `source` (C++) into `out` with the link line docs/cpp.md gives.
fn build_cpp(source: &Path, link: Link, out: &Path) {
    let et = executorch_root();
    let et_lib = et.join("lib");
    let libs = library_dir();
    let compiler = std::env::var_os("CXX").unwrap_or_else(|| "c++".into());
    let mut cmd = Command::new(&compiler);
    cmd.arg("-std=c++17")
        .arg(source)
        .arg("-o")
        .arg(out)
        .arg("-DC10_USING_CUSTOM_GENERATED_MACROS")
        .arg(format!("-I{}", crate_dir().join("include").display()))
        // -isystem: ExecuTorch's headers are not the application's to warn about (deprecations).
        .arg("-isystem")
        .arg(et.join("include"))
        .arg("-isystem")
        .arg(et.join("include/executorch/runtime/core/portable_type/c10"));
    match link {
        Link::Static => cmd.arg(libs.join("libkv_delegate.a")),
        Link::Shared => cmd
            .arg(format!("-L{}", libs.display()))
            .arg("-lkv_delegate")
            .arg(format!("-Wl,-rpath,{}", libs.display())),
    };
    cmd.arg(format!("-L{}", et_lib.display()))
        .arg("-lexecutorch")
        // The kernels of the operators outside the delegate (the caches' `copy_`) register themselves from
        // static initialisers: nothing references them, so only --no-as-needed keeps them.
        .args([
            "-Wl,--no-as-needed",
            "-lexecutorch_kernels_optimized",
            "-lexecutorch_threadpool",
            "-Wl,--as-needed",
        ])
        .arg(format!("-Wl,-rpath,{}", et_lib.display()));
    if let Link::Static = link {
        // What `cargo rustc -p executorch-capi --lib --crate-type staticlib -- --print native-static-libs`
        // lists beyond what the C++ driver links anyway (libstdc++, libgcc_s, libc).
        cmd.args(["-lpthread", "-ldl", "-lm", "-lrt", "-lutil"]);
    }
    let output = cmd.output().unwrap_or_else(|e| panic!("running {compiler:?}: {e}"));
    assert!(
        output.status.success(),
        "{link:?} link of {} failed: {cmd:?}\n{}",
        source.display(),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Runs `exe` with `args` and `env`, killed after [`RUN_LIMIT`]. Its output goes to files (a pipe nobody
/// reads until it exits could fill and stall it).
fn run_bounded(exe: &Path, args: &[String], env: &[(&str, &str)]) -> Output {
    let out = tempfile::tempfile().expect("a file for stdout");
    let err = tempfile::tempfile().expect("a file for stderr");
    let mut child = Command::new(exe)
        .args(args)
        .envs(env.iter().copied())
        // The library's own delegates: no plugin library from the environment.
        .env_remove("DELEGATE_PLUGIN_PATH")
        .stdout(out.try_clone().expect("the file again"))
        .stderr(err.try_clone().expect("the file again"))
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", exe.display()));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting") {
            break status;
        }
        if start.elapsed() > RUN_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{} {args:?} ran past {RUN_LIMIT:?}", exe.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output { status, stdout: read_all(out), stderr: read_all(err) }
}

fn read_all(mut file: std::fs::File) -> Vec<u8> {
    use std::io::{Read, Seek};
    let mut bytes = Vec::new();
    file.rewind().and_then(|()| file.read_to_end(&mut bytes)).expect("reading the output back");
    bytes
}

/// The example's tokens, from its `tokens:` line.
fn tokens_of(stdout: &str) -> Vec<i64> {
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("tokens:"))
        .unwrap_or_else(|| panic!("no tokens line in:\n{stdout}"));
    line.split_whitespace().map(|t| t.parse().expect("a token id")).collect()
}

/// The example linked as `link`, built once per test binary.
fn example(link: Link) -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    static BUILT: [OnceLock<PathBuf>; 2] = [OnceLock::new(), OnceLock::new()];
    let dir = DIR.get_or_init(|| tempfile::tempdir().expect("a temporary directory"));
    BUILT[link as usize].get_or_init(|| {
        let exe = dir.path().join(format!("decode-{link:?}"));
        build_cpp(&crate_dir().join("examples/cpp/decode.cpp"), link, &exe);
        exe
    })
}

fn check(link: Link) {
    check_program(link, &fixtures().join(PROGRAM), expected());
}

/// The example linked as `link` decodes `program` to `expected`'s tokens.
fn check_program(link: Link, program: &Path, (prompt, tokens, steps): (Vec<i64>, Vec<i64>, usize)) {
    let exe = example(link);
    let prompt: Vec<String> = prompt.iter().map(i64::to_string).collect();
    let args = [program.display().to_string(), prompt.join(","), steps.to_string()];
    let output = run_bounded(exe, &args, &[]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{link:?}: decode {args:?} failed:\n{stdout}{stderr}");
    let banner = stdout.lines().next().unwrap_or_default();
    assert!(
        banner.starts_with(&format!("kv-delegate {}:", env!("CARGO_PKG_VERSION")))
            && banner.contains(" ReferenceBackend"),
        "{link:?}: the registration line is '{banner}'"
    );
    assert_eq!(
        tokens_of(&stdout),
        tokens,
        "{link:?}: the example's tokens are not eager's ({})",
        program.display()
    );
}

#[test]
fn the_cpp_example_linked_statically_decodes_eagers_tokens() {
    check(Link::Static);
}

#[test]
fn the_cpp_example_linked_dynamically_decodes_eagers_tokens() {
    check(Link::Shared);
}

#[test]
fn the_cpp_example_samples_with_the_librarys_sampler_reproducibly_for_a_seed() {
    // Temperature 0 is the greedy path above; a temperature draws with the seed: the same seed gives the same
    // tokens on every run, and the stop checker ends the reply after STEPS + 1 tokens.
    let (prompt, _, steps) = expected();
    let prompt: Vec<String> = prompt.iter().map(i64::to_string).collect();
    let sampled = |seed: &str| {
        let args = [
            fixtures().join(PROGRAM).display().to_string(),
            prompt.join(","),
            steps.to_string(),
            "5".into(),
            seed.into(),
        ];
        let output = run_bounded(example(Link::Shared), &args, &[]);
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "decode {args:?}: {stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        tokens_of(&stdout)
    };
    let first = sampled("7");
    assert_eq!(first.len(), steps + 1, "{first:?}");
    assert_eq!(sampled("7"), first, "a seed reproduces");
    assert!(
        (8..16).map(|seed| sampled(&seed.to_string())).any(|other| other != first),
        "seeds draw differently"
    );
}

#[test]
fn the_cpp_example_checks_and_decodes_every_committed_program() {
    // Each one passes kvd_check_program and runs from the bytes checked: one method or two, caches copied back
    // or updated in place, owned by the delegate, an operator outside the delegate.
    let mut ran = 0;
    for dir in [fixtures(), fixtures().join("outside")] {
        let (expected, programs) = expected_in(&dir);
        for name in programs {
            check_program(Link::Shared, &dir.join(name), expected.clone());
            ran += 1;
        }
    }
    assert!(ran >= 6, "only {ran} programs listed");
}

#[test]
fn the_cpp_example_refuses_a_delegate_output_in_the_programs_constant_data_before_loading_it() {
    // Before kvd_check_program the example loaded it and the delegate wrote its new K cache into the program's
    // read-only mapping: SIGSEGV.
    let program = fixtures().join("hostile/kv_out_in_constant.pte");
    let args = [program.display().to_string()];
    let output = run_bounded(example(Link::Shared), &args, &[("KVD_LOG", "off")]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{:?}: {stdout}{stderr}", output.status);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    let line = format!(
        "error: checking {}: ExecuTorch error 0x23 (kvd_check_program: method 'forward', \
         chains[0].instructions[0] (DelegateCall to ReferenceBackend): argument 4 ('k_cache_out_0', value 4) is \
         an output the delegate writes, but it is not planned memory: it is constant data of the program",
        program.display()
    );
    assert!(stderr.starts_with(&line), "{stderr}");
    assert!(!stdout.contains("tokens:"), "{stdout}");
}

#[test]
fn the_cpp_example_reads_only_a_regular_file() {
    // /dev/zero would be read until memory runs out; it is refused from the open descriptor.
    let output = run_bounded(example(Link::Shared), &["/dev/zero".to_owned()], &[("KVD_LOG", "off")]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim_end(), "error: cannot read /dev/zero: not a regular file");
}

#[test]
fn the_header_is_c_and_a_c_program_links_the_static_library() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let exe = dir.path().join("list_backends");
    let et_lib = executorch_root().join("lib");
    let compiler = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    let mut cmd = Command::new(&compiler);
    cmd.args(["-std=c99", "-pedantic", "-Wall", "-Wextra", "-Werror"])
        .arg(crate_dir().join("examples/c/list_backends.c"))
        .arg("-o")
        .arg(&exe)
        .arg(format!("-I{}", crate_dir().join("include").display()))
        .arg(library_dir().join("libkv_delegate.a"))
        .arg(format!("-L{}", et_lib.display()))
        .arg("-lexecutorch")
        .arg(format!("-Wl,-rpath,{}", et_lib.display()))
        // A C driver does not link the C++ runtime the bridge's shim needs.
        .args(["-lstdc++", "-lgcc_s", "-lpthread", "-ldl", "-lm", "-lrt", "-lutil"]);
    let output = cmd.output().unwrap_or_else(|e| panic!("running {compiler:?}: {e}"));
    assert!(output.status.success(), "{cmd:?}\n{}", String::from_utf8_lossy(&output.stderr));
    let output = run_bounded(&exe, &[], &[]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(
        stdout.starts_with(&format!("kv-delegate {}: ", env!("CARGO_PKG_VERSION")))
            && stdout.split_whitespace().any(|id| id == "ReferenceBackend"),
        "{stdout}"
    );
}

#[test]
fn a_delegate_failure_reaches_the_application_with_its_reason() {
    let program = fixtures().join(PROGRAM);
    // Token 999 is outside the 64-token vocabulary: the reference delegate refuses it in `execute`, ExecuTorch
    // returns only InvalidArgument (0x12), and kvd_last_error gives the example the delegate's reason.
    let args = [program.display().to_string(), "1,7,3,999".to_owned(), "1".to_owned()];
    // KVD_LOG=off: the library logs nothing, so stderr is the example's one line.
    let output = run_bounded(example(Link::Shared), &args, &[("KVD_LOG", "off")]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(
            "error: the prompt: ExecuTorch error 0x12 (backend 'ReferenceBackend': execute failed: index 999"
        ),
        "{stderr}"
    );
}

#[test]
fn an_id_the_application_took_is_refused_by_executorch_naming_it() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let exe = dir.path().join("taken_id");
    build_cpp(&crate_dir().join("tests/cpp/taken_id.cpp"), Link::Shared, &exe);
    let output = run_bounded(&exe, &[], &[("KVD_LOG", "off")]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    // InvalidArgument (0x12 = 18: ExecuTorch 1.5.1's code for a name it has), nothing listed as registered,
    // the id named.
    let expected = "18 0 kvd_register_backends: ExecuTorch refused to register backend 'ReferenceBackend'";
    assert!(stdout.starts_with(expected), "{stdout}");
}
