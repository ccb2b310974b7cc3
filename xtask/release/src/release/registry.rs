//! A sparse-index cargo registry on the loopback interface, for tests: what `cargo publish` uploads, cargo can
//! resolve and download from it again.
//!
//! It serves, at `http://127.0.0.1:PORT`:
//! - `/index/config.json`: `{"dl": ".../dl", "api": "..."}`;
//! - `/index/<1|2|3/a|ab/cd>/<name>`: the index file of each crate, one JSON line per version (cargo's
//!   "registry index format");
//! - `PUT /api/v1/crates/new`: a publish (cargo's "registry web API": a `u32` LE length, the JSON metadata, a
//!   `u32` LE length, the `.crate`). Like crates.io it refuses a version it has, a publish without a token and
//!   a dependency on a crate of its own that it does not have (so an out-of-order publish fails here as it
//!   would there);
//! - `/dl/<name>/<version>/download`: the `.crate` files.
//!
//! It binds `127.0.0.1:0` and stops when dropped. It keeps everything in memory.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use anyhow::{bail, Context};
use serde_json::{json, Value};

use super::index::index_path;

/// What the registry holds and what it was asked.
#[derive(Debug, Default)]
struct State {
    /// Index lines by lower-case crate name, in publish order.
    index: BTreeMap<String, Vec<Value>>,
    /// `.crate` files by (name, version).
    crates: BTreeMap<(String, String), Vec<u8>>,
    /// The crates published, in the order they were uploaded.
    published: Vec<String>,
    /// A crate whose uploads are refused, to interrupt a run.
    refused: Option<String>,
}

/// A running loopback registry; dropping it stops the server.
pub struct TestRegistry {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    server: Arc<tiny_http::Server>,
    thread: Option<JoinHandle<()>>,
}

impl TestRegistry {
    /// Starts a registry on a free port of 127.0.0.1.
    pub fn start() -> anyhow::Result<TestRegistry> {
        let server = tiny_http::Server::http("127.0.0.1:0")
            .map_err(|err| anyhow::anyhow!("binding 127.0.0.1:0: {err}"))?;
        let addr = server.server_addr().to_ip().context("the test registry listens on IP")?;
        let server = Arc::new(server);
        let state = Arc::new(Mutex::new(State::default()));
        let thread = {
            let (server, state) = (Arc::clone(&server), Arc::clone(&state));
            let base = format!("http://{addr}");
            std::thread::spawn(move || {
                for request in server.incoming_requests() {
                    serve(request, &base, &state);
                }
            })
        };
        Ok(TestRegistry { addr, state, server, thread: Some(thread) })
    }

    /// The index URL to give cargo: `sparse+http://127.0.0.1:PORT/index/`.
    pub fn index_url(&self) -> String {
        format!("sparse+http://{}/index/", self.addr)
    }

    /// The crates published so far, in upload order.
    pub fn published(&self) -> Vec<String> {
        self.lock().published.clone()
    }

    /// Refuses every upload of `krate` (a registry outage, say) until called again with `None`.
    pub fn refuse(&self, krate: Option<&str>) {
        self.lock().refused = krate.map(str::to_owned);
    }

