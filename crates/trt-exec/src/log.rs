//! TensorRT's log, collected: error messages are kept (and attached to this workspace's errors), the rest go
//! to `tracing`.

use std::sync::{Arc, Mutex};

/// Collects TensorRT's log: errors are kept (attached to errors), warnings go to `tracing`. Clones share one
/// list. Used by [`crate::Engine`] and by the build side (`trt-build`), which hands it to `trtx::Logger`.
#[derive(Clone, Default)]
pub struct LogSink {
    errors: Arc<Mutex<Vec<String>>>,
}

impl std::fmt::Debug for LogSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogSink").finish_non_exhaustive()
    }
}

impl LogSink {
    /// The error-level messages logged since the last call.
    pub fn take_errors(&self) -> Vec<String> {
        self.errors.lock().map(|mut e| std::mem::take(&mut *e)).unwrap_or_default()
    }

    /// Records one message of `severity`.
    pub fn record(&self, severity: trtx::Severity, message: &str) {
        match severity {
            trtx::Severity::InternalError | trtx::Severity::Error => {
                tracing::debug!(target: "tensorrt", "{message}");
                if let Ok(mut errors) = self.errors.lock() {
                    errors.push(message.to_owned());
                }
            }
            trtx::Severity::Warning => tracing::warn!(target: "tensorrt", "{message}"),
            trtx::Severity::Info => tracing::debug!(target: "tensorrt", "{message}"),
            trtx::Severity::Verbose => tracing::trace!(target: "tensorrt", "{message}"),
        }
    }
}

impl trtx::LogHandler for LogSink {
    fn log(&self, severity: trtx::Severity, message: &str) {
        self.record(severity, message);
    }
}

/// `" (TensorRT: a | b)"`, or nothing for an empty log: how TensorRT's messages are attached to an error.
pub fn log_suffix(log: &[String]) -> String {
    if log.is_empty() {
        String::new()
    } else {
        format!(" (TensorRT: {})", log.join(" | "))
    }
}
