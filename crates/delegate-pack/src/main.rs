//! `delegate-pack SPEC.json OUT.blob`: writes a native blob from a graph description (see the library docs).
//! Any refusal is one line `error: ... [Code]` on stderr and exit code 2, as `delegate-host` reports.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use et_error::HasErrorCode;

/// Writes a native delegate blob (reference-graph payload) from a graph description, its constants and the
/// delegate's argument order.
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    /// The spec (JSON): backend, graph description, constants file, bindings in argument order, producer.
    spec: PathBuf,
    /// Where to write the blob.
    out: PathBuf,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match delegate_pack::pack_file(&cli.spec, &cli.out) {
        Ok(header) => {
            println!(
                "{}: {} bindings, {} aliases, backend {}",
                cli.out.display(),
                header.bindings.len(),
                header.aliases.len(),
                header.backend_id
            );
            ExitCode::SUCCESS
        }
        Err(err) => {
            let message = err.to_string().replace(['\n', '\r'], " ");
            eprintln!("error: {message} [{}]", err.error_code().name());
            ExitCode::from(2)
        }
    }
}
