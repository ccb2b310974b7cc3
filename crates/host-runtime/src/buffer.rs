//! Caller-owned tensor storage: zero-initialised, 64-byte aligned host memory.

use bytemuck::{Pod, Zeroable};

/// One cache line; storage is a vector of these so every tensor starts 64-byte aligned.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// Host storage for one tensor, zero-initialised.
#[derive(Clone)]
pub struct HostStorage {
    lines: Vec<Line>,
    len: usize,
}

impl HostStorage {
    /// `len` zero bytes, 64-byte aligned.
    pub fn zeroed(len: usize) -> HostStorage {
        HostStorage { lines: vec![Line([0; 64]); len.div_ceil(64)], len }
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.lines)[..self.len]
    }

    /// The bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.lines)[..self.len]
    }

    /// Zeroes every byte.
    pub fn clear(&mut self) {
        self.lines.fill(Line([0; 64]));
    }
}

impl std::fmt::Debug for HostStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostStorage").field("len", &self.len).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_is_zeroed_aligned_and_exact() {
        let mut s = HostStorage::zeroed(100);
        assert_eq!(s.bytes().len(), 100);
        assert!(s.bytes().iter().all(|&b| b == 0));
        assert_eq!(s.bytes().as_ptr() as usize % 64, 0);
        s.bytes_mut()[99] = 7;
        assert_eq!(s.bytes()[99], 7);
        s.clear();
        assert_eq!(s.bytes()[99], 0);
    }
}
