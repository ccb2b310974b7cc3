//! The reference delegate's per-call argument checks, against the blob's binding plan.

use blob_format::model::Role;
use delegate_abi::check::{check_arg, check_count, ArgError};
use delegate_abi::TensorArg;
use ref_graph_contract::BindingPlan;

use super::{Error, DIRECT_ACCESS};

/// Checks every argument of a call against the plan, before anything runs.
pub(super) fn check(plan: &BindingPlan, args: &[TensorArg]) -> Result<(), Error> {
    let specs = plan.args();
    if args.len() != specs.len() {
        // `check_count` collects the names (an allocation), so it runs only to word the refusal: a call
        // allocates nothing (tests/hf_forms.rs counts).
        check_count(specs.iter().map(|a| a.name.as_str()), args.len())?;
    }
    for (position, (spec, arg)) in specs.iter().zip(args).enumerate() {
        let bad = |problem: String| Error::from(ArgError::arg(position, &spec.name, problem));
        if spec.aliased_input {
            // This delegate computes on the CPU: host-visible memory is the storage it updates in place.
            // The gate also refuses a zero-byte cache, which would make the update land nowhere.
            DIRECT_ACCESS
                .check(&spec.name, arg.memory(), arg.nbytes)
                .map_err(|source| Error::Residency { position, source })?;
        }
        check_arg(position, &spec.expected(), arg)?;
        if !arg.memory().is_host_visible() {
            return Err(bad(format!(
                "is {} memory; the reference delegate computes on the CPU and reads host, pinned or \
                 managed memory",
                arg.memory()
            )));
        }
        let align = spec.dtype.size_bytes();
        if spec.aliased_input && (arg.data as usize) % align != 0 {
            return Err(bad(format!(
                "is not {align}-byte aligned, which {} caches updated in place need",
                spec.dtype.name()
            )));
        }
        // A written argument may share storage only with the input its slot aliases, and only exactly.
        if spec.role == Role::Output || spec.aliased_input {
            for (other, other_arg) in args.iter().enumerate().filter(|&(o, _)| o != position) {
                let in_place_pair =
                    spec.aliases_arg == Some(other) || specs[other].aliases_arg == Some(position);
                if in_place_pair && arg.same_storage(other_arg) {
                    continue;
                }
                if arg.overlaps(other_arg) {
                    return Err(bad(format!(
                        "shares storage with argument {other} ('{}'); only an aliased output slot may, and \
                         only as exactly its input's storage",
                        specs[other].name
                    )));
                }
            }
        }
    }
    Ok(())
}
