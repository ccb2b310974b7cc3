//! tensorrt
