//! The binding plan: every argument position of a blob resolved once to its graph tensor.

use alias_validate::{validate_with_engine, ArgLayout, ValidKind};
use blob_format::model::Role;
use blob_format::Blob;
use delegate_abi::check::Expected;
use delegate_abi::DTypeCode;
use ref_graph::{Graph, TensorId};

use crate::Error;

/// What one argument position must carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgSpec {
    /// The graph tensor it binds (by name, from the blob's binding).
    pub tensor: TensorId,
    /// The tensor's name.
    pub name: String,
    /// Input or output of the graph.
    pub role: Role,
    /// Element type.
    pub dtype: DTypeCode,
    /// Extents.
    pub shape: Vec<i64>,
    /// Size in bytes.
    pub nbytes: u64,
    /// Whether an output aliases it: the graph updates it in place.
    pub aliased_input: bool,
    /// For an aliased output slot, the argument position of the input it aliases.
    pub aliases_arg: Option<usize>,
}

impl ArgSpec {
    /// What a call's argument at this position must be, for delegate-abi's [`delegate_abi::check::check_arg`]:
    /// written when it is an output or an input the graph updates in place.
    pub fn expected(&self) -> Expected<'_> {
        Expected {
            name: &self.name,
            dtype: self.dtype,
            shape: &self.shape,
            nbytes: self.nbytes,
            written: self.role == Role::Output || self.aliased_input,
        }
    }
}

/// The binding plan computed once at `init`: every argument position resolved to a graph tensor by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindingPlan {
    args: Vec<ArgSpec>,
}

impl BindingPlan {
    /// Every argument position, in delegate-argument order.
    pub fn args(&self) -> &[ArgSpec] {
        &self.args
    }

    /// The plan of `blob`'s arguments against `graph`: every position resolved to its graph tensor by the
    /// binding's name, with its dtype, extents and aliasing (the alias table checked against the graph; a
    /// `user` alias is refused, since an executor of reference graphs runs only the aliases its graph
    /// performs). For every executor of reference graphs.
    pub fn new(blob: &Blob<'_>, graph: &Graph) -> Result<BindingPlan, Error> {
        let aliases = validate_with_engine(&blob.header, graph)?;
        for warning in aliases.warnings() {
            tracing::warn!(target: "ref_graph_contract", "{warning}");
        }
        if let Some(user) = aliases.aliases().iter().find(|a| a.kind == ValidKind::User) {
            return Err(Error::UserAlias { output: user.output.clone(), input: user.input.clone() });
        }
        // Positions, aliased inputs and in-place slots come from the shared layout; this plan adds what only
        // the graph knows: the tensor, its type and its extents.
        let layout = ArgLayout::new(&blob.header, &aliases)?;
        let args = layout
            .slots()
            .iter()
            .map(|slot| {
                let tensor = graph.find(&slot.name).ok_or_else(|| Error::Binding {
                    name: slot.name.clone(),
                    problem: "no graph tensor has this name".to_owned(),
                })?;
                let decl = graph.tensor(tensor);
                Ok(ArgSpec {
                    tensor,
                    name: slot.name.clone(),
                    role: slot.role,
                    dtype: DTypeCode::try_from(decl.dtype.dtype()).map_err(|err| Error::Binding {
                        name: slot.name.clone(),
                        problem: err.to_string(),
                    })?,
                    shape: abi_shape(&slot.name, &decl.shape)?,
                    nbytes: decl.nbytes() as u64,
                    aliased_input: slot.is_alias_target(),
                    aliases_arg: slot.in_place_of(),
                })
            })
            .collect::<Result<_, Error>>()?;
        Ok(BindingPlan { args })
    }
}

/// A graph tensor's extents as the ABI carries them (`i64`, at most [`delegate_abi::MAX_RANK`] of them).
fn abi_shape(name: &str, shape: &[u64]) -> Result<Vec<i64>, Error> {
    shape
        .iter()
        .map(|&d| i64::try_from(d))
        .collect::<Result<Vec<_>, _>>()
        .ok()
        .filter(|s| s.len() <= delegate_abi::MAX_RANK)
        .ok_or_else(|| Error::Binding {
            name: name.to_owned(),
            problem: format!("shape {shape:?} cannot be passed as a tensor argument"),
        })
}
