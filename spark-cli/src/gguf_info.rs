//! A metadata-only look at a GGUF file (through ggml's own reader) before llama.cpp loads it:
//! gives clear errors for missing or unreadable files and tells which architecture the file is.

use crate::error::{CliError, Result};
use llama_cpp_sys_2 as sys;
use spark_gguf::keys;
use spark_gguf::schema::{arch_key, suffix, SPARK_ARCH};
use std::ffi::{CStr, CString};
use std::path::Path;

/// What the CLI needs to know about a model file before loading it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelInfo {
    /// [`keys::GENERAL_ARCHITECTURE`].
    pub arch: String,
    /// [`suffix::BLOCK_COUNT`] of `arch` (L), when present as a u32.
    pub n_layer: Option<u32>,
    /// [`suffix::FEED_FORWARD_LENGTH`] of `arch` (F), when present as a u32.
    pub n_ff: Option<u32>,
    /// [`suffix::SPARK_FFN_K`] of `arch` (k_f), when present as a u32.
    pub ffn_k: Option<u32>,
    /// [`suffix::SPARK_ATTN_K`] of `arch` (k_a), when present as a u32.
    pub attn_k: Option<u32>,
}

impl ModelInfo {
    /// Whether the file is a Spark-Gemma2 model.
    pub fn is_spark(&self) -> bool {
        self.arch == SPARK_ARCH
    }
}

/// Reads the metadata of `path`.
pub fn read(path: &Path) -> Result<ModelInfo> {
    if !path.exists() {
        return Err(CliError::new(format!(
            "model file not found: {}",
            path.display()
        )));
    }
    if !path.is_file() {
        return Err(CliError::new(format!("not a file: {}", path.display())));
    }
    let c_path = path_cstring(path)?;
    let params = sys::gguf_init_params {
        no_alloc: true,
        ctx: std::ptr::null_mut(),
    };
    // SAFETY: `c_path` is a valid NUL-terminated string; with no_alloc and a null ctx ggml reads
    // only the metadata and returns null on any error.
    let ctx = unsafe { sys::gguf_init_from_file(c_path.as_ptr(), params) };
    if ctx.is_null() {
        return Err(CliError::new(format!(
            "not a readable GGUF file: {}",
            path.display()
        )));
    }
    let guard = GgufGuard(ctx);
    let arch = get_str(guard.0, keys::GENERAL_ARCHITECTURE).ok_or_else(|| {
        CliError::new(format!(
            "{}: no {} string",
            path.display(),
            keys::GENERAL_ARCHITECTURE
        ))
    })?;
    let u32_key = |s: &str| get_u32(guard.0, &arch_key(&arch, s));
    Ok(ModelInfo {
        n_layer: u32_key(suffix::BLOCK_COUNT),
        n_ff: u32_key(suffix::FEED_FORWARD_LENGTH),
        ffn_k: u32_key(suffix::SPARK_FFN_K),
        attn_k: u32_key(suffix::SPARK_ATTN_K),
        arch,
    })
}

/// A path as a C string for llama.cpp / ggml.
pub fn path_cstring(path: &Path) -> Result<CString> {
    let s = path
        .to_str()
        .ok_or_else(|| CliError::new(format!("path is not valid UTF-8: {}", path.display())))?;
    CString::new(s).map_err(|_| CliError::new(format!("path contains a NUL byte: {s:?}")))
}

/// Frees the gguf context on drop.
struct GgufGuard(*mut sys::gguf_context);

impl Drop for GgufGuard {
    fn drop(&mut self) {
        // SAFETY: the pointer came from gguf_init_from_file, is non-null and is freed only here.
        unsafe { sys::gguf_free(self.0) }
    }
}

fn find_key(ctx: *mut sys::gguf_context, key: &str) -> Option<i64> {
    let key = CString::new(key).ok()?;
    // SAFETY: ctx is a live gguf context and key a valid C string.
    let id = unsafe { sys::gguf_find_key(ctx, key.as_ptr()) };
    (id >= 0).then_some(id)
}

fn get_str(ctx: *mut sys::gguf_context, key: &str) -> Option<String> {
    let id = find_key(ctx, key)?;
    // SAFETY: id is a valid key index of ctx; the type is checked before reading the value, and
    // the returned string is owned by ctx, which outlives this copy.
    unsafe {
        if sys::gguf_get_kv_type(ctx, id) != sys::GGUF_TYPE_STRING {
            return None;
        }
        let p = sys::gguf_get_val_str(ctx, id);
        (!p.is_null()).then(|| CStr::from_ptr(p).to_string_lossy().into_owned())
    }
}

fn get_u32(ctx: *mut sys::gguf_context, key: &str) -> Option<u32> {
    let id = find_key(ctx, key)?;
    // SAFETY: id is a valid key index of ctx and the type is checked before reading.
    unsafe {
        if sys::gguf_get_kv_type(ctx, id) != sys::GGUF_TYPE_UINT32 {
            return None;
        }
        Some(sys::gguf_get_val_u32(ctx, id))
    }
}
