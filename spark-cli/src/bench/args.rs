//! `spark bench`'s command line: llama-bench's flags (`-m -p -n -d -b -ub -r -t -o`) and
//! Spark's (`--modes`, the k overrides), checked by clap where it can and by [`ubatch_sizes`]
//! for llama-bench's `-ub` spelling.

use crate::error::{CliError, Result};
use crate::session::{CacheType, KOverrides};
use clap::{Args, ValueEnum};
use serde::{Serialize, Serializer};
use std::path::PathBuf;

/// What `-o` prints on stdout (llama-bench's format names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// A markdown table.
    Md,
    /// A header line and one quoted record per test.
    Csv,
    /// One JSON array of objects.
    Json,
    /// One JSON object per line.
    Jsonl,
}

/// Which graph a measurement runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Spark kernels registered in-process (the sparse path).
    Sparse,
    /// No kernels: the dense stock-op graph (non-Spark models always run this way).
    Dense,
}

impl Mode {
    /// The value of `--modes` and `--child` that names the mode.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Sparse => "sparse",
            Mode::Dense => "dense",
        }
    }
}

/// What a row measured (its `spark_mode`): a Spark model in one of the [`Mode`]s, or a model
/// without Spark tensors on its own stock graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SparkMode {
    /// A Spark model with the kernels.
    Sparse,
    /// A Spark model on the dense stock-op graph.
    Dense,
    /// A non-Spark model (run through its own stock graph).
    Stock,
}

impl SparkMode {
    /// The name in the table and the records.
    pub fn name(self) -> &'static str {
        match self {
            SparkMode::Sparse => "sparse",
            SparkMode::Dense => "dense",
            SparkMode::Stock => "stock",
        }
    }

    /// The graph the measuring process runs.
    pub fn graph(self) -> Mode {
        match self {
            SparkMode::Sparse => Mode::Sparse,
            SparkMode::Dense | SparkMode::Stock => Mode::Dense,
        }
    }
}

impl Serialize for SparkMode {
    /// As its [`name`](SparkMode::name).
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl From<Mode> for SparkMode {
    fn from(m: Mode) -> Self {
        match m {
            Mode::Sparse => SparkMode::Sparse,
            Mode::Dense => SparkMode::Dense,
        }
    }
}

/// llama-bench's default `-b`.
pub const DEFAULT_BATCH: u32 = 2048;
/// llama-bench's default `-ub`.
pub const DEFAULT_UBATCH: u32 = 512;

/// Arguments of `spark bench`.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// GGUF model file (repeat to compare models).
    #[arg(short = 'm', long = "model", value_name = "MODEL", required = true)]
    pub models: Vec<PathBuf>,
    /// Prompt tokens of the pp tests (comma-separated list; 0 = no pp test).
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_name = "N[,N..]",
        value_delimiter = ',',
        default_value = "512",
        value_parser = parse_count,
        allow_negative_numbers = true
    )]
    pub n_prompt: Vec<u32>,
    /// Generated tokens of the tg tests (comma-separated list; 0 = no tg test).
    #[arg(
        short = 'n',
        long = "n-gen",
        value_name = "N[,N..]",
        value_delimiter = ',',
        default_value = "128",
        value_parser = parse_count,
        allow_negative_numbers = true
    )]
    pub n_gen: Vec<u32>,
    /// Context depth: tokens processed (not timed) before each test (comma-separated list).
    #[arg(
        short = 'd',
        long = "n-depth",
        value_name = "N[,N..]",
        value_delimiter = ',',
        default_value = "0",
        value_parser = parse_count,
        allow_negative_numbers = true
    )]
    pub n_depth: Vec<u32>,
    /// Logical batch size: tokens per llama_decode call (llama.cpp n_batch).
    #[arg(
        short = 'b',
        long = "batch-size",
        value_name = "N",
        default_value_t = DEFAULT_BATCH,
        value_parser = parse_positive,
        allow_negative_numbers = true
    )]
    pub batch: u32,
    /// Physical batch size, llama.cpp n_ubatch (comma-separated list; at most -b; default 512).
    /// llama-bench's spelling `-ub N` works too.
    #[arg(
        long = "ubatch-size",
        visible_alias = "ub",
        value_name = "N[,N..]",
        value_delimiter = ',',
        value_parser = parse_positive,
        allow_negative_numbers = true
    )]
    pub ubatch: Vec<u32>,
    /// `-ub N` (llama-bench's spelling): clap reads it as `-u` with the value `b`, so the `b`
    /// lands here and N among `ub_values`; [`ubatch_sizes`] puts them back together.
    #[arg(short = 'u', hide = true, value_name = "b")]
    pub ub_short: Vec<String>,
    /// The values that follow `-ub` (see `ub_short`).
    #[arg(hide = true, value_name = "N", allow_negative_numbers = true)]
    pub ub_values: Vec<String>,
    /// Repetitions of every measurement.
    #[arg(
        short = 'r',
        long = "repetitions",
        value_name = "N",
        default_value_t = 3,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub reps: u32,
    /// Threads (default: all cores).
    #[arg(short = 't', long = "threads", value_name = "N", value_parser = clap::value_parser!(i32).range(1..))]
    pub threads: Option<i32>,
    /// KV cache element type (llama-bench's type_k and type_v).
    #[arg(long = "cache-type", value_enum, default_value_t = CacheType::F16)]
    pub cache_type: CacheType,
    /// Output format on stdout (progress goes to stderr).
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Md)]
    pub output: Output,
    /// Skip the warm-up run before each test.
    #[arg(long = "no-warmup")]
    pub no_warmup: bool,
    /// Modes to compare on Spark models (non-Spark models run once, on the stock graph).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "sparse,dense"
    )]
    pub modes: Vec<Mode>,
    /// k overrides (Spark models).
    #[command(flatten)]
    pub k: KOverrides,
    /// No progress lines.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// Internal: run every test once in this process and print result lines.
    #[arg(long, value_enum, hide = true)]
    pub child: Option<Mode>,
}

