//! The manifest declarations of a `.pte` method's tensors: element types, shapes, names.

use std::collections::BTreeSet;

use blob_format::model::DType;
use program_manifest::{MemoryKind, TensorDecl};
use pte_format::model::{Method, MutableBuffer, ScalarType, Tensor};

use super::Problem;

fn dtype(scalar: ScalarType) -> Option<DType> {
    Some(match scalar {
        ScalarType::Float => DType::F32,
        ScalarType::Half => DType::F16,
        ScalarType::BFloat16 => DType::BF16,
        ScalarType::Double => DType::F64,
        ScalarType::Char => DType::I8,
        ScalarType::Byte => DType::U8,
        ScalarType::Int => DType::I32,
        ScalarType::Long => DType::I64,
        ScalarType::Bool => DType::Bool,
        _ => return None,
    })
}

/// The declarations of a method's inputs or outputs (`what`), each named by its fully qualified name or
/// else its index; a name used twice is refused.
pub(super) fn io_decls(
    method: &Method<'_>,
    values: &[usize],
    what: &str,
) -> Result<Vec<TensorDecl>, Problem> {
    let mut names = BTreeSet::new();
    let mut decls = Vec::with_capacity(values.len());
    for (i, &value) in values.iter().enumerate() {
        let name =
            method.tensor(value).and_then(|t| t.fully_qualified_name()).map_or(i.to_string(), str::to_owned);
        decls.push(decl(method, value, &format!("{what} {i}"), &name)?);
        if !names.insert(name.clone()) {
            return Err(Problem::Duplicate { name });
        }
    }
    Ok(decls)
}

/// A tensor's declaration under `name`.
pub(super) fn decl(method: &Method<'_>, value: usize, what: &str, name: &str) -> Result<TensorDecl, Problem> {
    let tensor: &Tensor<'_> = method.tensor(value).ok_or_else(|| Problem::NotTensor {
        what: what.to_owned(),
        value,
        kind: method.values.get(value).map_or("?", |v| v.kind()),
    })?;
    let dtype = dtype(tensor.scalar_type).ok_or_else(|| Problem::ScalarType {
        what: what.to_owned(),
        value,
        scalar_type: tensor.scalar_type.to_string(),
    })?;
    let shape = tensor
        .sizes
        .iter()
        .map(|&s| u64::try_from(s))
        .collect::<Result<Vec<u64>, _>>()
        .map_err(|_| Problem::Sizes { what: what.to_owned(), value, sizes: tensor.sizes.clone() })?;
    let too_large = |source| Problem::TooLarge { what: what.to_owned(), value, source };
    TensorDecl::new(name, dtype, shape, MemoryKind::Host).map_err(too_large)
}

pub(super) fn describe(d: &TensorDecl) -> String {
    format!("{} {:?}", d.dtype, d.shape)
}

/// The buffer key of a mutable buffer: its fully qualified name, or its planned place.
pub(super) fn buffer_key(b: &MutableBuffer<'_>) -> String {
    match b.name {
        Some(name) => name.to_owned(),
        None => format!("mem{}@{}", b.allocation.mem_id, b.allocation.offset),
    }
}
