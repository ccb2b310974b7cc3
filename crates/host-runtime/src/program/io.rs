//! The host's access to a program's memory: buffers, method inputs and outputs, in any memory kind, each
//! access waiting for queued work first (the stream invariant), and the resets that start a new sequence.

use std::borrow::Cow;

use delegate_abi::MemoryKind;

use super::{Error, IoRole, Program};
use crate::cuda;

impl Program {
    /// A buffer's bytes: borrowed for host-visible memory (managed memory after a context
    /// synchronisation), copied to the host for device memory. Waits for queued work first.
    ///
    /// # Errors
    /// [`Error::Usage`] when the program has no such buffer, [`Error::BufferAccess`] when reading device
    /// memory fails.
    pub fn buffer(&self, name: &str) -> Result<Cow<'_, [u8]>, Error> {
        let buffer = self
            .buffers
            .iter()
            .find(|b| b.decl.name == name)
            .ok_or_else(|| Error::Usage(format!("the program has no buffer '{name}'")))?;
        self.synchronize()?;
        buffer.storage.read().map_err(|source| Error::BufferAccess {
            buffer: buffer.decl.name.clone(),
            action: "reading",
            source,
        })
    }

    /// The memory kind a buffer really lives in, or `None` when the program has no such buffer.
    pub fn buffer_memory(&self, name: &str) -> Option<MemoryKind> {
        self.buffers.iter().find(|b| b.decl.name == name).map(|b| b.storage.memory())
    }

    /// Zeroes every buffer, of every memory kind (a fresh sequence), which also clears the torn mark
    /// ([`Program::reset`]). Waits for queued work first.
    pub fn reset_buffers(&mut self) -> Result<(), Error> {
        self.synchronize()?;
        for buffer in &mut self.buffers {
            buffer.storage.clear().map_err(|source| Error::BufferAccess {
                buffer: buffer.decl.name.clone(),
                action: "zeroing",
                source,
            })?;
        }
        self.torn = None;
        self.position = Some(0);
        Ok(())
    }

    /// Overwrites a buffer (a KV cache) with `data`, exactly its size: the caller owns the caches. A host copy
    /// for host-visible memory, a synchronous host-to-device copy for device memory; waits for queued work
    /// first. The torn mark and [`Program::position`] are left as they are: what the bytes mean is the
    /// caller's word.
    ///
    /// # Errors
    /// [`Error::Usage`] when the program has no such buffer or `data` is not its size;
    /// [`Error::BufferAccess`] when writing fails.
    pub fn write_buffer(&mut self, name: &str, data: &[u8]) -> Result<(), Error> {
        self.synchronize()?;
        let buffer = self
            .buffers
            .iter_mut()
            .find(|b| b.decl.name == name)
            .ok_or_else(|| Error::Usage(format!("the program has no buffer '{name}'")))?;
        if data.len() != buffer.storage.len() {
            return Err(Error::Usage(format!(
                "buffer '{name}' holds {} bytes, {} were given",
                buffer.storage.len(),
                data.len()
            )));
        }
        buffer.storage.write(data).map_err(|source| Error::BufferAccess {
            buffer: name.to_owned(),
            action: "writing",
            source,
        })
    }

    /// Starts a new sequence: clears the torn mark a failed run left ([`Error::TornBuffers`]) and, for a
    /// token generator, zeroes the `[generate]` position input of its prefill and decode methods, so the next
    /// token is at position 0. Waits for queued work first.
    ///
    /// The buffers themselves are not touched, and need not be: a causal decoder run from position 0 writes
    /// each cache row before it reads it, and rows past the current position are masked from attention, so
    /// whatever a failed call left there is never read (no cache traffic; [`Program::reset_buffers`] zeroes
    /// them when wanted). The caller's part: the next run starts at position 0 ([`crate::generate`] does).
    ///
    /// # Errors
    /// [`Error::Stream`] when waiting for queued work or zeroing a device position input fails.
    pub fn reset(&mut self) -> Result<(), Error> {
        self.synchronize()?;
        if let Some(g) = &self.manifest.generate {
            for method in [&g.prefill, &g.decode] {
                let Some(m) = self.methods.iter_mut().find(|m| &m.decl.name == method) else { continue };
                if let Ok(index) = m.input_index(&g.position_input) {
                    m.inputs[index].clear().map_err(|source| Error::Stream {
                        action: "zeroing a position input through",
                        source,
                    })?;
                }
            }
        }
        self.torn = None;
        self.position = Some(0);
        Ok(())
    }

    /// The memory kind a method's input really lives in.
    pub fn input_memory(&self, method: &str, input: &str) -> Result<MemoryKind, Error> {
        let m = self.method(method)?;
        Ok(m.inputs[m.input_index(input)?].memory())
    }

    /// The memory kind a method's output really lives in.
    pub fn output_memory(&self, method: &str, output: &str) -> Result<MemoryKind, Error> {
        let m = self.method(method)?;
        Ok(m.outputs[m.output_index(output)?].memory())
    }

    /// A user input's bytes in place, to fill before [`Program::execute`]: host, pinned or managed memory
    /// (device memory is written with [`Program::write_input`]). Waits for queued work first.
    ///
    /// # Errors
    /// [`Error::Usage`] for an unknown method or input, [`Error::Memory`] for device memory,
    /// [`Error::Stream`] when waiting fails.
    pub fn input_mut(&mut self, method: &str, input: &str) -> Result<&mut [u8], Error> {
        let id = self.method_id(method)?;
        self.synchronize()?;
        let m = &mut self.methods[id.0];
        let index = m.input_index(input)?;
        let (name, memory) = (&m.decl.name, m.inputs[index].memory());
        let not_visible = || Error::Memory {
            method: name.clone(),
            role: IoRole::Input,
            tensor: input.to_owned(),
            memory,
            problem: "which the host cannot borrow in place; write it with write_input",
        };
        match m.inputs[index].host_slice_mut() {
            Ok(Some(bytes)) => Ok(bytes),
            Ok(None) => Err(not_visible()),
            Err(source) => Err(Error::Stream { action: "synchronising", source }),
        }
    }

    /// A user output's bytes in place, as the last run of `method` left them: host, pinned or managed memory
    /// (device memory is read with [`Program::read_output`]). Waits for queued work first.
    ///
    /// # Errors
    /// As [`Program::input_mut`].
    pub fn output(&self, method: &str, output: &str) -> Result<&[u8], Error> {
        let m = self.method(method)?;
        let index = m.output_index(output)?;
        self.synchronize()?;
        match m.outputs[index].host_slice() {
            Ok(Some(bytes)) => Ok(bytes),
            Ok(None) => Err(Error::Memory {
                method: method.to_owned(),
                role: IoRole::Output,
                tensor: output.to_owned(),
                memory: m.outputs[index].memory(),
                problem: "which the host cannot borrow in place; read it with read_output",
            }),
            Err(source) => Err(Error::Stream { action: "synchronising", source }),
        }
    }

    /// Overwrites a user input with `data` (exactly its size), in any memory kind: a host copy, or a
    /// synchronous copy to device memory. Waits for queued work first.
    ///
    /// # Errors
    /// [`Error::Usage`] for an unknown method or input or a wrong size; [`Error::Stream`] when CUDA fails.
    pub fn write_input(&mut self, method: &str, input: &str, data: &[u8]) -> Result<(), Error> {
        let id = self.method_id(method)?;
        self.synchronize()?;
        let m = &mut self.methods[id.0];
        let index = m.input_index(input)?;
        let storage = &mut m.inputs[index];
        if storage.len() != data.len() {
            return Err(Error::Usage(format!(
                "method '{method}': input '{input}' holds {} bytes, {} were given",
                storage.len(),
                data.len()
            )));
        }
        storage.write(data).map_err(|source| Error::Stream { action: "writing an input through", source })
    }

    /// A user output's bytes, in any memory kind: borrowed for host-visible memory, copied from device
    /// memory. Waits for queued work first.
    ///
    /// # Errors
    /// [`Error::Usage`] for an unknown method or output; [`Error::Stream`] when CUDA fails.
    pub fn read_output(&self, method: &str, output: &str) -> Result<Cow<'_, [u8]>, Error> {
        let m = self.method(method)?;
        let index = m.output_index(output)?;
        self.synchronize()?;
        m.outputs[index]
            .read()
            .map_err(|source| Error::Stream { action: "reading an output through", source })
    }

    /// The device address of a method's input in device or managed memory (for kernels an application
    /// queues on [`Program::cuda_stream`]).
    ///
    /// # Errors
    /// [`Error::Usage`] for an unknown method or input, [`Error::Memory`] for host or pinned memory.
    pub fn input_ptr(&self, method: &str, input: &str) -> Result<cuda::DevicePtr, Error> {
        self.io_device_ptr(method, IoRole::Input, input)
    }

    /// The device address of a method's output in device or managed memory.
    ///
    /// # Errors
    /// As [`Program::input_ptr`].
    pub fn output_ptr(&self, method: &str, output: &str) -> Result<cuda::DevicePtr, Error> {
        self.io_device_ptr(method, IoRole::Output, output)
    }

    /// The device address of a method's input or output, or [`Error::Memory`] naming it.
    fn io_device_ptr(&self, method: &str, role: IoRole, name: &str) -> Result<cuda::DevicePtr, Error> {
        let m = self.method(method)?;
        let storage = match role {
            IoRole::Input => &m.inputs[m.input_index(name)?],
            IoRole::Output => &m.outputs[m.output_index(name)?],
        };
        storage.device_ptr().ok_or_else(|| Error::Memory {
            method: method.to_owned(),
            role,
            tensor: name.to_owned(),
            memory: storage.memory(),
            problem: "which has no device address",
        })
    }
}
