//! Build-time helper for the patched `llama-cpp-sys-2` stand-in.
//!
//! Its build script finds the pristine published `llama-cpp-sys-2` sources (through `cargo
//! metadata`, so the ordinary cargo client fetches them into its cache), copies in the
//! project's new files (`patches/llama.cpp/files/`), applies `patches/llama.cpp/*.patch` in
//! order with `git apply`, and syncs the result into a stable
//! directory under `OUT_DIR`, rewriting only files whose content changed so that cmake rebuilds
//! incrementally. This crate exposes where that directory is.

include!(concat!(env!("OUT_DIR"), "/generated.rs"));
