//! Where each tensor's values live during a call, in the tensor's declared element type.

use std::mem;

use ref_graph::half::{bf16, f16};
use ref_graph::{Data, ElemType, Graph, TensorDecl, TensorId};

use super::elem::Elem;
use super::{invariant, wrong_type, Error};

/// Where one tensor's values are during a call.
#[derive(Debug)]
pub(super) enum Store {
    /// In the graph's constant table, read in place in its own type.
    Constant,
    /// In the caller's argument at this position (a cache, updated in place).
    InPlace { arg: usize },
    /// In the executor's delegate-owned state at this slot (a cache the delegate keeps across calls).
    State { slot: usize },
    /// Delegate-owned scratch.
    Scratch(Buf),
    /// The storage of another tensor (never itself an alias): a `reshape`'s output, the same elements.
    Alias(TensorId),
}

/// Owned values of one element type.
#[derive(Debug)]
pub enum Buf {
    /// `f32` values.
    F32(Vec<f32>),
    /// `f16` values.
    F16(Vec<f16>),
    /// `bf16` values.
    Bf16(Vec<bf16>),
    /// `i64` values.
    I64(Vec<i64>),
}

/// Borrowed values of one element type.
#[derive(Debug, Clone, Copy)]
pub enum Values<'a> {
    /// `f32` values.
    F32(&'a [f32]),
    /// `f16` values.
    F16(&'a [f16]),
    /// `bf16` values.
    Bf16(&'a [bf16]),
    /// `i64` values.
    I64(&'a [i64]),
}

/// Mutably borrowed values of one element type.
#[derive(Debug)]
pub enum ValuesMut<'a> {
    /// `f32` values.
    F32(&'a mut [f32]),
    /// `f16` values.
    F16(&'a mut [f16]),
    /// `bf16` values.
    Bf16(&'a mut [bf16]),
    /// `i64` values.
    I64(&'a mut [i64]),
}

impl Buf {
    /// No values of `dtype` (a placeholder until scratch is allocated).
    pub fn empty(dtype: ElemType) -> Buf {
        match dtype {
            ElemType::F32 => Buf::F32(Vec::new()),
            ElemType::F16 => Buf::F16(Vec::new()),
            ElemType::Bf16 => Buf::Bf16(Vec::new()),
            ElemType::I64 => Buf::I64(Vec::new()),
        }
    }

    /// `len` zeros of `dtype`, allocated fallibly ([`Error::OutOfMemory`] names `tensor`).
    pub fn zeros(dtype: ElemType, len: usize, tensor: &str) -> Result<Buf, Error> {
        Ok(match dtype {
            ElemType::F32 => Buf::F32(alloc(len, tensor)?),
            ElemType::F16 => Buf::F16(alloc(len, tensor)?),
            ElemType::Bf16 => Buf::Bf16(alloc(len, tensor)?),
            ElemType::I64 => Buf::I64(alloc(len, tensor)?),
        })
    }

    /// The values, borrowed.
    pub fn values(&self) -> Values<'_> {
        match self {
            Buf::F32(v) => Values::F32(v),
            Buf::F16(v) => Values::F16(v),
            Buf::Bf16(v) => Values::Bf16(v),
            Buf::I64(v) => Values::I64(v),
        }
    }

    /// The values, mutably borrowed.
    pub fn values_mut(&mut self) -> ValuesMut<'_> {
        match self {
            Buf::F32(v) => ValuesMut::F32(v),
            Buf::F16(v) => ValuesMut::F16(v),
            Buf::Bf16(v) => ValuesMut::Bf16(v),
            Buf::I64(v) => ValuesMut::I64(v),
        }
    }

    /// The values' native-endian bytes, for staging a caller's input into them.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Buf::F32(v) => bytemuck::cast_slice_mut(v),
            Buf::F16(v) => bytemuck::cast_slice_mut(v),
            Buf::Bf16(v) => bytemuck::cast_slice_mut(v),
            Buf::I64(v) => bytemuck::cast_slice_mut(v),
        }
    }
}

impl<'a> Values<'a> {
    /// A constant's values, in place.
    pub fn of_constant(data: &'a Data) -> Values<'a> {
        match data {
            Data::F32(v) => Values::F32(v),
            Data::F16(v) => Values::F16(v),
            Data::Bf16(v) => Values::Bf16(v),
            Data::I64(v) => Values::I64(v),
        }
    }

    /// Caller bytes seen as values of `dtype`; `None` when they are not aligned for it.
    pub fn of_bytes(bytes: &'a [u8], dtype: ElemType) -> Option<Values<'a>> {
        Some(match dtype {
            ElemType::F32 => Values::F32(bytemuck::try_cast_slice(bytes).ok()?),
            ElemType::F16 => Values::F16(bytemuck::try_cast_slice(bytes).ok()?),
            ElemType::Bf16 => Values::Bf16(bytemuck::try_cast_slice(bytes).ok()?),
            ElemType::I64 => Values::I64(bytemuck::try_cast_slice(bytes).ok()?),
        })
    }

    /// The values' native-endian bytes, for copying an output into a caller's argument.
    pub fn bytes(self) -> &'a [u8] {
        match self {
            Values::F32(v) => bytemuck::cast_slice(v),
            Values::F16(v) => bytemuck::cast_slice(v),
            Values::Bf16(v) => bytemuck::cast_slice(v),
            Values::I64(v) => bytemuck::cast_slice(v),
        }
    }

    /// The values as `T`, or `None` when they are of another type.
    pub fn typed<T: Typed>(self) -> Option<&'a [T]> {
        T::slice(self)
    }
}

impl<'a> ValuesMut<'a> {
    /// Caller bytes seen as values of `dtype`; `None` when they are not aligned for it.
    pub fn of_bytes(bytes: &'a mut [u8], dtype: ElemType) -> Option<ValuesMut<'a>> {
        Some(match dtype {
            ElemType::F32 => ValuesMut::F32(bytemuck::try_cast_slice_mut(bytes).ok()?),
            ElemType::F16 => ValuesMut::F16(bytemuck::try_cast_slice_mut(bytes).ok()?),
            ElemType::Bf16 => ValuesMut::Bf16(bytemuck::try_cast_slice_mut(bytes).ok()?),
            ElemType::I64 => ValuesMut::I64(bytemuck::try_cast_slice_mut(bytes).ok()?),
        })
    }

    /// The values as `T`, or `None` when they are of another type.
    pub fn typed<T: Typed>(self) -> Option<&'a mut [T]> {
        T::slice_mut(self)
    }
}

/// An [`Elem`] that knows its variant of [`Values`] and [`ValuesMut`].
pub trait Typed: Elem {
    /// The values, if they are `Self`.
    fn slice(values: Values<'_>) -> Option<&[Self]>;
    /// The values, if they are `Self`.
    fn slice_mut(values: ValuesMut<'_>) -> Option<&mut [Self]>;
}

macro_rules! typed {
    ($($ty:ty => $variant:ident),*) => {$(
        impl Typed for $ty {
            fn slice(values: Values<'_>) -> Option<&[$ty]> {
                match values {
                    Values::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn slice_mut(values: ValuesMut<'_>) -> Option<&mut [$ty]> {
                match values {
                    ValuesMut::$variant(v) => Some(v),
                    _ => None,
                }
            }
        }
    )*};
}

typed!(f32 => F32, f16 => F16, bf16 => Bf16, i64 => I64);

/// `len` default values, allocated fallibly.
pub fn alloc<T: Clone + Default>(len: usize, tensor: &str) -> Result<Vec<T>, Error> {
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|_| Error::OutOfMemory { tensor: tensor.to_owned(), bytes: len * mem::size_of::<T>() })?;
    v.resize(len, T::default());
    Ok(v)
}

/// The executor-owned scratch a tensor needs, in bytes (0 for a store that is not scratch).
pub(super) fn scratch_bytes(store: &Store, decl: &TensorDecl) -> u64 {
    match store {
        Store::Scratch(_) => decl.nbytes() as u64,
        Store::Constant | Store::InPlace { .. } | Store::State { .. } | Store::Alias(_) => 0,
    }
}

/// Every tensor's store, and the delegate-owned state the `State` stores index.
#[derive(Debug)]
pub(super) struct Tensors {
    /// One per graph tensor.
    pub stores: Vec<Store>,
    /// Delegate-owned caches (`Graph::state`), zero-filled at creation and kept across calls.
    pub state: Vec<Buf>,
}

impl Tensors {
    /// The values of `id`, wherever they live (a reshape's output is its input's storage); a cache in a
    /// caller's argument is reached only through the cache ops' own borrows.
    pub fn values<'a>(&'a self, graph: &'a Graph, id: TensorId) -> Result<Values<'a>, Error> {
        let id = match self.stores[id.0] {
            Store::Alias(root) => root,
            _ => id,
        };
        match (&self.stores[id.0], graph.constant(id)) {
            (Store::Scratch(buf), _) => Ok(buf.values()),
            (Store::Constant, Some(data)) => Ok(Values::of_constant(data)),
            (Store::State { slot }, _) => Ok(self.state[*slot].values()),
            _ => Err(invariant(format!(
                "tensor '{}' is read where its values are not (graph validation guarantees they are)",
                graph.tensor(id).name
            ))),
        }
    }

    /// The values of `id` as `T`.
    pub fn read<'a, T: Typed>(&'a self, graph: &'a Graph, id: TensorId) -> Result<&'a [T], Error> {
        self.values(graph, id)?.typed().ok_or_else(|| wrong_type(graph.tensor(id)))
    }
}

/// The output of the op running: its store (taken out of [`Tensors`] while the op runs, so operands can be
/// read meanwhile) and its declaration.
#[derive(Debug)]
pub(super) struct Out<'a> {
    /// Where the output lives.
    pub store: &'a mut Store,
    /// Its declaration.
    pub decl: &'a TensorDecl,
}

impl Out<'_> {
    /// The output's scratch.
    pub fn values(&mut self) -> Result<ValuesMut<'_>, Error> {
        match self.store {
            Store::Scratch(buf) => Ok(buf.values_mut()),
            _ => Err(invariant(format!("output '{}' has no scratch", self.decl.name))),
        }
    }

    /// The output's scratch as `T`.
    pub fn typed<T: Typed>(&mut self) -> Result<&mut [T], Error> {
        let decl = self.decl;
        self.values()?.typed().ok_or_else(|| wrong_type(decl))
    }
}
