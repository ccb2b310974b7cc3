//! Streams (owned [`Stream`], borrowed [`StreamRef`]), [`Event`]s, and the asynchronous copies ordered on a
//! stream.
//!
//! A stream a caller hands over (the plugin ABI carries a raw `cudaStream_t`) is wrapped with
//! [`StreamRef::from_raw`], which borrows it and never destroys it; the null stream is the legacy default
//! stream of the current context ([`StreamRef::legacy_default`]).

use std::ffi::c_void;
use std::marker::PhantomData;

use cudarc::driver::{result, sys};

use crate::context::Context;
use crate::driver;
use crate::error::{Error, Result};
use crate::memory::DevicePtr;

/// A stream borrowed for `'a`: the caller's, an owned [`Stream`]'s, or the legacy default stream. Copying it
/// copies the handle, never the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamRef<'a> {
    raw: sys::CUstream,
    borrow: PhantomData<&'a ()>,
}

impl StreamRef<'static> {
    /// The legacy default stream (null) of whichever context is current when it is used: it orders with every
    /// blocking stream of that context.
    pub const fn legacy_default() -> StreamRef<'static> {
        StreamRef { raw: std::ptr::null_mut(), borrow: PhantomData }
    }
}

impl<'a> StreamRef<'a> {
    /// Wraps a raw `CUstream` / `cudaStream_t` (they are the same handle) without taking ownership.
    ///
    /// # Safety
    /// `raw` is null (the legacy default stream) or a stream created in the primary context of the device the
    /// stream is used with, and it stays valid (is not destroyed) for `'a`.
    pub unsafe fn from_raw(raw: *mut c_void) -> StreamRef<'a> {
        StreamRef { raw: raw.cast(), borrow: PhantomData }
    }

    /// The raw handle.
    pub fn as_raw(self) -> *mut c_void {
        self.raw.cast()
    }

    /// Whether this is the legacy default (null) stream.
    pub fn is_legacy_default(self) -> bool {
        self.raw.is_null()
    }

    pub(crate) fn cu(self) -> sys::CUstream {
        self.raw
    }
}

/// A stream created by this crate, destroyed on drop. Blocking (`CU_STREAM_DEFAULT` flags): it orders with
/// the legacy default stream, so work the caller queued there completes first.
pub struct Stream {
    raw: sys::CUstream,
    ctx: Context,
}

// SAFETY: a `CUstream` may be used from any host thread (with its context current, which every use binds);
// the handle is owned by this value alone.
unsafe impl Send for Stream {}
// SAFETY: every `&self` use queues work or synchronises, which the driver allows from several threads at once.
unsafe impl Sync for Stream {}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream").field("device", &self.ctx.ordinal()).finish_non_exhaustive()
    }
}

impl Stream {
    /// A new blocking stream in `ctx`.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver refuses.
    pub fn new(ctx: &Context) -> Result<Stream> {
        ctx.bind()?;
        let raw = driver::call("cuStreamCreate", ctx.ordinal(), || {
            result::stream::create(result::stream::StreamKind::Default)
        })?;
        Ok(Stream { raw, ctx: ctx.clone() })
    }

    /// The stream, borrowed.
    pub fn as_ref(&self) -> StreamRef<'_> {
        StreamRef { raw: self.raw, borrow: PhantomData }
    }

    /// The context it was created in.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Waits for everything queued on the stream.
    ///
    /// # Errors
    /// [`Error::Driver`] when queued work failed.
    pub fn synchronize(&self) -> Result<()> {
        self.ctx.synchronize_stream(self.as_ref())
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let destroyed = self.ctx.bind().and_then(|()| {
            driver::call("cuStreamDestroy", self.ctx.ordinal(), || {
                // SAFETY: `raw` was created by `cuStreamCreate` in `new` and is destroyed once, here; pending
                // work completes before the driver releases the stream's resources.
                unsafe { result::stream::destroy(self.raw) }
            })
        });
        if let Err(err) = destroyed {
            tracing::warn!("leaking a CUDA stream: {err}");
        }
    }
}

