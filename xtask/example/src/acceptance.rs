//! The example's acceptance check through the whole host stack: manifest, registry, a plugin dylib loaded
//! from disk, caller-owned buffers and both slot modes, step by step against `kv_example`'s independent f64
//! model (`kv_example::check::Verifier` does the comparing).

use std::path::{Path, PathBuf};

use anyhow::Context;
use host_runtime::generate::generate;
use host_runtime::manifest::Manifest;
use host_runtime::plugins::{Discovery, Registry};
use host_runtime::program::{Mode, Program};
use kv_example::check::{max_abs_diff, Report, Verifier, AB_MIN_DIFF};
use kv_example::Config;

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// One layer's `(k, v)` cache contents.
type LayerCaches = (Vec<f32>, Vec<f32>);

/// Every layer's `(k, v)` cache as the program holds them.
fn caches(program: &Program, cfg: &Config) -> Result<Vec<LayerCaches>, host_runtime::program::Error> {
    (0..cfg.layers)
        .map(|l| {
            let read = |name: String| program.buffer(&name).map(|bytes| f32s(&bytes));
            Ok((read(kv_example::model::k_cache(l))?, read(kv_example::model::v_cache(l))?))
        })
        .collect()
}

fn borrowed(caches: &[(Vec<f32>, Vec<f32>)]) -> Vec<(&[f32], &[f32])> {
    caches.iter().map(|(k, v)| (k.as_slice(), v.as_slice())).collect()
}

fn load(program: &Path, plugin_dirs: &[PathBuf], mode: Mode) -> anyhow::Result<Program> {
    // Manifests only: a library is opened only when the program needs its backend, and only once its bytes
    // match its manifest (a build directory also holds fixtures that abort when opened). No plugin is embedded:
    // the check is of the library loaded from disk.
    let registry = Registry::discover(Discovery::new().dirs(plugin_dirs));
    let manifest = Manifest::load(program)?;
    Ok(Program::load(manifest, &registry, mode)?)
}

/// What one generation produced, step by step.
struct Trace {
    tokens: Vec<i64>,
    /// Each step's `next_token` output (the delegate's argmax), when the program declares one.
    next_tokens: Vec<i64>,
    logits: Vec<Vec<f32>>,
    copied: Vec<u64>,
    first_decode: Option<(i64, i64)>,
}

/// Runs prefill + `steps` decode steps; with a verifier, checks every step against the oracle.
fn traced(
    program: &mut Program,
    cfg: &Config,
    steps: usize,
    mut verifier: Option<&mut Verifier>,
) -> anyhow::Result<Trace> {
    let g = program.manifest().generate.clone().context("the example program has a [generate] section")?;
    let mut trace = Trace {
        tokens: Vec::new(),
        next_tokens: Vec::new(),
        logits: Vec::new(),
        copied: Vec::new(),
        first_decode: None,
    };
    let mut oracle_error = None;
    generate(program, steps, |step, program| {
        let logits = f32s(program.output(&step.method, &g.logits_output)?);
        if let Some(next) = &g.next_token_output {
            let bytes = program.output(&step.method, next)?;
            trace
                .next_tokens
                .extend(bytes.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8]))));
        }
        if let Some(verifier) = verifier.as_deref_mut() {
            let caches = caches(program, cfg)?;
            let result = if step.index == 0 {
                verifier.prefill(&step.input_tokens, &logits, &borrowed(&caches))
            } else {
                verifier.decode(step.input_tokens[0], step.position as usize, &logits, &borrowed(&caches))
            };
            oracle_error = oracle_error.take().or(result.err());
        }
        if step.index == 1 {
            trace.first_decode = Some((step.input_tokens[0], step.position));
        }
        trace.copied.push(step.copies.total());
        trace.logits.push(logits);
        trace.tokens.push(step.token);
        Ok(())
    })?;
    if let Some(err) = oracle_error {
        return Err(err).context("the oracle refused a step the program ran");
    }
    Ok(trace)
}

/// Decodes `token` at each of `positions` in turn on the program's current caches; the last logits.
fn decode_at(program: &mut Program, token: i64, positions: &[i64]) -> anyhow::Result<Vec<f32>> {
    let g = program.manifest().generate.clone().context("[generate] section")?;
    let mut logits = Vec::new();
    for &pos in positions {
        program.input_mut(&g.decode, &g.token_input)?.copy_from_slice(&token.to_le_bytes());
        program.input_mut(&g.decode, &g.position_input)?.copy_from_slice(&pos.to_le_bytes());
        program.execute(&g.decode)?;
        logits = f32s(program.output(&g.decode, &g.logits_output)?);
    }
    Ok(logits)
}

