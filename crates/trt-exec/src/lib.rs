//! trt-exec
