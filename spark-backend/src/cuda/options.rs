//! What NVRTC compiles (a [`CudaSource`] of an op's folder, with the [`HEADERS`] it may
//! include) and the options every Spark kernel is compiled with, at run time and in the tests
//! (one function, [`nvrtc_options`]): the target architecture and the ggml type ids, block sizes and
//! block byte sizes as `-D` macros, read from the linked ggml (`ggml_blck_size`,
//! `ggml_type_size`) so that no block layout is typed by hand twice; the CUDA C structs
//! `static_assert` their sizes against these macros (`kernels/common.cuh`).

use llama_cpp_sys_2 as sys;

/// The weight types the CUDA kernels read (K2 and V of the FFN), with the stem of their
/// macros (`SPARK_T_<stem>` = ggml type id, `SPARK_BLCK_<stem>`, `SPARK_SIZE_<stem>`).
pub(crate) const GPU_WEIGHT_TYPES: [(u32, &str); 11] = [
    (sys::GGML_TYPE_F32, "F32"),
    (sys::GGML_TYPE_F16, "F16"),
    (sys::GGML_TYPE_BF16, "BF16"),
    (sys::GGML_TYPE_Q8_0, "Q8_0"),
    (sys::GGML_TYPE_Q4_0, "Q4_0"),
    (sys::GGML_TYPE_Q4_1, "Q4_1"),
    (sys::GGML_TYPE_Q5_0, "Q5_0"),
    (sys::GGML_TYPE_Q5_1, "Q5_1"),
    (sys::GGML_TYPE_Q4_K, "Q4_K"),
    (sys::GGML_TYPE_Q5_K, "Q5_K"),
    (sys::GGML_TYPE_Q6_K, "Q6_K"),
];

/// True when the CUDA kernels can read weights of ggml type `ty`.
pub(crate) fn is_gpu_weight_type(ty: u32) -> bool {
    GPU_WEIGHT_TYPES.iter().any(|&(t, _)| t == ty)
}

/// (elements per block, bytes per block) of ggml type `ty`, from ggml.
pub(crate) fn block_layout(ty: u32) -> (usize, usize) {
    // SAFETY: both take any type id of the enum and only read ggml's static type traits; `ty`
    // comes from GPU_WEIGHT_TYPES or a tensor's type field, both valid ids.
    let (blck, size) = unsafe { (sys::ggml_blck_size(ty), sys::ggml_type_size(ty)) };
    (usize::try_from(blck).unwrap_or(0), size)
}

/// `-D` macros for every type of [`GPU_WEIGHT_TYPES`]: its ggml id, block size and bytes per
/// block.
pub fn type_macros() -> Vec<String> {
    let mut out = Vec::with_capacity(3 * GPU_WEIGHT_TYPES.len());
    for (ty, stem) in GPU_WEIGHT_TYPES {
        let (blck, size) = block_layout(ty);
        out.push(format!("-DSPARK_T_{stem}={ty}"));
        out.push(format!("-DSPARK_BLCK_{stem}={blck}"));
        out.push(format!("-DSPARK_SIZE_{stem}={size}"));
    }
    out
}

/// A CUDA C file compiled by NVRTC.
#[derive(Debug, Clone, Copy)]
pub struct CudaSource {
    /// File name (also the name NVRTC reports errors under, and the module cache's key).
    pub name: &'static str,
    /// Its text.
    pub text: &'static str,
}

/// Every header (`.cuh`) the sources may `#include "name"`.
pub const HEADERS: &[CudaSource] = &[CudaSource {
    name: "common.cuh",
    text: include_str!("common.cuh"),
}];

/// What NVRTC produces for a device of compute capability `major.minor`: a CUBIN for exactly
/// that architecture (`sm_XY`; the driver never has to JIT a PTX ISA newer than it knows) or,
/// as the fallback, PTX for the virtual architecture (`compute_XY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    /// Compute capability major.
    pub major: i32,
    /// Compute capability minor.
    pub minor: i32,
    /// CUBIN (true) or PTX (false).
    pub cubin: bool,
}

impl Target {
    /// The `--gpu-architecture` value.
    pub fn arch(&self) -> String {
        let kind = if self.cubin { "sm" } else { "compute" };
        format!("{kind}_{}{}", self.major, self.minor)
    }
}

/// The options of every Spark kernel compilation: architecture, C++17, no fast math (the
/// thresholds compare scores bit for bit with the CPU path), and [`type_macros`].
pub fn nvrtc_options(target: Target) -> Vec<String> {
    let mut out = vec![
        format!("--gpu-architecture={}", target.arch()),
        "--std=c++17".to_owned(),
        "--fmad=true".to_owned(),
        "--ftz=false".to_owned(),
        "--prec-div=true".to_owned(),
        "--prec-sqrt=true".to_owned(),
    ];
    out.extend(type_macros());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macros_carry_ggml_block_layouts() {
        let m = type_macros();
        assert!(m.contains(&format!("-DSPARK_T_Q8_0={}", sys::GGML_TYPE_Q8_0)));
        assert!(m.contains(&"-DSPARK_BLCK_Q8_0=32".to_owned()), "{m:?}");
        assert!(m.contains(&"-DSPARK_SIZE_Q8_0=34".to_owned()), "{m:?}");
        assert!(m.contains(&"-DSPARK_BLCK_Q6_K=256".to_owned()), "{m:?}");
        assert!(m.contains(&"-DSPARK_SIZE_F32=4".to_owned()), "{m:?}");
        assert_eq!(m.len(), 3 * GPU_WEIGHT_TYPES.len());
    }

    #[test]
    fn targets_name_their_architecture() {
        let t = Target {
            major: 9,
            minor: 0,
            cubin: true,
        };
        assert_eq!(t.arch(), "sm_90");
        assert_eq!(Target { cubin: false, ..t }.arch(), "compute_90");
        assert!(nvrtc_options(t).contains(&"--gpu-architecture=sm_90".to_owned()));
    }
}