/// A CUDA event (`cuEventCreate`), destroyed on drop: marks a point in a stream that the host or another
/// stream can wait for.
pub struct Event {
    raw: sys::CUevent,
    ctx: Context,
    timed: bool,
}

// SAFETY: a `CUevent` may be used from any host thread (with its context current, which every use binds);
// the handle is owned by this value alone.
unsafe impl Send for Event {}
// SAFETY: recording, querying and waiting from several threads at once is allowed by the driver.
unsafe impl Sync for Event {}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event").field("device", &self.ctx.ordinal()).field("timed", &self.timed).finish()
    }
}

impl Event {
    /// An event for ordering only (`CU_EVENT_DISABLE_TIMING`, the cheap kind).
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver refuses.
    pub fn new(ctx: &Context) -> Result<Event> {
        Event::create(ctx, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING, false)
    }

    /// An event that also records time, for [`Event::elapsed_ms`].
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver refuses.
    pub fn timed(ctx: &Context) -> Result<Event> {
        Event::create(ctx, sys::CUevent_flags::CU_EVENT_DEFAULT, true)
    }

    fn create(ctx: &Context, flags: sys::CUevent_flags, timed: bool) -> Result<Event> {
        ctx.bind()?;
        let raw = driver::call("cuEventCreate", ctx.ordinal(), || result::event::create(flags))?;
        Ok(Event { raw, ctx: ctx.clone(), timed })
    }

    /// Captures the work queued on `stream` so far (`cuEventRecord`).
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver refuses (e.g. a stream of another context).
    pub fn record(&self, stream: StreamRef<'_>) -> Result<()> {
        self.ctx.bind()?;
        driver::call("cuEventRecord", self.ctx.ordinal(), || {
            // SAFETY: `raw` is a live event of this context; `stream` is valid for its borrow
            // (`StreamRef::from_raw`'s contract, or an owned stream's).
            unsafe { result::event::record(self.raw, stream.cu()) }
        })
    }

    /// Blocks until the captured work is complete (a host synchronisation, counted by [`crate::stats`]).
    ///
    /// # Errors
    /// [`Error::Driver`] when the captured work failed.
    pub fn synchronize(&self) -> Result<()> {
        self.ctx.bind()?;
        crate::stats::count_host_sync();
        // SAFETY: `raw` is a live event of this context.
        driver::call("cuEventSynchronize", self.ctx.ordinal(), || unsafe {
            result::event::synchronize(self.raw)
        })
    }

    /// Whether the captured work is complete (an event never recorded is complete).
    ///
    /// # Errors
    /// [`Error::Driver`] when the captured work failed.
    pub fn is_complete(&self) -> Result<bool> {
        self.ctx.bind()?;
        driver::call("cuEventQuery", self.ctx.ordinal(), || {
            // SAFETY: `raw` is a live event of this context.
            match unsafe { result::event::query(self.raw) } {
                Ok(()) => Ok(true),
                Err(err) if err.0 == sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
                Err(err) => Err(err),
            }
        })
    }

    /// Makes `stream` wait for the captured work before running anything queued after this call
    /// (`cuStreamWaitEvent`); the host does not block.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver refuses.
    pub fn wait_on(&self, stream: StreamRef<'_>) -> Result<()> {
        self.ctx.bind()?;
        driver::call("cuStreamWaitEvent", self.ctx.ordinal(), || {
            // SAFETY: `raw` is a live event; `stream` is valid for its borrow.
            unsafe {
                result::stream::wait_event(
                    stream.cu(),
                    self.raw,
                    sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                )
            }
        })
    }