/// A count such as `-p`, `-n` or `-d` (0 allowed).
fn parse_count(s: &str) -> std::result::Result<u32, String> {
    s.trim()
        .parse::<u32>()
        .map_err(|_| "expected a whole number >= 0".to_string())
}

/// A size such as `-b` or `-ub` (at least 1).
fn parse_positive(s: &str) -> std::result::Result<u32, String> {
    match s.trim().parse::<u32>() {
        Ok(v) if v >= 1 => Ok(v),
        _ => Err("expected a whole number >= 1".to_string()),
    }
}

/// The ubatch sizes of `--ubatch-size` and `-ub`, in order; llama-bench's default when neither
/// is given.
pub fn ubatch_sizes(args: &BenchArgs) -> Result<Vec<u32>> {
    let mut sizes = args.ubatch.clone();
    let mut values = args.ub_values.iter();
    for u in &args.ub_short {
        let rest = u.strip_prefix('b').ok_or_else(|| {
            CliError::new(format!(
                "unknown option '-u{u}' (the ubatch size is -ub N or --ubatch-size N)"
            ))
        })?;
        let rest = rest.strip_prefix('=').unwrap_or(rest);
        let list = if rest.is_empty() {
            values
                .next()
                .map(String::as_str)
                .ok_or_else(|| CliError::new("-ub needs a value"))?
        } else {
            rest
        };
        for part in list.split(',') {
            let v = parse_positive(part)
                .map_err(|e| CliError::new(format!("invalid value '{part}' for '-ub': {e}")))?;
            sizes.push(v);
        }
    }
    if let Some(v) = values.next() {
        return Err(CliError::new(format!("unexpected argument '{v}'")));
    }
    if sizes.is_empty() {
        sizes.push(DEFAULT_UBATCH);
    }
    Ok(sizes)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: BenchArgs,
    }

    /// `spark bench ARGV` as clap parses it.
    pub(in crate::bench) fn parse(argv: &[&str]) -> std::result::Result<BenchArgs, clap::Error> {
        Cli::try_parse_from(["bench"].iter().chain(argv)).map(|c| c.args)
    }

    #[test]
    fn ubatch_spellings() {
        let ub = |argv: &[&str]| ubatch_sizes(&parse(argv).unwrap());
        assert_eq!(ub(&["-m", "x"]).unwrap(), [512]);
        assert_eq!(ub(&["-m", "x", "-ub", "256"]).unwrap(), [256]);
        assert_eq!(ub(&["-m", "x", "-ub", "8,16", "-d", "0"]).unwrap(), [8, 16]);
        assert_eq!(
            ub(&["-m", "x", "-ub8", "-ub=16", "-ub", "32"]).unwrap(),
            [8, 16, 32]
        );
        assert_eq!(
            ub(&["-m", "x", "--ubatch-size", "64,128"]).unwrap(),
            [64, 128]
        );
        assert_eq!(ub(&["-m", "x", "--ub", "64"]).unwrap(), [64]);
        assert_eq!(
            ub(&["-m", "x", "--ubatch-size", "64", "-ub", "128"]).unwrap(),
            [64, 128]
        );
    }

    #[test]
    fn modes_name_the_graph_they_run() {
        for m in [Mode::Sparse, Mode::Dense] {
            assert_eq!(SparkMode::from(m).graph(), m);
            assert_eq!(SparkMode::from(m).name(), m.name());
            // --child takes the name back
            let a = parse(&["-m", "x", "--child", m.name()]).unwrap();
            assert_eq!(a.child, Some(m));
        }
        assert_eq!(SparkMode::Stock.graph(), Mode::Dense);
        assert_eq!(
            serde_json::to_string(&SparkMode::Stock).unwrap(),
            "\"stock\""
        );
    }
}
