//! `xtask-release`: the maintainer tasks that need heavy dependencies (HTTP, archives, plots, `cargo_metadata`,
//! the host runtime). `cargo xtask` runs it on demand (see xtask's `on_demand`), so `cargo xtask demo` never
//! compiles them: `cargo xtask release ...` is `xtask-release release ...`, likewise `dist`, `compat`,
//! `package-check` and `plot-bench`.

mod compat;
mod dist;
mod plot;
mod release;

use std::path::PathBuf;

use clap::Parser;
// The shared helpers, under the paths the tasks name them by (`crate::util`, ...).
use xtask::{executorch_setup, trt_setup, util};

#[derive(Parser)]
#[command(bin_name = "cargo xtask", about = "Release tasks of the delegate workspace")]
enum Task {
    /// Reproducible release bundles: each plugin library with its manifest, README and SHA256SUMS, and the
    /// `delegate-host` binary with the docs a plugin author needs, as `.tar.gz` plus `dist-manifest.json`.
    Dist {
        /// Output directory (default: `<target>/dist/bundles`).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Leave out the TensorRT plugin (it needs libclang and the TensorRT-RTX wheel to build).
        #[arg(long)]
        no_tensorrt: bool,
        /// Instead of bundling: build a second time in another target directory and compare the binaries
        /// byte for byte (slow: a second full release build).
        #[arg(long, conflicts_with = "out")]
        rebuild_check: bool,
    },
    /// The compatibility gate: golden blobs of every wire-format version read to the same model; the previous
    /// release's plugins (`fixtures/releases/<version>/`) load in the new host and the new plugins in its host;
    /// one entry symbol per plugin, the root interface unchanged, ABI/wire-format changes in the changelog.
    Compat {
        /// This tree's bundles, as `dist --out` wrote them (default: run `dist` first).
        #[arg(long)]
        dist: Option<PathBuf>,
        /// Build the bundles once, assemble them twice and compare every byte (and look for build-machine
        /// paths in the binaries), then gate those: what `cargo xtask test` runs.
        #[arg(long, conflicts_with = "dist")]
        reproducible: bool,
        /// Leave out the TensorRT plugin when building the bundles.
        #[arg(long)]
        no_tensorrt: bool,
    },
    /// Draw the GPU benchmark's `summary.json` (from `run.sh bench`) as an SVG bar chart.
    PlotBench {
        /// The summary written by `gpu/summarize.py`.
        summary: PathBuf,
        /// The SVG to write.
        out: PathBuf,
    },
    /// The release plan of every publishable crate (writes nothing): last release, commits since, semver check,
    /// STABILITY.md tier, proposed version and why, dependents bumped. `--execute` applies it (versions,
    /// `[workspace.dependencies]` requirements, changelogs); `--execute --registry NAME`, on the committed
    /// applied plan, publishes every publishable crate at the version its Cargo.toml carries, in dependency
    /// order, skipping versions the registry has (a failed run resumes), recording each in releases.toml and
    /// tagging it `<crate>-v<version>`. Never crates.io. What the tools it runs print goes to stderr, so
    /// stdout holds the plan (`--json`: as JSON) and the publish report.
    Release {
        #[command(flatten)]
        plan: release::command::PlanArgs,
        #[command(flatten)]
        publish: release::publish::PublishArgs,
    },
    /// Check what `cargo publish` would upload, for every publishable crate: metadata, packaged files, tests
    /// that read outside their package, dev-dependency cycles (part of `test`).
    PackageCheck,
}

fn main() -> anyhow::Result<()> {
    let root = util::project_root();
    match Task::parse() {
        Task::Dist { rebuild_check: true, no_tensorrt, .. } => dist::check_rebuild(&root, !no_tensorrt),
        Task::Dist { out, no_tensorrt, rebuild_check: false } => {
            let out = match out {
                Some(out) => std::path::absolute(out)?,
                None => dist::dist_target_dir(&root)?.join("bundles"),
            };
            dist::run(&root, &dist::Options { out, tensorrt: !no_tensorrt }).map(drop)
        }
        Task::Compat { dist: _, reproducible: true, no_tensorrt } => {
            let bundles = dist::check_reproducible(&root, !no_tensorrt)?;
            compat::run(&root, Some(&bundles), !no_tensorrt)
        }
        Task::Compat { dist, reproducible: false, no_tensorrt } => {
            let dist = dist.map(std::path::absolute).transpose()?;
            compat::run(&root, dist.as_deref(), !no_tensorrt)
        }
        Task::PlotBench { summary, out } => plot::run(&summary, &out),
        Task::PackageCheck => release::package::run(&root),
        Task::Release { plan, publish } => {
            let step = |root: &std::path::Path| {
                if publish.record_only {
                    release::publish::record_only(root, publish.allow_dirty).map(drop)
                } else {
                    release::publish::run(root, &publish.options_for(root)?).map(drop)
                }
            };
            let step: Option<release::command::Publish> =
                (publish.registry.is_some() || publish.record_only).then_some(&step as _);
            release::command::run(&root, &plan, publish.execute, step)
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    /// `cargo xtask` forwards exactly these tasks here (`xtask::on_demand::RELEASE_TASKS`): none is lost in
    /// between, and none is here that `cargo xtask` cannot reach.
    #[test]
    fn the_tasks_here_are_those_cargo_xtask_forwards() {
        let mut here: Vec<String> =
            Task::command().get_subcommands().map(|c| c.get_name().to_owned()).collect();
        here.retain(|name| name != "help");
        here.sort();
        let mut forwarded = xtask::on_demand::RELEASE_TASKS.map(str::to_owned).to_vec();
        forwarded.sort();
        assert_eq!(here, forwarded);
    }

    /// `cargo xtask test` runs `compat --reproducible`; it cannot be combined with bundles given by hand.
    #[test]
    fn compat_builds_reproducible_bundles_or_takes_given_ones() {
        let parse = |args: &[&str]| Task::try_parse_from(["xtask-release", "compat"].iter().chain(args));
        let Ok(Task::Compat { reproducible: true, dist: None, no_tensorrt: false }) =
            parse(&["--reproducible"])
        else {
            panic!("compat --reproducible does not parse");
        };
        assert!(parse(&["--reproducible", "--dist", "bundles"]).is_err());
    }
}
