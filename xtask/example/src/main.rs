//! `xtask-example`: the example decoder's maintainer tasks, linked against the workspace's crates. `cargo xtask`
//! runs it (see xtask's `on_demand`): `cargo xtask export-example ...` is `xtask-example export-example ...`,
//! and `cargo xtask demo` runs `xtask-example demo` after building it beside the host.

mod acceptance;
mod demo;
mod export;

use std::path::PathBuf;

use clap::Parser;

#[derive(Parser)]
#[command(bin_name = "cargo xtask", about = "The example decoder's tasks of the delegate workspace")]
enum Task {
    /// The demo's steps after its build (`cargo xtask demo` builds, then runs this): export the example into
    /// OUT, run it through RELEASE's `delegate-host` in both modes, and check every step against the f64 model.
    #[command(hide = true)]
    Demo {
        /// The release directory holding `delegate-host` and the reference plugin with its manifest.
        release: PathBuf,
        /// Where the example program goes.
        out: PathBuf,
    },
    /// Write the example decoder's blobs and program manifest into DIR.
    ExportExample(export::Args),
}

fn main() -> anyhow::Result<()> {
    match Task::parse() {
        Task::Demo { release, out } => demo::run(&release, &out),
        Task::ExportExample(args) => export::run(&xtask::util::project_root(), args),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    /// `cargo xtask` forwards these tasks here (`xtask::on_demand::EXAMPLE_TASKS`), and `cargo xtask demo` runs
    /// `demo` after its build.
    #[test]
    fn the_tasks_cargo_xtask_forwards_are_here() {
        let cli = Task::command();
        for task in xtask::on_demand::EXAMPLE_TASKS.into_iter().chain(["demo"]) {
            assert!(cli.find_subcommand(task).is_some(), "xtask-example has no {task}");
        }
    }
}