    /// Milliseconds between `start` and this event, both [`Event::timed`] and complete.
    ///
    /// # Errors
    /// [`Error::Driver`] when either event is untimed, not recorded or not complete.
    pub fn elapsed_ms(&self, start: &Event) -> Result<f32> {
        self.ctx.bind()?;
        driver::call("cuEventElapsedTime", self.ctx.ordinal(), || {
            // SAFETY: both are live events.
            unsafe { result::event::elapsed(start.raw, self.raw) }
        })
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let destroyed = self.ctx.bind().and_then(|()| {
            driver::call("cuEventDestroy", self.ctx.ordinal(), || {
                // SAFETY: `raw` was created by `cuEventCreate` and is destroyed once, here.
                unsafe { result::event::destroy(self.raw) }
            })
        });
        if let Err(err) = destroyed {
            tracing::warn!("leaking a CUDA event: {err}");
        }
    }
}

fn bytes_usize(call: &'static str, bytes: u64) -> Result<usize> {
    usize::try_from(bytes).map_err(|_| Error::OutOfRange { call, what: format!("{bytes} bytes") })
}

impl Context {
    /// Waits for everything queued on `stream` (the legacy default stream waits for this context's); a host
    /// synchronisation, counted by [`crate::stats`].
    ///
    /// # Errors
    /// [`Error::Driver`] when queued work failed.
    pub fn synchronize_stream(&self, stream: StreamRef<'_>) -> Result<()> {
        self.bind()?;
        crate::stats::count_host_sync();
        driver::call("cuStreamSynchronize", self.ordinal(), || {
            // SAFETY: `stream` is null or a valid stream for its borrow; the context is current.
            unsafe { result::stream::synchronize(stream.cu()) }
        })
    }

    /// `cuMemcpyHtoDAsync`: `bytes` from host `src` to device `dst`, ordered on `stream`; binds this context
    /// first. Allocates nothing (after the entry point's first use).
    ///
    /// # Safety
    /// `dst` is device (or managed) memory valid for writes of `bytes` and `src` host memory valid for reads
    /// of `bytes`, neither used by anything else, until the stream has executed the copy.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver refuses.
    pub unsafe fn copy_htod_async(
        &self,
        dst: DevicePtr,
        src: *const c_void,
        bytes: u64,
        stream: StreamRef<'_>,
    ) -> Result<()> {
        let n = bytes_usize("cuMemcpyHtoDAsync", bytes)?;
        self.bind()?;
        driver::call("cuMemcpyHtoDAsync", self.ordinal(), || {
            // SAFETY: the context is current; the pointers are valid per this function's contract; `stream`
            // is valid for its borrow.
            unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src, n, stream.cu()) }.result()
        })
    }

    /// `cuMemcpyDtoHAsync`: `bytes` from device `src` to host `dst`, ordered on `stream`; binds this context
    /// first.
    ///
    /// # Safety
    /// `src` is device (or managed) memory valid for reads of `bytes` and `dst` host memory valid for writes
    /// of `bytes`, neither used by anything else, until the stream has executed the copy.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver refuses.
    pub unsafe fn copy_dtoh_async(
        &self,
        dst: *mut c_void,
        src: DevicePtr,
        bytes: u64,
        stream: StreamRef<'_>,
    ) -> Result<()> {
        let n = bytes_usize("cuMemcpyDtoHAsync", bytes)?;
        self.bind()?;
        driver::call("cuMemcpyDtoHAsync", self.ordinal(), || {
            // SAFETY: as in `copy_htod_async`.
            unsafe { sys::cuMemcpyDtoHAsync_v2(dst, src, n, stream.cu()) }.result()
        })
    }

    /// `cuMemcpyDtoDAsync`: `bytes` from device `src` to device `dst` (not overlapping), ordered on `stream`;
    /// binds this context first.
    ///
    /// # Safety
    /// Both are device (or managed) memory valid for `bytes` (reads of `src`, writes of `dst`), not
    /// overlapping, `dst` used by nothing else, until the stream has executed the copy.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver refuses.
    pub unsafe fn copy_dtod_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
        stream: StreamRef<'_>,
    ) -> Result<()> {
        let n = bytes_usize("cuMemcpyDtoDAsync", bytes)?;
        self.bind()?;
        driver::call("cuMemcpyDtoDAsync", self.ordinal(), || {
            // SAFETY: as in `copy_htod_async`.
            unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, n, stream.cu()) }.result()
        })
    }
}
