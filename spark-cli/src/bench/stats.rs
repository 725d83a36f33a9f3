//! From the children's reports to output rows: the samples of each test of each entry over the
//! repetitions, their mean +- standard deviation (llama-bench's `avg_ts`/`stddev_ts`,
//! `avg_ns`/`stddev_ns`), and the ratios between rows (ratios of the means).

use super::args::{BenchArgs, SparkMode};
use super::child::{ChildReport, TestResult};
use super::plan::{Entry, TestSpec};
use super::time::{rfc3339, unix_now};
use crate::error::{CliError, Result};
use crate::mean_sd::mean_sd;
use crate::session::{thread_count, CacheType};

/// One output record: one test of one (model, mode), over all repetitions.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The model file as given.
    pub model_filename: String,
    /// llama-bench's model_type.
    pub model_type: String,
    /// Bytes of the model's tensors.
    pub model_size: u64,
    /// Parameters.
    pub model_n_params: u64,
    /// llama-bench's backends in the measuring process.
    pub backends: String,
    /// What the row measured.
    pub mode: SparkMode,
    /// llama.cpp's n_batch (`-b`).
    pub n_batch: u32,
    /// Threads.
    pub n_threads: i32,
    /// KV cache type (type_k and type_v).
    pub cache_type: CacheType,
    /// The test.
    pub test: TestSpec,
    /// When the first repetition started (RFC 3339).
    pub test_time: String,
    /// The timed nanoseconds of each repetition.
    pub samples_ns: Vec<u64>,
    /// avg_ts of this sparse row over avg_ts of the dense row of the same model and test.
    pub ratio_vs_dense: Option<f64>,
    /// avg_ts of this row of a Spark model over avg_ts of the stock model's row of the same
    /// test, when the run has exactly one stock (non-Spark) model.
    pub ratio_vs_stock: Option<f64>,
}

impl Row {
    /// Tokens per second of each repetition.
    pub fn samples_ts(&self) -> Vec<f64> {
        let n = self.test.n_tokens() as f64;
        self.samples_ns
            .iter()
            .map(|&ns| 1e9 * n / ns.max(1) as f64)
            .collect()
    }

    /// (avg_ts, stddev_ts).
    pub fn ts(&self) -> (f64, f64) {
        mean_sd(&self.samples_ts())
    }

    /// (avg_ns, stddev_ns), rounded to whole nanoseconds as llama-bench prints them.
    pub fn ns(&self) -> (u64, u64) {
        let v: Vec<f64> = self.samples_ns.iter().map(|&x| x as f64).collect();
        let (m, s) = mean_sd(&v);
        (m.round() as u64, s.round() as u64)
    }
}

/// The records of a run, in entry order (model, mode), then test order; `reports[i]` holds the
/// reports of `entries[i]`, one per repetition.
pub fn build_rows(
    args: &BenchArgs,
    entries: &[Entry],
    tests: &[TestSpec],
    reports: &[Vec<ChildReport>],
) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for (entry, reports) in entries.iter().zip(reports) {
        let meta = &reports
            .first()
            .ok_or_else(|| CliError::new("no measurement"))?
            .meta;
        for &test in tests {
            let runs: Vec<&TestResult> = reports
                .iter()
                .filter_map(|r| r.results.iter().find(|x| x.test == test))
                .collect();
            rows.push(Row {
                model_filename: entry.model.display().to_string(),
                model_type: meta.model_type.clone(),
                model_size: meta.model_size,
                model_n_params: meta.model_n_params,
                backends: meta.backends.clone(),
                mode: entry.mode,
                n_batch: args.batch,
                n_threads: thread_count(args.threads),
                cache_type: args.cache_type,
                test,
                test_time: rfc3339(runs.first().map_or_else(unix_now, |r| r.started)),
                samples_ns: runs.iter().map(|r| r.ns).collect(),
                ratio_vs_dense: None,
                ratio_vs_stock: None,
            });
        }
    }
    set_ratios(&mut rows);
    Ok(rows)
}

/// Fills `ratio_vs_dense` of every sparse row that has a dense row of the same model and test,
/// and `ratio_vs_stock` of every row of a Spark model when the run has exactly one stock model
/// with a row of the same test (with several, which one a ratio refers to would be a guess).
pub fn set_ratios(rows: &mut [Row]) {
    let one_stock_model = {
        let mut files: Vec<&str> = rows
            .iter()
            .filter(|r| r.mode == SparkMode::Stock)
            .map(|r| r.model_filename.as_str())
            .collect();
        files.sort_unstable();
        files.dedup();
        files.len() == 1
    };
    for i in 0..rows.len() {
        let row = &rows[i];
        let ratio_to = |other: &dyn Fn(&Row) -> bool| {
            rows.iter()
                .find(|r| r.test == row.test && other(r))
                .map(|r| row.ts().0 / r.ts().0)
        };
        let vs_dense = if row.mode == SparkMode::Sparse {
            ratio_to(&|r| r.mode == SparkMode::Dense && r.model_filename == row.model_filename)
        } else {
            None
        };
        let vs_stock = if one_stock_model && row.mode != SparkMode::Stock {
            ratio_to(&|r| r.mode == SparkMode::Stock)
        } else {
            None
        };
        rows[i].ratio_vs_dense = vs_dense;
        rows[i].ratio_vs_stock = vs_stock;
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A sparse and a dense row of one test, and a stock row.
    pub(in crate::bench) fn fixed_rows() -> Vec<Row> {
        let base = Row {
            model_filename: "models/a \"b\".gguf".into(),
            model_type: "spark-gemma2 2B F16".into(),
            model_size: 5 << 30,
            model_n_params: 2_600_000_000,
            backends: "Spark".into(),
            mode: SparkMode::Sparse,
            n_batch: 2048,
            n_threads: 2,
            cache_type: CacheType::F16,
            test: TestSpec {
                n_prompt: 0,
                n_gen: 128,
                n_depth: 4096,
                n_ubatch: 512,
            },
            test_time: "2025-04-24T11:57:09Z".into(),
            samples_ns: vec![1_000_000_000, 2_000_000_000],
            ratio_vs_dense: None,
            ratio_vs_stock: None,
        };
        let dense = Row {
            backends: "CPU".into(),
            mode: SparkMode::Dense,
            samples_ns: vec![4_000_000_000, 4_000_000_000],
            ..base.clone()
        };
        let stock = Row {
            model_filename: "g.gguf".into(),
            model_type: "gemma2 2B Q8_0".into(),
            model_size: 3 << 20,
            model_n_params: 5_400_000,
            backends: "CPU".into(),
            mode: SparkMode::Stock,
            test: TestSpec {
                n_prompt: 512,
                n_gen: 0,
                n_depth: 0,
                n_ubatch: 512,
            },
            samples_ns: vec![500_000_000],
            ..base.clone()
        };
        let mut rows = vec![base, dense, stock];
        set_ratios(&mut rows);
        rows
    }

    #[test]
    fn ratios_compare_sparse_with_dense_of_the_same_test() {
        let rows = fixed_rows();
        // sparse: 128 t/s and 64 t/s -> 96; dense: 32 -> 3.0x
        assert!((rows[0].ts().0 - 96.0).abs() < 1e-9);
        assert!((rows[0].ratio_vs_dense.unwrap() - 3.0).abs() < 1e-9);
        assert_eq!(rows[1].ratio_vs_dense, None);
        assert_eq!(rows[2].ratio_vs_dense, None);
    }
}
