//! [`Executor`]: one executor of reference graphs, named, with the parts of its `Delegate` implementation every
//! such executor shares.

use blob_format::Blob;
use delegate_abi::{Compatibility, InitContext};
use ref_graph::Graph;

use crate::{blob_compatibility, read_blob, BindingPlan, Error};

/// An executor of reference graphs: the backend it serves and how it names itself in reasons. Its
/// [`delegate_abi::Delegate`] implementation answers `compatibility` with [`Executor::compatibility`] and
/// starts `init` with [`Executor::open`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Executor {
    /// The ExecuTorch backend id it serves (`ReferenceBackend`).
    pub backend: &'static str,
    /// How it names itself in reasons ("the reference delegate").
    pub name: &'static str,
}

/// A blob opened at `init`: parsed, its graph decoded and its arguments bound.
#[derive(Debug)]
pub struct Opened<'a> {
    /// The blob, borrowing the bytes `init` was given.
    pub blob: Blob<'a>,
    /// Its graph, valid.
    pub graph: Graph,
    /// Its binding plan.
    pub plan: BindingPlan,
}

impl Executor {
    /// Whether this executor can take `blob` ([`blob_compatibility`] with no refusal of its own).
    pub fn compatibility(&self, blob: &[u8]) -> Compatibility {
        blob_compatibility(blob, self.backend, self.name, |_| None)
    }

    /// The first steps of `init`: specs it has no use for are logged and ignored, the blob is read
    /// ([`read_blob`]) and its arguments are bound ([`BindingPlan::new`]).
    pub fn open<'a>(&self, ctx: &InitContext<'a>) -> Result<Opened<'a>, Error> {
        for spec in ctx.compile_specs.iter().chain(ctx.runtime_specs) {
            tracing::debug!(
                target: "ref_graph_contract",
                delegate = self.name,
                key = spec.key,
                "ignoring a spec this delegate has no use for"
            );
        }
        let (blob, graph) = read_blob(ctx.blob, self.backend, self.name)?;
        let plan = BindingPlan::new(&blob, &graph)?;
        Ok(Opened { blob, graph, plan })
    }
}
