//! Isolation where there is none: worker processes run on Linux only, so elsewhere [`Isolation`] and
//! [`IsolatedPlugin`] are uninhabited. The registry and the program loader name them on every platform; here no
//! value of either exists, so every isolated path is statically unreachable (no cfg'd variants or fields).

use std::path::PathBuf;
use std::sync::Arc;

use delegate_abi::PluginInfo;

/// How isolated plugins are run: no value exists on this platform (workers run on Linux only).
#[derive(Debug, Clone)]
pub enum Isolation {}

impl Isolation {
    /// Whether a plugin with this manifest flag runs isolated: never asked, no value exists.
    pub(crate) fn applies(&self, _manifest_asks: bool) -> bool {
        match *self {}
    }
}

/// A plugin library that runs in worker processes: no value exists on this platform.
#[derive(Debug, Clone)]
pub enum IsolatedPlugin {}

impl IsolatedPlugin {
    /// Unreachable: it takes an [`Isolation`], of which no value exists here.
    pub(crate) fn new(_library: PathBuf, _info: PluginInfo, isolation: Arc<Isolation>) -> IsolatedPlugin {
        match *isolation {}
    }

    /// What its manifest says it is: never asked, no value exists.
    pub fn info(&self) -> &PluginInfo {
        match *self {}
    }
}
