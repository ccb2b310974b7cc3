//! A named registry's sparse index, read over HTTP(S): which versions of a crate it already has.
//!
//! The index URL comes from cargo's own configuration, read the way cargo reads it (`cargo config get` is
//! unstable): the `CARGO_REGISTRIES_<NAME>_INDEX` environment variable first, then `[registries.<name>] index`
//! in `.cargo/config.toml` (or `.cargo/config`) of the workspace root and each directory above it, then in
//! `$CARGO_HOME/config.toml`. Only sparse registries (`sparse+http://`, `sparse+https://`) are read; crates.io
//! is refused outright, by name and by index URL, so nothing here can lead to a public publish.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

/// The registry name cargo reserves for crates.io.
pub const CRATES_IO: &str = "crates-io";

/// Index URLs of crates.io, sparse and git; a registry configured with one of them is crates.io by another name.
const CRATES_IO_INDEXES: [&str; 3] =
    ["sparse+https://index.crates.io", "https://github.com/rust-lang/crates.io-index", "index.crates.io"];

/// A sparse registry index, by the name cargo knows it under.
#[derive(Clone, Debug)]
pub struct Index {
    /// The registry's name (`--registry NAME`).
    pub name: String,
    /// The index's HTTP(S) base URL, without the `sparse+` prefix, ending in `/`.
    pub url: String,
    /// The token sent when the registry's `config.json` says `auth-required`.
    token: Option<String>,
    /// The HTTP client, with a timeout so a registry that stops answering fails the run instead of hanging it.
    agent: ureq::Agent,
    /// `config.json`'s `auth-required`, read once.
    auth_required: std::sync::OnceLock<bool>,
}

impl Index {
    /// Finds registry `name`'s index in cargo's configuration as seen from the workspace at `root`; `env`
    /// looks up environment variables (the process's, plus what the caller sets for cargo).
    pub fn for_registry(
        name: &str,
        root: &Path,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> anyhow::Result<Index> {
        refuse_crates_io(name)?;
        let env_name = env_key(name);
        let configured = match env(&format!("CARGO_REGISTRIES_{env_name}_INDEX")) {
            Some(url) => url,
            None => index_from_config_files(name, &config_files(root, env))?.with_context(|| {
                format!(
                    "registry `{name}` is not configured: set CARGO_REGISTRIES_{env_name}_INDEX or add \
                     `[registries.{name}] index = \"sparse+https://...\"` to .cargo/config.toml"
                )
            })?,
        };
        if CRATES_IO_INDEXES.iter().any(|known| configured.contains(known)) {
            bail!("registry `{name}` is crates.io ({configured}); this task never publishes to crates.io");
        }
        let Some(url) = configured.strip_prefix("sparse+") else {
            bail!("registry `{name}` has the index {configured}: only sparse registries (`sparse+http(s)://`) are supported");
        };
        let url = if url.ends_with('/') { url.to_owned() } else { format!("{url}/") };
        let token = env(&format!("CARGO_REGISTRIES_{env_name}_TOKEN"));
        let agent =
            ureq::Agent::config_builder().timeout_global(Some(std::time::Duration::from_secs(60))).build();
        Ok(Index {
            name: name.to_owned(),
            url,
            token,
            agent: agent.into(),
            auth_required: Default::default(),
        })
    }

    /// The versions of `krate` the index lists (yanked ones included: cargo refuses to publish them again).
    pub fn versions(&self, krate: &str) -> anyhow::Result<BTreeSet<semver::Version>> {
        let auth = self.auth_required()?;
        let url = format!("{}{}", self.url, index_path(krate));
        let mut request = self.agent.get(&url);
        if auth {
            if let Some(token) = &self.token {
                request = request.header("Authorization", token);
            }
        }
        let mut response = match request.call() {
            Ok(response) => response,
            // What cargo itself takes for "no such crate".
            Err(ureq::Error::StatusCode(404 | 410 | 451)) => return Ok(BTreeSet::new()),
            Err(err) => return Err(err).with_context(|| format!("reading {url}")),
        };
        let text = response.body_mut().read_to_string().with_context(|| format!("reading {url}"))?;
        parse_versions(&text).with_context(|| format!("parsing {url}"))
    }

    /// Whether `config.json` asks for the token on every request (`"auth-required": true`).
    fn auth_required(&self) -> anyhow::Result<bool> {
        if let Some(required) = self.auth_required.get() {
            return Ok(*required);
        }
        let url = format!("{}config.json", self.url);
        let text = self
            .agent
            .get(&url)
            .call()
            .and_then(|mut r| r.body_mut().read_to_string())
            .with_context(|| format!("reading registry `{}`'s {url}", self.name))?;
        let config: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("parsing {url}"))?;
        let required = config.get("auth-required").and_then(serde_json::Value::as_bool).unwrap_or(false);
        Ok(*self.auth_required.get_or_init(|| required))
    }
}

/// Refuses crates.io by name: publishing there is for a human, never for this task or its tests.
pub fn refuse_crates_io(name: &str) -> anyhow::Result<()> {
    if name == CRATES_IO {
        bail!("refusing `--registry {CRATES_IO}`: this task never publishes to crates.io");
    }
    Ok(())
}

