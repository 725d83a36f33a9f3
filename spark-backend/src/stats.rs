//! Per-layer sparsity statistics gathered by the kernels (for `--spark-stats`).
//!
//! Counters are relaxed atomics: kernels add one partial sum per thread per call, so the cost is
//! negligible next to the kernels themselves.

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