/// Runs the acceptance check on the program at `program`, loading plugins only from `plugin_dirs` (the
/// embedded default is left out, so the dylib on disk is what is tested).
pub fn run(
    program: &Path,
    plugin_dirs: &[PathBuf],
    cfg: &Config,
    steps: usize,
) -> anyhow::Result<(Report, Vec<i64>)> {
    let mut verifier = Verifier::new(cfg);
    let mut zero_copy = load(program, plugin_dirs, Mode::ZeroCopy)?;
    verifier.caches_zeroed(&borrowed(&caches(&zero_copy, cfg)?));
    let trace = traced(&mut zero_copy, cfg, steps, Some(&mut verifier))?;

    if zero_copy.manifest().generate.as_ref().is_some_and(|g| g.next_token_output.is_some()) {
        verifier.push(
            "next-token",
            trace.next_tokens == trace.tokens,
            format!(
                "the delegate's next_token equals the host's argmax of the logits at {} of {} steps",
                trace.next_tokens.iter().zip(&trace.tokens).filter(|(a, b)| a == b).count(),
                trace.tokens.len()
            ),
        );
    }

    let worst = trace.copied.iter().skip(1).max().copied().unwrap_or(0);
    verifier.push(
        "zero-copy-bytes",
        worst == 0 && trace.copied.len() == steps + 1,
        format!("{} decode steps, at most {worst} bytes copied in one", trace.copied.len().saturating_sub(1)),
    );

    // Decode runs in its own delegate instance; it must see what prefill's instance wrote.
    if let Some((token, pos)) = trace.first_decode {
        zero_copy.reset_buffers()?;
        let cold = decode_at(&mut zero_copy, token, &[pos])?;
        let diff = max_abs_diff(&cold, &trace.logits[1]);
        verifier.push(
            "decode-sees-prefill",
            diff.is_some_and(|d| d > AB_MIN_DIFF),
            match diff {
                Some(d) => {
                    format!("first decode step on prefill's cache vs on a zeroed cache: max diff {d:.3e}")
                }
                None => "first decode step gave non-finite logits or a different length".to_owned(),
            },
        );
    }

    zero_copy.reset_buffers()?;
    let a = decode_at(&mut zero_copy, 1, &[1])?;
    zero_copy.reset_buffers()?;
    let b = decode_at(&mut zero_copy, 1, &[0, 1])?;
    verifier.ab(&a, &b);

    let mut copy_back = load(program, plugin_dirs, Mode::CopyBack)?;
    let cb = traced(&mut copy_back, cfg, steps, None)?;
    let per_step = cb.copied.get(1).copied().unwrap_or(0);
    verifier.push(
        "copy-back-identical",
        cb.logits == trace.logits && cb.tokens == trace.tokens && per_step > 0,
        format!(
            "{} steps bit-identical to zero-copy; copy-back copies {per_step} bytes per decode step",
            cb.logits.len()
        ),
    );
    Ok((verifier.finish(), trace.tokens))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dylib(stem: &str) -> String {
        format!("{}{stem}{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX)
    }

    /// A directory as a build directory is: the built reference plugin dylib with its manifest, beside the
    /// crash-on-load fixture without one (it aborts the process that opens it, so the check must discover
    /// by manifests, as `cargo xtask demo` does after `cargo build --release --workspace`).
    fn plugin_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("temp dir");
        for stem in ["reference_delegate_dylib", "crash_on_load"] {
            std::fs::copy(built_plugin_dir().join(dylib(stem)), dir.path().join(dylib(stem))).expect("built");
        }
        let library = dir.path().join(dylib("reference_delegate_dylib"));
        let manifest =
            host_runtime::plugins::describe_library(&library, &Default::default()).expect("describes");
        std::fs::write(host_runtime::plugin_manifest::PluginManifest::path_for(&library), manifest.to_json())
            .expect("write manifest");
        dir
    }

    /// Where the plugin dylibs are built: `cargo xtask test` builds them and says where; a plain `cargo test`
    /// builds them here into a separate target dir (the outer cargo holds the main one).
    fn built_plugin_dir() -> PathBuf {
        if let Some(dir) = std::env::var_os("DELEGATE_TEST_PLUGIN_DIR") {
            return dir.into();
        }
        let root = xtask::util::project_root();
        let target = root.join("target").join("plugin-tests");
        let status = xtask::util::cargo()
            .args(["build", "-q", "-p", "reference-delegate-dylib", "-p", "crash-on-load", "--target-dir"])
            .arg(&target)
            .current_dir(&root)
            .status()
            .expect("cargo starts");
        assert!(status.success(), "building the reference plugin failed");
        target.join("debug")
    }

    #[test]
    fn example_passes_every_check_through_the_dylib() {
        let dir = tempfile::tempdir().expect("temp dir");
        let cfg = Config::tiny();
        kv_example::export::reference(&cfg, dir.path()).expect("export");
        let steps = cfg.max_decode_steps();
        let (report, tokens) =
            run(&dir.path().join("program.toml"), &[plugin_dir().path().to_path_buf()], &cfg, steps)
                .expect("acceptance run");
        assert!(report.passed(), "{report}");
        let names: Vec<String> = report.checks.iter().map(|c| c.name.clone()).collect();
        for name in [
            "caches-zeroed",
            "zero-copy-bytes",
            "decode-sees-prefill",
            "ab-differs",
            "copy-back-identical",
            "next-token",
            "no-nan",
            "matches-oracle",
        ] {
            assert!(names.iter().any(|n| n == name), "missing check {name} in {names:?}");
        }
        assert_eq!(tokens.len(), steps + 1);
    }

    #[test]
    fn without_the_plugin_the_program_does_not_load() {
        let dir = tempfile::tempdir().expect("temp dir");
        let cfg = Config::tiny();
        kv_example::export::reference(&cfg, dir.path()).expect("export");
        let empty = tempfile::tempdir().expect("temp dir");
        let err = run(&dir.path().join("program.toml"), &[empty.path().to_owned()], &cfg, 1)
            .expect_err("no plugin serves ReferenceBackend");
        assert!(err.to_string().contains("no loaded plugin serves backend 'ReferenceBackend'"), "{err}");
    }
}
