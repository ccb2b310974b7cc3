//! Writes the prompt-cache benchmark's program (BENCHMARKS.md) into DIR with two prompts of 256 tokens sharing
//! their first 230 (90 %) as `DIR/prompt_a.txt` and `DIR/prompt_b.txt` (comma lists, as `delegate-host run
//! --prompt` takes them):
//! - by default kv-example's `big` decoder (8 layers, 8 heads of 64, 1 024 positions, f32) for the reference
//!   backend, host memory;
//! - with `cuda`, the GPU benchmark's config (b) (8 layers, 8 heads of 64, 1 024 positions, f16, vocab 512)
//!   for the CUDA delegate, caches and inputs in device memory.
//!
//! `cargo run --release -p host-runtime --example long_prompt -- DIR [cuda]`

use kv_example::export::{Backend, Target};
use kv_example::{BenchConfig, Config};
use program_manifest::MemoryKind;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = std::path::PathBuf::from(args.next().ok_or("usage: long_prompt DIR [cuda]")?);
    let cuda = match args.next().as_deref() {
        None => false,
        Some("cuda") => true,
        Some(other) => return Err(format!("unknown target '{other}': say `cuda` or nothing").into()),
    };
    std::fs::create_dir_all(&dir)?;
    let base = if cuda { Config::bench(BenchConfig::B) } else { Config::big() };
    let vocab = base.vocab as i64;
    let prompt_a: Vec<i64> = (0..256).map(|i| (i * 37 + 5) % vocab).collect();
    let prompt_b: Vec<i64> =
        prompt_a.iter().enumerate().map(|(i, &t)| if i < 230 { t } else { (t + 1) % vocab }).collect();
    let cfg = Config { prompt: prompt_a.clone(), ..base };
    if cuda {
        kv_example::export::program(
            &cfg,
            &dir,
            &Target { backend: Backend::Cuda, memory: MemoryKind::Device },
        )?;
    } else {
        kv_example::export::reference(&cfg, &dir)?;
    }
    let list = |p: &[i64]| p.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
    std::fs::write(dir.join("prompt_a.txt"), list(&prompt_a))?;
    std::fs::write(dir.join("prompt_b.txt"), list(&prompt_b))?;
    println!("{}", dir.join("program.toml").display());
    Ok(())
}
