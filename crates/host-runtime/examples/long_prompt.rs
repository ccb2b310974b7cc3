//! Writes the prompt-cache benchmark's program (BENCHMARKS.md): kv-example's `big` decoder (8 layers, 8 heads
//! of 64, 1 024 positions) for the reference backend with a 256-token prompt, into DIR, and two prompts of
//! 256 tokens sharing their first 230 (90 %) as `DIR/prompt_a.txt` and `DIR/prompt_b.txt` (comma lists, as
//! `delegate-host run --prompt` takes them).
//!
//! `cargo run --release -p host-runtime --example long_prompt -- DIR`

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::path::PathBuf::from(std::env::args().nth(1).ok_or("usage: long_prompt DIR")?);
    std::fs::create_dir_all(&dir)?;
    let prompt_a: Vec<i64> = (0..256).map(|i| (i * 37 + 5) % 256).collect();
    let prompt_b: Vec<i64> =
        prompt_a.iter().enumerate().map(|(i, &t)| if i < 230 { t } else { (t + 1) % 256 }).collect();
    let cfg = kv_example::Config { prompt: prompt_a.clone(), ..kv_example::Config::big() };
    kv_example::export::reference(&cfg, &dir)?;
    let list = |p: &[i64]| p.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
    std::fs::write(dir.join("prompt_a.txt"), list(&prompt_a))?;
    std::fs::write(dir.join("prompt_b.txt"), list(&prompt_b))?;
    println!("{}", dir.join("program.toml").display());
    Ok(())
}