    /// The index lines of `krate`, one per version.
    pub fn index_entries(&self, krate: &str) -> Vec<Value> {
        self.lock().index.get(&krate.to_ascii_lowercase()).cloned().unwrap_or_default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Answers one request.
fn serve(mut request: tiny_http::Request, base: &str, state: &Mutex<State>) {
    let url = request.url().split('?').next().unwrap_or_default().to_owned();
    let method = request.method().clone();
    let (status, body): (u16, Vec<u8>) = match (&method, url.as_str()) {
        (tiny_http::Method::Get, "/index/config.json") => {
            (200, json!({ "dl": format!("{base}/dl"), "api": base }).to_string().into_bytes())
        }
        (tiny_http::Method::Get, path) if path.starts_with("/index/") => {
            let name = path.rsplit('/').next().unwrap_or_default();
            let state = state.lock().unwrap_or_else(PoisonError::into_inner);
            match state.index.get(&name.to_ascii_lowercase()) {
                Some(lines) if path == format!("/index/{}", index_path(name)) => {
                    let text: Vec<String> = lines.iter().map(Value::to_string).collect();
                    (200, (text.join("\n") + "\n").into_bytes())
                }
                _ => (404, b"not found".to_vec()),
            }
        }
        (tiny_http::Method::Get, path) if path.starts_with("/dl/") => {
            let parts: Vec<&str> = path.trim_start_matches("/dl/").split('/').collect();
            let state = state.lock().unwrap_or_else(PoisonError::into_inner);
            match parts.as_slice() {
                [name, version, "download"] => {
                    match state.crates.get(&(name.to_string(), version.to_string())) {
                        Some(bytes) => (200, bytes.clone()),
                        None => (404, b"not found".to_vec()),
                    }
                }
                _ => (404, b"not found".to_vec()),
            }
        }
        (tiny_http::Method::Put, "/api/v1/crates/new") => {
            let authorized =
                request.headers().iter().any(|h| h.field.equiv("Authorization") && !h.value.is_empty());
            let mut body = Vec::new();
            let read = request.as_reader().read_to_end(&mut body);
            let result = match (authorized, read) {
                (false, _) => Err(anyhow::anyhow!("publishing needs a token")),
                (true, Err(err)) => Err(err.into()),
                (true, Ok(_)) => publish(&body, state),
            };
            match result {
                Ok(()) => (
                    200,
                    json!({ "warnings": { "invalid_categories": [], "invalid_badges": [], "other": [] } })
                        .to_string()
                        .into_bytes(),
                ),
                Err(err) => {
                    (400, json!({ "errors": [{ "detail": format!("{err:#}") }] }).to_string().into_bytes())
                }
            }
        }
        _ => (404, b"not found".to_vec()),
    };
    let response = tiny_http::Response::from_data(body).with_status_code(status);
    // A client that hung up is its own problem; the registry keeps serving.
    let _ = request.respond(response);
}

/// Stores one upload: the `.crate` and its index line, converted from the publish metadata.
fn publish(body: &[u8], state: &Mutex<State>) -> anyhow::Result<()> {
    let (meta, rest) = split_length_prefixed(body).context("the metadata")?;
    let (krate, _) = split_length_prefixed(rest).context("the .crate")?;
    let meta: Value = serde_json::from_slice(meta).context("the metadata is not JSON")?;
    let name = meta["name"].as_str().context("metadata without a name")?.to_owned();
    let vers = meta["vers"].as_str().context("metadata without a version")?.to_owned();
    let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
    let key = name.to_ascii_lowercase();
    if state.refused.as_deref() == Some(name.as_str()) {
        bail!("uploads of {name} are refused for now");
    }
    if state.index.get(&key).is_some_and(|lines| lines.iter().any(|l| l["vers"] == vers.as_str())) {
        bail!("crate {name}@{vers} already exists");
    }
    let mut deps = Vec::new();
    for dep in meta["deps"].as_array().context("metadata without deps")? {
        let package = dep["name"].as_str().context("a dependency without a name")?;
        let registry = dep.get("registry").cloned().unwrap_or(Value::Null);
        if registry.is_null() && !state.index.contains_key(&package.to_ascii_lowercase()) {
            bail!("{name}@{vers} depends on {package}, which this registry does not have");
        }
        let (dep_name, dep_package) = match dep.get("explicit_name_in_toml").and_then(Value::as_str) {
            Some(renamed) => (renamed.to_owned(), Value::from(package)),
            None => (package.to_owned(), Value::Null),
        };
        deps.push(json!({
            "name": dep_name,
            "req": dep["version_req"],
            "features": dep["features"],
            "optional": dep["optional"],
            "default_features": dep["default_features"],
            "target": dep["target"],
            "kind": dep["kind"],
            "registry": registry,
            "package": dep_package,
        }));
    }
    let line = json!({
        "name": name,
        "vers": vers,
        "deps": deps,
        "cksum": crate::dist::archive::sha256_hex(krate),
        "features": meta.get("features").cloned().unwrap_or_else(|| json!({})),
        "yanked": false,
        "links": meta.get("links").cloned().unwrap_or(Value::Null),
        "rust_version": meta.get("rust_version").cloned().unwrap_or(Value::Null),
        "v": 2,
    });
    state.index.entry(key).or_default().push(line);
    state.crates.insert((name.clone(), vers), krate.to_vec());
    state.published.push(name);
    Ok(())
}

/// Splits `u32 LE length, that many bytes, rest`.
fn split_length_prefixed(bytes: &[u8]) -> anyhow::Result<(&[u8], &[u8])> {
    let (len, rest) = bytes.split_first_chunk::<4>().context("truncated length")?;
    let len = usize::try_from(u32::from_le_bytes(*len))?;
    if rest.len() < len {
        bail!("{len} bytes announced, {} sent", rest.len());
    }
    Ok(rest.split_at(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upload(registry: &TestRegistry, meta: Value, token: bool) -> Result<String, ureq::Error> {
        let meta = meta.to_string().into_bytes();
        let krate = b"not really a tarball".to_vec();
        let mut body = Vec::new();
        body.extend_from_slice(&u32::try_from(meta.len()).expect("small").to_le_bytes());
        body.extend_from_slice(&meta);
        body.extend_from_slice(&u32::try_from(krate.len()).expect("small").to_le_bytes());
        body.extend_from_slice(&krate);
        let mut request = ureq::put(format!("http://{}/api/v1/crates/new", registry.addr));
        if token {
            request = request.header("Authorization", "secret");
        }
        request.send(&body[..])?.body_mut().read_to_string()
    }

    #[test]
    fn uploads_become_index_lines_and_downloads() {
        let registry = TestRegistry::start().expect("starts");
        let base = format!("http://{}", registry.addr);
        let config = ureq::get(format!("{base}/index/config.json"))
            .call()
            .expect("config.json")
            .body_mut()
            .read_to_string()
            .expect("text");
        assert_eq!(serde_json::from_str::<Value>(&config).expect("json")["api"], base.as_str());

        let leaf = json!({"name": "leaf", "vers": "0.1.0", "deps": [], "features": {}});
        assert!(upload(&registry, leaf.clone(), false).is_err(), "no token, no publish");
        let dep = json!({"name": "leaf", "version_req": "^0.1", "features": [], "optional": false,
            "default_features": true, "target": null, "kind": "normal", "explicit_name_in_toml": "renamed"});
        let top = json!({"name": "top", "vers": "1.0.0", "deps": [dep], "features": {}});
        assert!(upload(&registry, top.clone(), true).is_err(), "its dependency is not published yet");
        upload(&registry, leaf.clone(), true).expect("publishes");
        assert!(upload(&registry, leaf, true).is_err(), "a version is published once");
        upload(&registry, top, true).expect("publishes");
        assert_eq!(registry.published(), ["leaf", "top"]);

        let index = ureq::get(format!("{base}/index/{}", index_path("top")))
            .call()
            .expect("index file")
            .body_mut()
            .read_to_string()
            .expect("text");
        let line: Value = serde_json::from_str(index.trim()).expect("one json line");
        assert_eq!(line["deps"][0]["name"], "renamed");
        assert_eq!(line["deps"][0]["package"], "leaf");
        assert_eq!(line["deps"][0]["req"], "^0.1");
        assert_eq!(line["cksum"], crate::dist::archive::sha256_hex(b"not really a tarball").as_str());
        let download = ureq::get(format!("{base}/dl/top/1.0.0/download"))
            .call()
            .expect("download")
            .body_mut()
            .read_to_vec()
            .expect("bytes");
        assert_eq!(download, b"not really a tarball");
        assert!(ureq::get(format!("{base}/index/2/top")).call().is_err(), "the wrong index path is a 404");
    }
}
