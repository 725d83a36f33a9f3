//! How the Spark kernels reach llama.cpp: registered in this process, loaded from a plugin
//! file, or not at all ([`KernelSource`]).

use crate::error::{CliError, Result};
use crate::gguf_info::path_cstring;
use llama_cpp_sys_2 as sys;
use std::path::PathBuf;

/// Where the "Spark" ggml registry entry comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelSource {
    /// No registry entry: the patched graph uses its dense stock-op path.
    Dense,
    /// `spark_backend::registry::register()` in this process.
    InProcess,
    /// A shared library loaded with `ggml_backend_load` (like `GGML_BACKEND_PATH`).
    Plugin(PathBuf),
}

/// Makes the Spark kernels available to the graph according to `source`.
pub fn activate(source: &KernelSource) -> Result<()> {
    match source {
        KernelSource::Dense => Ok(()),
        KernelSource::InProcess => {
            spark_backend::registry::register();
            Ok(())
        }
        KernelSource::Plugin(path) => {
            if !path.is_file() {
                return Err(CliError::new(format!(
                    "backend library not found: {}",
                    path.display()
                )));
            }
            let c_path = path_cstring(path)?;
            // SAFETY: c_path is a valid C string; ggml_backend_load returns null on failure and
            // registers the library's entry on success.
            let reg = unsafe { sys::ggml_backend_load(c_path.as_ptr()) };
            if reg.is_null() {
                return Err(CliError::new(format!(
                    "could not load a ggml backend from {}",
                    path.display()
                )));
            }
            Ok(())
        }
    }
}
