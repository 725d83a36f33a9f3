//! The `--spark-stats` report: the kernels' per-layer counters, read from wherever the kernels
//! came from ([`KernelSource`]), cleared and printed as a table.

use crate::kernel_source::KernelSource;
use llama_cpp_sys_2 as sys;
use std::ffi::{c_int, c_void, CString};

/// One layer's counters, as returned by the kernels.
pub type LayerStats = spark_backend::stats::LayerStats;

/// `int spark_stats_get(int layer, struct spark_layer_stats * out)`.
type StatsGetFn = unsafe extern "C" fn(c_int, *mut LayerStats) -> c_int;
/// `void spark_stats_reset(void)`.
type StatsResetFn = unsafe extern "C" fn();

/// Looks up a function exported by the registered "Spark" entry.
fn spark_proc(name: &str) -> Option<*mut c_void> {
    let reg_name = CString::new("Spark").ok()?;
    let proc_name = CString::new(name).ok()?;
    // SAFETY: both are valid C strings; the registry lookups return null when absent.
    unsafe {
        let reg = sys::ggml_backend_reg_by_name(reg_name.as_ptr());
        if reg.is_null() {
            return None;
        }
        let p = sys::ggml_backend_reg_get_proc_address(reg, proc_name.as_ptr());
        (!p.is_null()).then_some(p)
    }
}

/// Clears the kernels' counters.
pub fn reset_stats(source: &KernelSource) {
    match source {
        KernelSource::Dense => {}
        KernelSource::InProcess => spark_backend::stats::reset(),
        KernelSource::Plugin(_) => {
            if let Some(p) = spark_proc("spark_stats_reset") {
                // SAFETY: the plugin exports spark_stats_reset with this signature (INTERFACES.md).
                unsafe {
                    let f: StatsResetFn = std::mem::transmute::<*mut c_void, StatsResetFn>(p);
                    f();
                }
            }
        }
    }
}

/// The counters of `layer` (zeros when no kernel ran).
pub fn layer_stats(source: &KernelSource, layer: u32) -> LayerStats {
    let layer = i32::try_from(layer).unwrap_or(i32::MAX);
    match source {
        KernelSource::Dense => LayerStats::default(),
        KernelSource::InProcess => spark_backend::stats::snapshot(layer).unwrap_or_default(),
        KernelSource::Plugin(_) => {
            let mut out = LayerStats::default();
            if let Some(p) = spark_proc("spark_stats_get") {
                // SAFETY: the plugin exports spark_stats_get with this signature; `out` is a
                // valid, writable struct of the C layout it fills.
                unsafe {
                    let f: StatsGetFn = std::mem::transmute::<*mut c_void, StatsGetFn>(p);
                    if f(layer, &mut out) != 0 {
                        out = LayerStats::default();
                    }
                }
            }
            out
        }
    }
}

/// The targets the stats are judged against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Targets {
    /// F.
    pub n_ff: Option<u32>,
    /// k_f in effect.
    pub ffn_k: Option<u32>,
    /// k_a in effect.
    pub attn_k: Option<u32>,
}

/// Prints the per-layer `--spark-stats` table to stderr.
pub fn print_stats(source: &KernelSource, n_layer: u32, targets: Targets) {
    if *source == KernelSource::Dense {
        eprintln!("spark-stats: dense graph (--dense): no Spark kernels ran, nothing counted");
        return;
    }
    let target_rate = match (targets.ffn_k, targets.n_ff) {
        (Some(k), Some(f)) if f > 0 => format!("{:.4}", (k.min(f)) as f64 / f as f64),
        _ => "?".to_string(),
    };
    let attn_k = targets.attn_k.map_or("?".to_string(), |k| k.to_string());
    eprintln!("spark-stats: target ffn keep rate k_f/F = {target_rate}, attention k_a = {attn_k}");
    eprintln!(
        "{}",
        spark_backend::stats::cpu_kernels_line(spark_backend::arch::in_use())
    );
    eprintln!("{}", spark_backend::stats::TABLE_HEADER);
    for layer in 0..n_layer {
        eprintln!(
            "{}",
            spark_backend::stats::table_row(layer, &layer_stats(source, layer))
        );
    }
}
