//! `spark quantize`: llama.cpp's own quantizer (`llama_model_quantize`) on any GGUF it can load.
//!
//! The quantizer keeps every tensor's name and shape, so a file's layout (SPEC section 3:
//! `attn_qkv` stacked, `ffn_k2v` paired) carries over. It types a paired `ffn_k2v` as one
//! matrix; where the asked type's blocks would not make both parts of its rows (K2's D - r_f
//! values, V's D) whole, it falls back to a type whose blocks do (patch 0024, as for a row the
//! type does not divide: q4_K -> q5_0). The output is checked against that rule all the same
//! (a quantizer without the patch writes a file the loader refuses): one that breaks it is
//! refused and removed.

use crate::error::{CliError, Result};
use crate::gguf_info::{self, path_cstring};
use crate::llama_log;
use clap::Args;
use llama_cpp_sys_2 as sys;
use std::path::{Path, PathBuf};

/// Arguments of `spark quantize`.
#[derive(Debug, Clone, Args)]
pub struct QuantizeArgs {
    /// Input GGUF.
    #[arg(value_name = "IN.gguf")]
    pub input: PathBuf,
    /// Output GGUF.
    #[arg(value_name = "OUT.gguf")]
    pub output: PathBuf,
    /// Target type: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K_M, Q4_K_S, Q4_K_M,
    /// Q5_K_S, Q5_K_M, Q6_K.
    #[arg(value_name = "TYPE")]
    pub ftype: String,
    /// Threads (default: all cores).
    #[arg(value_name = "THREADS")]
    pub threads: Option<i32>,
    /// Print nothing on success.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// Show llama.cpp's log.
    #[arg(long, short = 'v')]
    pub verbose: bool,
}

/// The llama.cpp file type for a type name (case-insensitive).
pub fn parse_ftype(name: &str) -> Option<sys::llama_ftype> {
    let t = match name.to_ascii_uppercase().as_str() {
        "F32" => sys::LLAMA_FTYPE_ALL_F32,
        "F16" => sys::LLAMA_FTYPE_MOSTLY_F16,
        "BF16" => sys::LLAMA_FTYPE_MOSTLY_BF16,
        "Q8_0" => sys::LLAMA_FTYPE_MOSTLY_Q8_0,
        "Q4_0" => sys::LLAMA_FTYPE_MOSTLY_Q4_0,
        "Q4_1" => sys::LLAMA_FTYPE_MOSTLY_Q4_1,
        "Q5_0" => sys::LLAMA_FTYPE_MOSTLY_Q5_0,
        "Q5_1" => sys::LLAMA_FTYPE_MOSTLY_Q5_1,
        "Q2_K" => sys::LLAMA_FTYPE_MOSTLY_Q2_K,
        "Q3_K_M" => sys::LLAMA_FTYPE_MOSTLY_Q3_K_M,
        "Q4_K_S" => sys::LLAMA_FTYPE_MOSTLY_Q4_K_S,
        "Q4_K_M" => sys::LLAMA_FTYPE_MOSTLY_Q4_K_M,
        "Q5_K_S" => sys::LLAMA_FTYPE_MOSTLY_Q5_K_S,
        "Q5_K_M" => sys::LLAMA_FTYPE_MOSTLY_Q5_K_M,
        "Q6_K" => sys::LLAMA_FTYPE_MOSTLY_Q6_K,
        _ => return None,
    };
    Some(t)
}

/// Runs `spark quantize`.
pub fn run(args: &QuantizeArgs) -> Result<()> {
    llama_log::install(args.verbose);
    let ftype = parse_ftype(&args.ftype).ok_or_else(|| {
        CliError::new(format!(
            "unknown quantization type {:?} (try Q8_0, Q4_0, Q4_K_M)",
            args.ftype
        ))
    })?;
    let threads = args.threads.unwrap_or(0);
    if threads < 0 {
        return Err(CliError::new(format!(
            "THREADS must be at least 0, got {threads}"
        )));
    }
    let info = gguf_info::read(&args.input)?;
    if args.output.exists() && same_file(&args.input, &args.output) {
        return Err(CliError::new("input and output are the same file"));
    }
    let c_in = path_cstring(&args.input)?;
    let c_out = path_cstring(&args.output)?;
    // SAFETY: plain C call returning a struct by value.
    let mut params = unsafe { sys::llama_model_quantize_default_params() };
    params.ftype = ftype;
    params.nthread = threads;
    llama_log::clear_errors();
    // SAFETY: both paths are valid C strings and params is a properly initialised struct that
    // outlives the call; llama_model_quantize catches its own exceptions and returns non-zero.
    let rc = unsafe {
        sys::llama_backend_init();
        sys::llama_model_quantize(c_in.as_ptr(), c_out.as_ptr(), &params)
    };
    if rc != 0 {
        let _ = std::fs::remove_file(&args.output);
        let cause = llama_log::last_error()
            .unwrap_or_else(|| format!("llama_model_quantize returned {rc}"));
        return Err(CliError::new(format!(
            "cannot quantize {}: {cause}",
            args.input.display()
        )));
    }
    if let Err(cause) = check_row_parts(&args.output) {
        let _ = std::fs::remove_file(&args.output);
        return Err(CliError::new(format!(
            "cannot quantize {} to {}: {cause}",
            args.input.display(),
            args.ftype.to_ascii_uppercase()
        )));
    }
    if !args.quiet {
        let size = |p: &PathBuf| {
            std::fs::metadata(p)
                .map(|m| m.len() as f64 / (1024.0 * 1024.0))
                .unwrap_or(0.0)
        };
        eprintln!(
            "spark: quantized {} ({}, {:.1} MiB) to {} ({}, {:.1} MiB)",
            args.input.display(),
            info.arch,
            size(&args.input),
            args.output.display(),
            args.ftype.to_ascii_uppercase(),
            size(&args.output)
        );
    }
    Ok(())
}

/// Checks the quantized file at `path` against SPEC section 3's rule for tensors made of row
/// parts (`ffn_k2v`: each part of a row whole blocks of the tensor's type), naming the first
/// tensor that breaks it.
fn check_row_parts(path: &Path) -> std::result::Result<(), String> {
    let f = spark_gguf::GgufFile::open(path)
        .map_err(|e| format!("the output does not read back: {e}"))?;
    match spark_gguf::validate::row_part_violations(&f).first() {
        None => Ok(()),
        Some(v) => Err(format!(
            "{v} (a file converted with --pair-k2v needs a type whose blocks divide both D - r_f \
             and D; convert without --pair-k2v to quantize it to this type)"
        )),
    }
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::parse_ftype;

    #[test]
    fn knows_the_common_types() {
        assert_eq!(
            parse_ftype("q4_k_m"),
            Some(llama_cpp_sys_2::LLAMA_FTYPE_MOSTLY_Q4_K_M)
        );
        assert_eq!(
            parse_ftype("Q8_0"),
            Some(llama_cpp_sys_2::LLAMA_FTYPE_MOSTLY_Q8_0)
        );
        assert_eq!(parse_ftype("Q9"), None);
    }
}
