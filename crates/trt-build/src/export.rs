//! From a built engine to a blob header: bindings by name in the caller's argument order, the alias table as
//! TensorRT reported it, the engine library version recorded.

use blob_format::model::{Alias, AliasKind, Binding, Header, PayloadKind, Producer, Role, TENSORRT_BACKEND};

use trt_exec::IoTensor;

use crate::error::{Error, Result};
use crate::network::BuiltEngine;

/// The blob header for `built`, binding the engine tensors named in `arg_order` as delegate arguments in
/// that order (all inputs and outputs, any order: binding is by name). Engine tensors missing from
/// `arg_order` are recorded unthreaded (allowed only for aliased outputs; validation refuses the rest).
///
/// # Errors
/// [`Error::Network`] when `arg_order` names a tensor the engine lacks or names one twice.
pub fn header_for(built: &BuiltEngine, arg_order: &[&str]) -> Result<Header> {
    let mut bindings = Vec::with_capacity(built.io.tensors.len());
    for (position, name) in arg_order.iter().enumerate() {
        if arg_order[..position].contains(name) {
            return Err(Error::Network {
                node: (*name).to_owned(),
                message: "listed twice in the argument order".into(),
            });
        }
        let tensor = built.io.tensor(name).ok_or_else(|| Error::Network {
            node: (*name).to_owned(),
            message: "the argument order names a tensor the engine does not have".into(),
        })?;
        bindings.push(binding(tensor, true));
    }
    for tensor in &built.io.tensors {
        if !arg_order.contains(&tensor.name.as_str()) {
            bindings.push(binding(tensor, false));
        }
    }
    let aliases = built
        .io
        .aliases
        .iter()
        .map(|a| Alias { output: a.output.clone(), input: a.input.clone(), kind: AliasKind::KvCacheUpdate })
        .collect();
    Ok(Header {
        producer: Some(Producer {
            name: "kv-delegate trt-build".to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
        }),
        backend_id: TENSORRT_BACKEND.to_owned(),
        payload_kind: PayloadKind::TensorRtPlan,
        bindings,
        aliases,
        device_id: 0,
        hardware_compatible: false,
        hardware_target: None,
        engine_library_version: built.io.library.clone(),
        engine_metadata: None,
    })
}

fn binding(tensor: &IoTensor, threaded: bool) -> Binding {
    Binding {
        name: tensor.name.clone(),
        role: Role::from(tensor.mode),
        dtype: tensor.dtype(),
        shape: Some(tensor.dims()),
        threaded,
    }
}

/// A native blob (backend `TensorRTBackend`, payload `tensorrt-plan`) holding `built`'s plan.
///
/// # Errors
/// As [`header_for`].
pub fn native_blob(built: &BuiltEngine, arg_order: &[&str]) -> Result<(Header, Vec<u8>)> {
    let header = header_for(built, arg_order)?;
    let blob = blob_format::native::to_vec(&header, &built.plan);
    Ok((header, blob))
}

/// `header` as upstream TR01/TR02 can express it: no producer, no library version, untyped bindings (upstream
/// writes dtypes and shapes empty), every binding threaded.
pub fn upstream_header(header: &Header) -> Header {
    let mut up = header.clone();
    up.producer = None;
    up.engine_library_version = None;
    for binding in &mut up.bindings {
        binding.dtype = None;
        binding.shape = None;
        binding.threaded = true;
    }
    up
}

/// An upstream TR02 blob (TR01 when there are no aliases) holding `built`'s plan, as Torch-TensorRT 2.14 writes.
///
/// # Errors
/// [`Error::Network`] for a bad `arg_order`; [`Error::Upstream`] when TR02 cannot express the header
/// (e.g. an input listed after an output).
pub fn tr02_blob(built: &BuiltEngine, arg_order: &[&str]) -> Result<(Header, Vec<u8>)> {
    let header = upstream_header(&header_for(built, arg_order)?);
    let blob = blob_format::upstream::write_tr02(&header, &built.plan)?;
    Ok((header, blob))
}
