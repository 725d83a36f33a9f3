//! Raw bindings to the patched llama.cpp (same surface as the published llama-cpp-sys-2).
#![allow(non_upper_case_globals, non_camel_case_types, non_snake_case)]
#![allow(unpredictable_function_pointer_comparisons)]
#![allow(clippy::all)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

/// Compile-time path to the built GGML backend modules directory (dynamic-backends only).
pub const BACKENDS_DIR: Option<&str> = option_env!("GGML_BACKENDS_DIR");
