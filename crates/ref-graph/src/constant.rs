//! How a [`Graph`](crate::Graph) holds its constants: their values ([`Data`]), or where their bytes lie in a
//! constant section held elsewhere ([`Extent`]), so that a packer can lay out a payload of gigabytes of
//! weights without holding them.

use crate::{Data, ElemType};

/// What a graph's constants are held as: [`Data`] (their values) or [`Extent`] (their bytes' place in a
/// constant section). Validation needs only each constant's element type and length, which both give.
///
/// Sealed: a graph holds its constants one of these two ways.
pub trait ConstantStorage: sealed::Sealed {
    /// The element type.
    fn elem_type(&self) -> ElemType;
    /// The number of elements.
    fn numel(&self) -> usize;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for crate::Data {}
    impl Sealed for super::Extent {}
}

impl ConstantStorage for Data {
    fn elem_type(&self) -> ElemType {
        self.dtype()
    }

    fn numel(&self) -> usize {
        self.len()
    }
}

/// Where a constant's little-endian bytes lie in a constant section that the graph does not hold: an offset
/// (a multiple of [`CONSTANT_ALIGN`](crate::CONSTANT_ALIGN)) and a length that is its tensor's size, checked
/// against the section's length when the graph was read ([`Graph::from_description_extents`](
/// crate::Graph::from_description_extents)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub(crate) offset: u64,
    pub(crate) nbytes: u64,
    pub(crate) dtype: ElemType,
}

impl Extent {
    /// The offset of the constant's first byte in the section.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The constant's length in bytes.
    pub fn nbytes(&self) -> u64 {
        self.nbytes
    }
}

impl ConstantStorage for Extent {
    fn elem_type(&self) -> ElemType {
        self.dtype
    }

    fn numel(&self) -> usize {
        let nbytes =
            usize::try_from(self.nbytes).expect("an extent is checked to fit its tensor, a usize size");
        nbytes / self.dtype.size_bytes()
    }
}
