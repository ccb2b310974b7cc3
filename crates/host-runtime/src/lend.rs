//! Each call's argument list, built once at load: the addresses of the program's own storages (buffers,
//! method inputs and outputs, copy-back scratch), lent to the list for the program's life and used only while
//! the call runs. A step then passes the list as it is: it pushes nothing, checks nothing again and allocates
//! nothing.
//!
//! Sound because every storage keeps its address for the program's life (host memory is one raw allocation
//! owned by `HostStorage`, so moving the program or borrowing a storage later leaves the address valid; CUDA
//! memory is a driver allocation), the lists are dropped with the program (or rebuilt over the new storages
//! by `Program::swap_caches`, which exchanges buffer storages with a forked sequence's before any further
//! run, so no list is used with a storage the program gave away), and a list is only used inside
//! `Program::enqueue_id`, which holds the program mutably, so nothing else touches the storages meanwhile.
//! This module and `buffer`'s allocation are that argument's only `unsafe` code.
#![allow(unsafe_code)]

use delegate_abi::host::{ArgError, ArgList, Slot};
use delegate_abi::{DTypeCode, TensorArg, ARG_INOUT, ARG_WRITABLE};

use crate::buffer::Storage;
use crate::cuda::Access;

/// How one delegate argument is filled, decided at load (by `program`'s planning).
#[derive(Debug, Clone, Copy)]
pub(crate) enum ArgSource {
    /// A user input of the method.
    Input(usize),
    /// A user output of the method.
    Output(usize),
    /// A buffer the delegate only reads.
    BufferRead(usize),
    /// A buffer an output aliases: the delegate updates it in place.
    BufferInOut(usize),
    /// A buffer-mutation output slot that is the buffer itself (zero-copy).
    BufferInPlace(usize),
    /// A buffer-mutation output slot in scratch storage of the buffer's memory kind, written back into the
    /// buffer after the call (copy-back).
    BufferScratch(usize),
}

/// One delegate argument as the call's argument list describes it.
#[derive(Debug, Clone)]
pub(crate) struct ArgPlan {
    pub(crate) source: ArgSource,
    pub(crate) dtype: DTypeCode,
    pub(crate) shape: Vec<i64>,
}

/// The storages a call's arguments are lent from, indexed as [`ArgSource`] indexes them: the program's
/// buffers (anything that holds a [`Storage`]), the method's inputs and outputs, the call's copy-back
/// scratch.
pub(crate) struct Storages<'a, B> {
    pub(crate) buffers: &'a mut [B],
    pub(crate) inputs: &'a mut [Storage],
    pub(crate) outputs: &'a mut [Storage],
    pub(crate) scratch: &'a mut [Storage],
}

/// The argument list of one call, from its load-time plan.
pub(crate) fn arg_list<B: AsMut<Storage>>(
    plan: &[ArgPlan],
    storages: Storages<'_, B>,
) -> Result<ArgList<'static>, ArgError> {
    let Storages { buffers, inputs, outputs, scratch } = storages;
    let mut list = ArgList::with_capacity(plan.len());
    let mut slots: Vec<Option<Slot>> = vec![None; buffers.len()];
    for arg in plan {
        let (dtype, shape) = (arg.dtype, arg.shape.as_slice());
        let index = list.len();
        let missing =
            || ArgError::BadSlot { index, slot: index, why: "its buffer's in/out argument comes later" };
        match arg.source {
            ArgSource::Input(i) => lend(&mut list, &mut inputs[i], dtype, shape, Access::Read).map(drop),
            ArgSource::Output(i) => lend(&mut list, &mut outputs[i], dtype, shape, Access::Write).map(drop),
            ArgSource::BufferRead(b) => {
                lend(&mut list, buffers[b].as_mut(), dtype, shape, Access::Read).map(drop)
            }
            ArgSource::BufferInOut(b) => lend(&mut list, buffers[b].as_mut(), dtype, shape, Access::InOut)
                .map(|slot| slots[b] = Some(slot)),
            ArgSource::BufferInPlace(b) => {
                list.push_output_in_place(slots[b].ok_or_else(missing)?, dtype, shape)
            }
            ArgSource::BufferScratch(k) => {
                lend(&mut list, &mut scratch[k], dtype, shape, Access::Write).map(drop)
            }
        }?;
    }
    Ok(list)
}

/// Appends `storage` as `dtype × shape`, flagged as the safe pushes flag `access`.
fn lend(
    list: &mut ArgList<'static>,
    storage: &mut Storage,
    dtype: DTypeCode,
    shape: &[i64],
    access: Access,
) -> Result<Slot, ArgError> {
    let index = list.len();
    let mut arg = TensorArg::describe(dtype, shape, storage.memory())
        .ok_or(ArgError::RankTooLarge { index, rank: shape.len() })?;
    let (data, device) = storage.lend();
    arg.data = data;
    arg.nbytes = storage.len() as u64;
    arg.device_id = device;
    arg.flags = match access {
        Access::Read => 0,
        Access::InOut => ARG_WRITABLE | ARG_INOUT,
        Access::Write => ARG_WRITABLE,
    };
    // SAFETY: `data` is the address of `storage`'s whole allocation (`nbytes` bytes, host-visible for host,
    // pinned and managed memory, a device allocation on `device` otherwise), valid until the program drops the
    // storage or gives it away (`Program::swap_caches`), which it does together with dropping or rebuilding
    // this list (see the module docs). The list is only passed to
    // `Instance::execute` by `Program::enqueue_id` while it holds the program mutably, so during a call nothing
    // else reads or writes the storage, and the load-time plan lends each storage once, except a buffer's
    // in-place output, which `push_output_in_place` shares at the same address and size.
    unsafe { list.push_raw(arg) }
}
