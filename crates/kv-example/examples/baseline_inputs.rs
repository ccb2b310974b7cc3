//! Writes what the PyTorch baseline (`gpu/torch_baseline.py`) reads, and what checks it:
//!
//! ```text
//! cargo run -p kv-example --example baseline_inputs -- <tiny|big> <dir> [steps]
//! ```
//!
//! - `<dir>/config.json`: [`Config::to_json`] of the preset (`--config` of the script);
//! - `<dir>/weights.f32`: every weight in [`Weights::generate`]'s draw order (token and position embeddings,
//!   per layer norm, wq, wk, wv, wo, then the final norm and the output projection), little-endian `f32`
//!   (`--check-weights` of the script compares its own draw with it bit for bit);
//! - stdout: the f64 oracle's greedy tokens over `steps` decode steps (default `max_decode_steps`) (prefill's token first).

use std::io::Write;
use std::path::PathBuf;

use kv_example::{argmax, Config, Oracle, Weights};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: baseline_inputs <tiny|big> <dir> [steps]";
    // TODO(lead): add the benchmark presets (a)/(b)/(c) here once they exist on Config.
    let cfg = match args.next().as_deref() {
        Some("tiny") => Config::tiny(),
        Some("big") => Config::big(),
        _ => return Err(usage.into()),
    };
    let dir = PathBuf::from(args.next().ok_or(usage)?);
    let steps = match args.next() {
        Some(s) => s.parse::<usize>()?.min(cfg.max_decode_steps()),
        None => cfg.max_decode_steps(),
    };
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("config.json"), cfg.to_json() + "\n")?;

    let w = Weights::generate(&cfg);
    let mut out = std::io::BufWriter::new(std::fs::File::create(dir.join("weights.f32"))?);
    let mut tensors: Vec<&[f32]> = vec![&w.tok_emb, &w.pos_emb];
    for l in &w.layers {
        tensors.extend([&l.norm[..], &l.wq[..], &l.wk[..], &l.wv[..], &l.wo[..]]);
    }
    tensors.extend([&w.final_norm[..], &w.w_out[..]]);
    for t in tensors {
        for v in t {
            out.write_all(&v.to_le_bytes())?;
        }
    }
    out.flush()?;

    let mut oracle = Oracle::new(&cfg);
    let prompt = oracle.prefill(&cfg.prompt)?;
    let last = prompt.last().ok_or("empty prompt")?;
    let as_f32 = |l: &[f64]| l.iter().map(|&x| x as f32).collect::<Vec<_>>();
    let mut token = argmax(&as_f32(last)) as i64;
    let mut tokens = vec![token];
    for position in cfg.prompt.len()..cfg.prompt.len() + steps {
        token = argmax(&as_f32(&oracle.decode(token, position)?)) as i64;
        tokens.push(token);
    }
    println!("oracle tokens: {tokens:?}");
    Ok(())
}
