//! Per-layer sparsity statistics gathered by the kernels (for `--spark-stats`).
//!
//! Counters are relaxed atomics: kernels add one partial sum per thread per call, so the cost is
//! negligible next to the kernels themselves.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// Most layers tracked; later layers are not counted.
pub const MAX_LAYERS: usize = 256;

struct LayerCounters {
    ffn_kept: AtomicU64,
    ffn_tokens: AtomicU64,
    ffn_width: AtomicU64,
    attn_kept: AtomicU64,
    attn_queries: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: LayerCounters = LayerCounters {
    ffn_kept: AtomicU64::new(0),
    ffn_tokens: AtomicU64::new(0),
    ffn_width: AtomicU64::new(0),
    attn_kept: AtomicU64::new(0),
    attn_queries: AtomicU64::new(0),
};

static COUNTERS: [LayerCounters; MAX_LAYERS] = [ZERO; MAX_LAYERS];

/// What one layer's kernels saw since the last [`reset`]. C layout, returned by
/// `spark_stats_get` as `struct spark_layer_stats`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LayerStats {
    /// Sum over tokens of FFN neurons kept.
    pub ffn_kept: u64,
    /// Tokens the FFN kernel processed.
    pub ffn_tokens: u64,
    /// F, the FFN width (0 if the FFN kernel never ran).
    pub ffn_width: u64,
    /// Sum over (query, head) pairs of positions attended.
    pub attn_kept: u64,
    /// (query, head) pairs the attention kernel processed.
    pub attn_queries: u64,
}

impl LayerStats {
    /// Mean fraction of FFN neurons kept per token.
    pub fn ffn_keep_rate(&self) -> f64 {
        if self.ffn_tokens == 0 || self.ffn_width == 0 {
            return 0.0;
        }
        self.ffn_kept as f64 / (self.ffn_tokens as f64 * self.ffn_width as f64)
    }

    /// Mean positions attended per (query, head).
    pub fn attn_mean_positions(&self) -> f64 {
        if self.attn_queries == 0 {
            return 0.0;
        }
        self.attn_kept as f64 / self.attn_queries as f64
    }
}

fn counters(layer: i32) -> Option<&'static LayerCounters> {
    usize::try_from(layer).ok().and_then(|l| COUNTERS.get(l))
}

/// Records `kept` neurons over `tokens` tokens of an FFN of width `width` in `layer`.
pub fn record_ffn(layer: i32, kept: u64, tokens: u64, width: u64) {
    if let Some(c) = counters(layer) {
        c.ffn_kept.fetch_add(kept, Ordering::Relaxed);
        c.ffn_tokens.fetch_add(tokens, Ordering::Relaxed);
        c.ffn_width.store(width, Ordering::Relaxed);
    }
}

/// Records `kept` positions over `queries` (query, head) pairs in `layer`.
pub fn record_attn(layer: i32, kept: u64, queries: u64) {
    if let Some(c) = counters(layer) {
        c.attn_kept.fetch_add(kept, Ordering::Relaxed);
        c.attn_queries.fetch_add(queries, Ordering::Relaxed);
    }
}

/// Clears every layer's counters.
pub fn reset() {
    for c in &COUNTERS {
        c.ffn_kept.store(0, Ordering::Relaxed);
        c.ffn_tokens.store(0, Ordering::Relaxed);
        c.ffn_width.store(0, Ordering::Relaxed);
        c.attn_kept.store(0, Ordering::Relaxed);
        c.attn_queries.store(0, Ordering::Relaxed);
    }
}

/// The counters of `layer`, or `None` when the layer index is out of range.
pub fn snapshot(layer: i32) -> Option<LayerStats> {
    counters(layer).map(|c| LayerStats {
        ffn_kept: c.ffn_kept.load(Ordering::Relaxed),
        ffn_tokens: c.ffn_tokens.load(Ordering::Relaxed),
        ffn_width: c.ffn_width.load(Ordering::Relaxed),
        attn_kept: c.attn_kept.load(Ordering::Relaxed),
        attn_queries: c.attn_queries.load(Ordering::Relaxed),
    })
}

/// The header of the per-layer table (`spark --spark-stats` and `SPARK_STATS=1`); every line of
/// the table starts with `spark-stats: `.
pub const TABLE_HEADER: &str =
    "spark-stats: layer  ffn_keep_rate  ffn_tokens  attn_mean_positions  attn_queries";

/// The start of the report's line naming the CPU kernels' instruction set
/// (`spark-stats: cpu kernels avx2`; `none` when no Spark kernel ran on the CPU, as when every
/// layer ran on a GPU).
const CPU_KERNELS: &str = "spark-stats: cpu kernels";

fn isa_name(isa: Option<crate::arch::Isa>) -> &'static str {
    isa.map_or("none", |i| i.name())
}

/// The report's line naming the CPU kernels' instruction set (`CPU_KERNELS`).
pub fn cpu_kernels_line(isa: Option<crate::arch::Isa>) -> String {
    format!("{CPU_KERNELS} {}", isa_name(isa))
}

/// One row of the table: layer, then FFN keep rate, FFN tokens, mean attended positions and
/// (query, head) pairs.
pub fn table_row(layer: u32, s: &LayerStats) -> String {
    let mut row = String::new();
    write_row(&mut row, layer, s).expect("formatting into a String does not fail");
    row
}

fn write_row(w: &mut impl fmt::Write, layer: u32, s: &LayerStats) -> fmt::Result {
    write!(
        w,
        "spark-stats: {layer:5}  {:13.4}  {:10}  {:19.2}  {:12}",
        s.ffn_keep_rate(),
        s.ffn_tokens,
        s.attn_mean_positions(),
        s.attn_queries
    )
}

/// The table of this copy's counters for a process that does not know its layer count (the
/// plugin in an upstream tool): the header and layers 0 to the last one any kernel ran in, or
/// one line saying that none ran.
pub(crate) fn process_table() -> Vec<String> {
    let mut text = String::new();
    write_process_table(&mut text).expect("formatting into a String does not fail");
    text.lines().map(str::to_owned).collect()
}

/// [`process_table`] written to `w`, each line ended by a newline, without allocating (the
/// plugin writes it from a signal handler: `crate::plugin`).
pub(crate) fn write_process_table(w: &mut impl fmt::Write) -> fmt::Result {
    let active = |s: &LayerStats| s.ffn_tokens > 0 || s.attn_queries > 0;
    let Some(last) = (0..MAX_LAYERS as i32)
        .rev()
        .find(|&l| snapshot(l).is_some_and(|s| active(&s)))
    else {
        return writeln!(
            w,
            "spark-stats: no Spark kernel ran in this process (no spark-gemma2 model, or its dense graph)"
        );
    };
    writeln!(w, "{CPU_KERNELS} {}", isa_name(crate::arch::in_use()))?;
    writeln!(w, "{TABLE_HEADER}")?;
    for layer in 0..=last {
        write_row(w, layer as u32, &snapshot(layer).unwrap_or_default())?;
        writeln!(w)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_rows_put_the_layer_then_the_ffn_keep_rate_first() {
        let s = LayerStats {
            ffn_kept: 30,
            ffn_tokens: 3,
            ffn_width: 100,
            attn_kept: 50,
            attn_queries: 4,
        };
        let row = table_row(7, &s);
        let fields: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(fields, ["spark-stats:", "7", "0.1000", "3", "12.50", "4"]);
        let header: Vec<&str> = TABLE_HEADER.split_whitespace().collect();
        assert_eq!(header.len(), fields.len());
        assert_eq!(header[1..3], ["layer", "ffn_keep_rate"]);
    }
}
