//! Running a `.pte` on ExecuTorch's `Module` API with our plugins registered, one concern a file:
//!
//! - `check`: the pre-flight check ([`check_program`]): every backend served, every delegate-written argument
//!   planned memory, what the program's methods return.
//! - `module`: a safe [`Module`] over the FFI, its inputs checked against their shapes and dtypes.
//! - `run`: the run protocol ([`run()`]: the prompt fed as host-runtime's [`generate::protocol`]
//!   plans it, then greedy decode steps; [`run_choosing`]: each token picked by the caller, who may end the run
//!   early) and its [`Report`].
//! - `session`: one loaded module's calls of the protocol and the logits row each returns.
//!
//! [`generate::protocol`]: host_runtime::generate::protocol

mod check;
mod module;
mod run;
mod session;

pub use check::{check_program, ProgramSummary};
pub use module::{Input, Module, OutputMeta};
pub use run::{run, run_choosing, run_with_memory, Protocol, Report};
