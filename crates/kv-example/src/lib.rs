//! kv-example