/// The `<NAME>` of cargo's `CARGO_REGISTRIES_<NAME>_*` environment variables.
pub fn env_key(name: &str) -> String {
    name.to_ascii_uppercase().replace('-', "_")
}

/// A crate's file in a sparse index, relative to the index root: `1/a`, `2/ab`, `3/a/abc`, `ab/cd/abcd...`,
/// all lower case.
pub fn index_path(krate: &str) -> String {
    let name = krate.to_ascii_lowercase();
    match name.len() {
        1 => format!("1/{name}"),
        2 => format!("2/{name}"),
        3 => format!("3/{}/{name}", &name[..1]),
        _ => format!("{}/{}/{name}", &name[..2], &name[2..4]),
    }
}

/// The `vers` of every line of an index file (one JSON object per line).
fn parse_versions(text: &str) -> anyhow::Result<BTreeSet<semver::Version>> {
    #[derive(serde::Deserialize)]
    struct Line {
        vers: semver::Version,
    }
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| Ok(serde_json::from_str::<Line>(line)?.vers))
        .collect()
}

/// Cargo's configuration files as seen from `root`, the ones that win first.
fn config_files(root: &Path, env: &dyn Fn(&str) -> Option<String>) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for dir in root.ancestors() {
        files.push(dir.join(".cargo").join("config.toml"));
        files.push(dir.join(".cargo").join("config"));
    }
    let cargo_home = env("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env("HOME").map(|home| PathBuf::from(home).join(".cargo")));
    if let Some(home) = cargo_home {
        files.push(home.join("config.toml"));
        files.push(home.join("config"));
    }
    files
}

/// `[registries.<name>] index` of the first file in `files` that sets it.
fn index_from_config_files(name: &str, files: &[PathBuf]) -> anyhow::Result<Option<String>> {
    for file in files {
        let text = match std::fs::read_to_string(file) {
            Ok(text) => text,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
            Err(err) => return Err(err).with_context(|| format!("reading {}", file.display())),
        };
        let config: toml::Table = toml::from_str(&text).with_context(|| format!("{}", file.display()))?;
        let index = config
            .get("registries")
            .and_then(|r| r.get(name))
            .and_then(|r| r.get("index"))
            .and_then(toml::Value::as_str);
        if let Some(index) = index {
            return Ok(Some(index.to_owned()));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_paths_follow_cargos_rules() {
        assert_eq!(index_path("a"), "1/a");
        assert_eq!(index_path("ab"), "2/ab");
        assert_eq!(index_path("abc"), "3/a/abc");
        assert_eq!(index_path("et-error"), "et/-e/et-error");
        assert_eq!(index_path("Blob_Format"), "bl/ob/blob_format");
    }

    #[test]
    fn index_lines_list_their_versions() {
        let text =
            "{\"name\":\"x\",\"vers\":\"0.1.0\",\"deps\":[]}\n\n{\"name\":\"x\",\"vers\":\"0.2.0-rc.1\"}\n";
        let versions: Vec<String> =
            parse_versions(text).expect("parses").iter().map(|v| v.to_string()).collect();
        assert_eq!(versions, ["0.1.0", "0.2.0-rc.1"]);
        assert!(parse_versions("not json").is_err());
    }

    #[test]
    fn the_nearest_config_file_names_the_index_and_crates_io_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let inner = dir.path().join("ws");
        std::fs::create_dir_all(inner.join(".cargo")).expect("mkdir");
        std::fs::create_dir_all(dir.path().join(".cargo")).expect("mkdir");
        std::fs::write(
            inner.join(".cargo/config.toml"),
            "[registries.local]\nindex = \"sparse+http://127.0.0.1:1/index/\"\n",
        )
        .expect("write");
        std::fs::write(
            dir.path().join(".cargo/config.toml"),
            "[registries.local]\nindex = \"sparse+http://outer/\"\n[registries.other]\nindex = \"sparse+http://o/\"\n",
        )
        .expect("write");
        let no_env = |_: &str| None;
        let files = config_files(&inner, &no_env);
        assert_eq!(
            index_from_config_files("local", &files).expect("reads").as_deref(),
            Some("sparse+http://127.0.0.1:1/index/")
        );
        assert_eq!(
            index_from_config_files("other", &files).expect("reads").as_deref(),
            Some("sparse+http://o/")
        );
        assert_eq!(index_from_config_files("missing", &files).expect("reads"), None);
        assert!(Index::for_registry(CRATES_IO, &inner, &no_env).is_err());
        let env = |key: &str| {
            (key == "CARGO_REGISTRIES_CRATES_MIRROR_INDEX")
                .then(|| "sparse+https://index.crates.io/".to_owned())
        };
        let err = Index::for_registry("crates-mirror", &inner, &env).expect_err("crates.io by another name");
        assert!(err.to_string().contains("never publishes to crates.io"), "{err}");
        let index = Index::for_registry("local", &inner, &no_env).expect("configured");
        assert_eq!(index.url, "http://127.0.0.1:1/index/");
        assert_eq!(env_key("my-reg"), "MY_REG");
    }
}
