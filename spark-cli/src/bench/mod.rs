//! `spark bench`: prompt-processing and generation speed with llama-bench's tests, flags and
//! output formats (`pp512`, `tg128`, `pp512 @ d4096`; `-p -n -d -b -ub -r -t -o`), with the Spark
//! kernels and with the dense stock-op graph **side by side in one run**.
//!
//! The kernels are registered per process (a registered "Spark" entry cannot be removed), so each
//! measurement runs in a child process (`spark bench --child MODE ...`) that loads the model and
//! runs every test once, as llama-bench runs one repetition: a context of
//! `n_prompt + n_gen + n_depth` tokens, a warm-up (the prompt, or one generated token), then the
//! cache cleared, `n_depth` tokens processed (not timed; the state is kept and restored for the
//! next test at the same depth, as llama-bench does) and the test timed on top. The parent
//! alternates the modes and models over the repetitions, so slow phases of a shared machine hit
//! all of them alike, and prints mean +- standard deviation (of the per-repetition tokens per
//! second, llama-bench's `avg_ts`/`stddev_ts`), the sparse/dense ratio and, when the run has one
//! stock (non-Spark) model such as Gemma-2, each Spark row's ratio to it (ratios of the means).
//!
//! Progress goes to stderr; stdout carries only the table (`-o md`) or the records
//! (`-o csv|json|jsonl`, llama-bench's field names plus `spark_mode`, `spark_ratio_vs_dense` and
//! `spark_ratio_vs_stock`).

use crate::error::{CliError, Result};
use crate::gguf_info;
use crate::llama_log;
use crate::sample::mean_sd;
use crate::session::{decode, CacheType, KOverrides, ModelArgs, RuntimeArgs, Session, SparkArgs};
use clap::{Args, ValueEnum};
use llama_cpp_2::context::params::{KvCacheType, LlamaContextParams};
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::{LlamaStateSeqFlags, SeqState};
use llama_cpp_sys_2 as sys;
use serde_json::{json, Value};
use spark_gguf::keys;
use std::ffi::CStr;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Which graph a measurement runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Spark kernels registered in-process (the sparse path).
    Sparse,
    /// No kernels: the dense stock-op graph (non-Spark models always run this way).
    Dense,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Sparse => "sparse",
            Mode::Dense => "dense",
        }
    }
}

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

/// llama-bench's default `-b`.
const DEFAULT_BATCH: u32 = 2048;
/// llama-bench's default `-ub`.
const DEFAULT_UBATCH: u32 = 512;

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
fn ubatch_sizes(args: &BenchArgs) -> Result<Vec<u32>> {
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

/// One llama-bench test: `n_prompt` tokens processed (pp) or `n_gen` generated (tg) on top of a
/// context already holding `n_depth` tokens, with physical batch `n_ubatch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct TestSpec {
    n_prompt: u32,
    n_gen: u32,
    n_depth: u32,
    n_ubatch: u32,
}

impl TestSpec {
    /// llama-bench's name: `pp512`, `tg128`, `pp512+tg128`, with ` @ d4096` at a depth.
    fn name(&self) -> String {
        let mut s = match (self.n_prompt, self.n_gen) {
            (p, 0) => format!("pp{p}"),
            (0, n) => format!("tg{n}"),
            (p, n) => format!("pp{p}+tg{n}"),
        };
        if self.n_depth > 0 {
            s.push_str(&format!(" @ d{}", self.n_depth));
        }
        s
    }

    /// Tokens timed.
    fn n_tokens(&self) -> u64 {
        u64::from(self.n_prompt) + u64::from(self.n_gen)
    }

    /// llama-bench's context size: n_prompt + n_gen + n_depth (checked by [`test_plan`]).
    fn n_ctx(&self) -> u32 {
        self.n_prompt + self.n_gen + self.n_depth
    }
}

/// The tests, in llama-bench's order (ubatch, then depth, then the pp tests, then the tg tests),
/// after checking the options.
fn test_plan(args: &BenchArgs) -> Result<Vec<TestSpec>> {
    if args.n_prompt.iter().all(|&p| p == 0) && args.n_gen.iter().all(|&n| n == 0) {
        return Err(CliError::new("-p 0 and -n 0: nothing to measure"));
    }
    let ubatches = ubatch_sizes(args)?;
    if let Some(&ub) = ubatches.iter().find(|&&ub| ub > args.batch) {
        return Err(CliError::new(format!(
            "-ub {ub} is larger than -b {}: n_ubatch cannot exceed n_batch",
            args.batch
        )));
    }
    let mut tests = Vec::new();
    for &n_ubatch in &ubatches {
        for &n_depth in &args.n_depth {
            let pp = args.n_prompt.iter().filter(|&&p| p > 0).map(|&p| (p, 0));
            let tg = args.n_gen.iter().filter(|&&n| n > 0).map(|&n| (0, n));
            for (n_prompt, n_gen) in pp.chain(tg) {
                let total = u64::from(n_prompt) + u64::from(n_gen) + u64::from(n_depth);
                if total > i32::MAX as u64 {
                    return Err(CliError::new(format!(
                        "-p {n_prompt} -n {n_gen} -d {n_depth}: the context ({total} tokens) is too large"
                    )));
                }
                tests.push(TestSpec {
                    n_prompt,
                    n_gen,
                    n_depth,
                    n_ubatch,
                });
            }
        }
    }
    Ok(tests)
}

/// The thread count in effect (`-t`, or all cores).
fn thread_count(args: &BenchArgs) -> i32 {
    args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, |n| i32::try_from(n.get()).unwrap_or(1))
    })
}

fn cache_name(c: CacheType) -> &'static str {
    match c {
        CacheType::F16 => "f16",
        CacheType::F32 => "f32",
    }
}

/// Runs `spark bench`.
pub fn run(args: &BenchArgs) -> Result<()> {
    let tests = test_plan(args)?;
    if let Some(mode) = args.child {
        let model = args.models.first().expect("clap requires -m");
        return child(args, model, mode, &tests);
    }
    // What to run: (model, mode, label) entries, each repeated `reps` times in alternation.
    let mut plan = Vec::new();
    for model in &args.models {
        let info = gguf_info::read(model)?;
        if info.is_spark() {
            for &mode in &args.modes {
                plan.push((model.clone(), mode, mode.name()));
            }
        } else {
            plan.push((model.clone(), Mode::Dense, STOCK));
        }
    }
    let total = plan.len() * args.reps as usize;
    let mut reports: Vec<Vec<ChildReport>> = vec![Vec::new(); plan.len()];
    let exe = std::env::current_exe()
        .map_err(|e| CliError::new(format!("cannot find the spark executable: {e}")))?;
    for rep in 0..args.reps as usize {
        for (i, (model, mode, label)) in plan.iter().enumerate() {
            if !args.quiet {
                eprintln!(
                    "spark bench: [{}/{total}] {} {label} (repetition {})",
                    rep * plan.len() + i + 1,
                    file_name(model),
                    rep + 1
                );
            }
            reports[i].push(run_child(&exe, args, model, *mode, &tests)?);
        }
    }
    let rows = build_rows(args, &plan, &tests, &reports)?;
    print!("{}", render(args.output, &rows));
    Ok(())
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into())
}

fn join<T: ToString>(v: &[T]) -> String {
    v.iter().map(T::to_string).collect::<Vec<_>>().join(",")
}

/// The child's command line: the same tests, one model, one mode.
fn child_args(args: &BenchArgs, model: &Path, mode: Mode, tests: &[TestSpec]) -> Vec<String> {
    let mut ubatches: Vec<u32> = Vec::new();
    for t in tests {
        if !ubatches.contains(&t.n_ubatch) {
            ubatches.push(t.n_ubatch);
        }
    }
    let mut a = vec![
        "bench".to_string(),
        "--child".into(),
        mode.name().into(),
        "-m".into(),
        model.display().to_string(),
        "-p".into(),
        join(&args.n_prompt),
        "-n".into(),
        join(&args.n_gen),
        "-d".into(),
        join(&args.n_depth),
        "-b".into(),
        args.batch.to_string(),
        "--ubatch-size".into(),
        join(&ubatches),
        "-t".into(),
        thread_count(args).to_string(),
        "--cache-type".into(),
        cache_name(args.cache_type).into(),
    ];
    if args.no_warmup {
        a.push("--no-warmup".into());
    }
    if let Some(k) = args.k.ffn_k {
        a.extend(["--spark-ffn-k".into(), k.to_string()]);
    }
    if let Some(k) = args.k.attn_k {
        a.extend(["--spark-attn-k".into(), k.to_string()]);
    }
    a
}

fn run_child(
    exe: &Path,
    args: &BenchArgs,
    model: &Path,
    mode: Mode,
    tests: &[TestSpec],
) -> Result<ChildReport> {
    let out = Command::new(exe)
        .args(child_args(args, model, mode, tests))
        .output()
        .map_err(|e| CliError::new(format!("cannot run {}: {e}", exe.display())))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let reason = stderr.lines().last().unwrap_or("no message");
        return Err(CliError::new(format!(
            "{} ({}): {}",
            file_name(model),
            mode.name(),
            reason.trim_start_matches("spark: error: ")
        )));
    }
    let report = parse_child_output(&stdout).filter(|r| {
        tests
            .iter()
            .all(|t| r.results.iter().any(|res| res.test == *t))
    });
    report.ok_or_else(|| {
        CliError::new(format!(
            "{} ({}): no complete result from the measuring process",
            file_name(model),
            mode.name()
        ))
    })
}

const MODEL_TAG: &str = "spark-bench-model";
const RESULT_TAG: &str = "spark-bench-result";

/// What llama.cpp says about the loaded model (llama-bench's model fields) and the backends
/// registered in the measuring process.
#[derive(Debug, Clone, PartialEq)]
struct ModelMeta {
    model_type: String,
    model_size: u64,
    model_n_params: u64,
    backends: String,
}

/// One timed run of one test.
#[derive(Debug, Clone, Copy, PartialEq)]
struct TestResult {
    test: TestSpec,
    /// Wall time of the timed part.
    ns: u64,
    /// Unix time (s) at which the test started (before its warm-up), as llama-bench's test_time.
    started: u64,
}

/// Everything one child process measured.
#[derive(Debug, Clone, PartialEq)]
struct ChildReport {
    meta: ModelMeta,
    results: Vec<TestResult>,
}

fn model_line(m: &ModelMeta) -> String {
    let v = json!({
        "model_type": m.model_type,
        "model_size": m.model_size,
        "model_n_params": m.model_n_params,
        "backends": m.backends,
    });
    format!("{MODEL_TAG} {v}")
}

fn result_line(r: &TestResult) -> String {
    let v = json!({
        "n_prompt": r.test.n_prompt,
        "n_gen": r.test.n_gen,
        "n_depth": r.test.n_depth,
        "n_ubatch": r.test.n_ubatch,
        "ns": r.ns,
        "started": r.started,
    });
    format!("{RESULT_TAG} {v}")
}

/// Reads a child's stdout: one model line and the result lines; `None` when a line is malformed
/// or the model line is missing.
fn parse_child_output(stdout: &str) -> Option<ChildReport> {
    let mut meta = None;
    let mut results = Vec::new();
    for line in stdout.lines() {
        if let Some(rest) = line.strip_prefix(MODEL_TAG) {
            let v: Value = serde_json::from_str(rest).ok()?;
            meta = Some(ModelMeta {
                model_type: v.get("model_type")?.as_str()?.to_string(),
                model_size: v.get("model_size")?.as_u64()?,
                model_n_params: v.get("model_n_params")?.as_u64()?,
                backends: v.get("backends")?.as_str()?.to_string(),
            });
        } else if let Some(rest) = line.strip_prefix(RESULT_TAG) {
            let v: Value = serde_json::from_str(rest).ok()?;
            let u32_of = |k: &str| v.get(k)?.as_u64().and_then(|x| u32::try_from(x).ok());
            results.push(TestResult {
                test: TestSpec {
                    n_prompt: u32_of("n_prompt")?,
                    n_gen: u32_of("n_gen")?,
                    n_depth: u32_of("n_depth")?,
                    n_ubatch: u32_of("n_ubatch")?,
                },
                ns: v.get("ns")?.as_u64()?,
                started: v.get("started")?.as_u64()?,
            });
        }
    }
    Some(ChildReport {
        meta: meta?,
        results,
    })
}

/// llama-bench's `model_type` without its file-type part: the architecture and the size
/// label (`general.size_label`, else the params column's count without its space, e.g.
/// "spark-gemma2 2.61B").
/// llama-bench calls `llama_model_desc`, which llama-cpp-2 does not expose; this reads the
/// same facts through its public metadata API instead of reaching into `LlamaModel`.
fn model_desc(model: &LlamaModel) -> String {
    let arch = model
        .meta_val_str(keys::GENERAL_ARCHITECTURE)
        .unwrap_or_else(|_| "unknown".into());
    let size = model
        .meta_val_str(keys::GENERAL_SIZE_LABEL)
        .unwrap_or_else(|_| params_text(model.n_params()).replace(' ', ""));
    format!("{arch} {size}")
}

/// llama-bench's `backends`: the registered ggml backends other than CPU, or "CPU"; as there,
/// the RPC entry (always registered: the build has ggml's RPC backend) counts only once it has
/// servers (devices).
fn backends() -> String {
    let mut names = Vec::new();
    // SAFETY: plain getters of ggml's backend registry; the index is below the count and the
    // name is a static NUL-terminated string owned by the registry entry.
    unsafe {
        for i in 0..sys::ggml_backend_reg_count() {
            let reg = sys::ggml_backend_reg_get(i);
            if reg.is_null() {
                continue;
            }
            let name = sys::ggml_backend_reg_name(reg);
            if name.is_null() {
                continue;
            }
            let name = CStr::from_ptr(name).to_string_lossy().into_owned();
            let unused_rpc = name.starts_with("RPC") && sys::ggml_backend_reg_dev_count(reg) == 0;
            if name != "CPU" && !unused_rpc {
                names.push(name);
            }
        }
    }
    if names.is_empty() {
        "CPU".into()
    } else {
        names.join(",")
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `secs` since the Unix epoch as llama-bench's test_time, RFC 3339 in UTC
/// (`2025-04-24T11:57:09Z`).
fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The child: loads the model once and runs every test once, printing a model line and one
/// result line per test.
fn child(args: &BenchArgs, model: &Path, mode: Mode, tests: &[TestSpec]) -> Result<()> {
    let threads = thread_count(args);
    let margs = ModelArgs {
        model: model.to_path_buf(),
        ctx: 0,
        runtime: RuntimeArgs {
            threads: Some(threads),
            batch: args.batch,
            cache_type: args.cache_type,
        },
        n_gpu_layers: 0,
        spark: SparkArgs {
            dense: mode == Mode::Dense,
            k: args.k.clone(),
            stats: false,
            backend_path: None,
            verbose: false,
        },
    };
    let session = Session::load(&margs)?;
    let meta = ModelMeta {
        model_type: model_desc(&session.model),
        model_size: session.model.size(),
        model_n_params: session.model.n_params(),
        backends: backends(),
    };
    println!("{}", model_line(&meta));
    let mut depth_state = None;
    for &test in tests {
        let started = unix_now();
        let ns = measure(&session, args, threads, test, &mut depth_state)?;
        println!("{}", result_line(&TestResult { test, ns, started }));
    }
    Ok(())
}

/// A context for one test: llama-bench's n_ctx, n_batch, n_ubatch, threads, KV types and
/// swa_full = false.
fn bench_context<'a>(
    session: &'a Session,
    args: &BenchArgs,
    threads: i32,
    test: TestSpec,
) -> Result<LlamaContext<'a>> {
    let cache = match args.cache_type {
        CacheType::F16 => KvCacheType::F16,
        CacheType::F32 => KvCacheType::F32,
    };
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(test.n_ctx().max(1)))
        .with_n_batch(args.batch)
        .with_n_ubatch(test.n_ubatch)
        .with_n_threads(threads)
        .with_n_threads_batch(threads)
        .with_type_k(cache)
        .with_type_v(cache)
        .with_swa_full(false);
    llama_log::clear_errors();
    session
        .model
        .new_context(&session.backend, params)
        .map_err(|e| {
            let cause = llama_log::last_error().unwrap_or_else(|| e.to_string());
            CliError::new(format!("cannot create a context: {cause}"))
        })
}

/// llama-bench's test_prompt: `tokens` from position `pos0` in decode calls of at most the
/// context's n_batch tokens (llama.cpp splits each into n_ubatch pieces), logits of the last
/// token of each call.
fn process_prompt(
    ctx: &mut LlamaContext<'_>,
    batch: &mut LlamaBatch,
    tokens: &[i32],
    pos0: usize,
) -> Result<()> {
    let n_batch = ctx.n_batch().max(1) as usize;
    for (b, part) in tokens.chunks(n_batch).enumerate() {
        batch.clear();
        for (j, t) in part.iter().enumerate() {
            let pos = pos0 + b * n_batch + j;
            batch
                .add(LlamaToken(*t), pos as i32, &[0], j + 1 == part.len())
                .map_err(|e| CliError::new(format!("batch: {e}")))?;
        }
        decode(ctx, batch)?;
    }
    ctx.synchronize();
    Ok(())
}

/// llama-bench's test_gen: one token per decode call from position `pos0`.
fn generate(
    ctx: &mut LlamaContext<'_>,
    batch: &mut LlamaBatch,
    tokens: &[i32],
    pos0: usize,
) -> Result<()> {
    for (i, t) in tokens.iter().enumerate() {
        batch.clear();
        batch
            .add(LlamaToken(*t), (pos0 + i) as i32, &[0], true)
            .map_err(|e| CliError::new(format!("batch: {e}")))?;
        decode(ctx, batch)?;
        ctx.synchronize();
    }
    Ok(())
}

/// One repetition of one test, as llama-bench runs it; returns the timed nanoseconds.
/// `depth_state` keeps the sequence state after the last depth fill, restored for the next test
/// at the same depth instead of processing the depth again (llama-bench's ctx_state).
fn measure(
    session: &Session,
    args: &BenchArgs,
    threads: i32,
    test: TestSpec,
    depth_state: &mut Option<(u32, SeqState)>,
) -> Result<u64> {
    let mut ctx = bench_context(session, args, threads, test)?;
    let n_batch = ctx.n_batch().max(1) as usize;
    let (d, p, n) = (
        test.n_depth as usize,
        test.n_prompt as usize,
        test.n_gen as usize,
    );
    let tokens = bench_tokens(d + p + n.max(1), session.model.n_vocab());
    let mut batch = LlamaBatch::new(n_batch, 1);

    if !args.no_warmup {
        if p > 0 {
            process_prompt(&mut ctx, &mut batch, &tokens[d..d + p], 0)?;
        }
        if n > 0 {
            generate(&mut ctx, &mut batch, &tokens[d + p..d + p + 1], p)?;
        }
    }

    ctx.clear_kv_cache();
    if d > 0 {
        let restored = match depth_state.as_ref() {
            Some((depth, state)) if *depth == test.n_depth => ctx.state_seq_set(state, 0).is_ok(),
            _ => false,
        };
        if !restored {
            ctx.clear_kv_cache();
            process_prompt(&mut ctx, &mut batch, &tokens[..d], 0)?;
            *depth_state = ctx
                .state_seq_get(0, LlamaStateSeqFlags::empty())
                .ok()
                .map(|s| (test.n_depth, s));
        }
    }

    let t0 = Instant::now();
    if p > 0 {
        process_prompt(&mut ctx, &mut batch, &tokens[d..d + p], d)?;
    }
    if n > 0 {
        generate(&mut ctx, &mut batch, &tokens[d + p..d + p + n], d + p)?;
    }
    Ok(u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX))
}

/// Deterministic pseudo-random token ids in `[0, n_vocab)` (the content does not matter for
/// speed, only that it is not one repeated token).
fn bench_tokens(n: usize, n_vocab: i32) -> Vec<i32> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((state >> 33) % n_vocab.max(1) as u64) as i32
        })
        .collect()
}

/// The mode label of a model without Spark tensors (run through its own stock graph).
const STOCK: &str = "stock";

/// One output record: one test of one (model, mode), over all repetitions.
#[derive(Debug, Clone, PartialEq)]
struct Row {
    model_filename: String,
    model_type: String,
    model_size: u64,
    model_n_params: u64,
    backends: String,
    /// "sparse", "dense", or "stock" (a non-Spark model).
    mode: &'static str,
    n_batch: u32,
    n_threads: i32,
    cache_type: &'static str,
    test: TestSpec,
    test_time: String,
    samples_ns: Vec<u64>,
    /// avg_ts of this sparse row over avg_ts of the dense row of the same model and test.
    ratio_vs_dense: Option<f64>,
    /// avg_ts of this row of a Spark model over avg_ts of the stock model's row of the same
    /// test, when the run has exactly one stock (non-Spark) model.
    ratio_vs_stock: Option<f64>,
}

impl Row {
    fn samples_ts(&self) -> Vec<f64> {
        let n = self.test.n_tokens() as f64;
        self.samples_ns
            .iter()
            .map(|&ns| 1e9 * n / ns.max(1) as f64)
            .collect()
    }

    /// (avg_ts, stddev_ts).
    fn ts(&self) -> (f64, f64) {
        mean_sd(&self.samples_ts())
    }

    /// (avg_ns, stddev_ns), rounded to whole nanoseconds as llama-bench prints them.
    fn ns(&self) -> (u64, u64) {
        let v: Vec<f64> = self.samples_ns.iter().map(|&x| x as f64).collect();
        let (m, s) = mean_sd(&v);
        (m.round() as u64, s.round() as u64)
    }

    /// llama-bench's fields that apply, in its order, then Spark's; `spark_ratio_vs_dense` and
    /// `spark_ratio_vs_stock` are null where there is no row to compare with.
    fn fields(&self) -> Vec<(&'static str, Value)> {
        let (avg_ns, stddev_ns) = self.ns();
        let (avg_ts, stddev_ts) = self.ts();
        vec![
            ("build_commit", json!("unknown")),
            ("backends", json!(self.backends)),
            ("model_filename", json!(self.model_filename)),
            ("model_type", json!(self.model_type)),
            ("model_size", json!(self.model_size)),
            ("model_n_params", json!(self.model_n_params)),
            ("n_batch", json!(self.n_batch)),
            ("n_ubatch", json!(self.test.n_ubatch)),
            ("n_threads", json!(self.n_threads)),
            ("type_k", json!(self.cache_type)),
            ("type_v", json!(self.cache_type)),
            ("n_prompt", json!(self.test.n_prompt)),
            ("n_gen", json!(self.test.n_gen)),
            ("n_depth", json!(self.test.n_depth)),
            ("test_time", json!(self.test_time)),
            ("avg_ns", json!(avg_ns)),
            ("stddev_ns", json!(stddev_ns)),
            ("avg_ts", json!(avg_ts)),
            ("stddev_ts", json!(stddev_ts)),
            ("samples_ns", json!(self.samples_ns)),
            ("samples_ts", json!(self.samples_ts())),
            ("spark_mode", json!(self.mode)),
            ("spark_ratio_vs_dense", json!(self.ratio_vs_dense)),
            ("spark_ratio_vs_stock", json!(self.ratio_vs_stock)),
        ]
    }
}

/// The records of a run, in plan order (model, mode), then test order.
fn build_rows(
    args: &BenchArgs,
    plan: &[(PathBuf, Mode, &'static str)],
    tests: &[TestSpec],
    reports: &[Vec<ChildReport>],
) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for (i, (model, _, label)) in plan.iter().enumerate() {
        let meta = &reports[i]
            .first()
            .ok_or_else(|| CliError::new("no measurement"))?
            .meta;
        for &test in tests {
            let runs: Vec<&TestResult> = reports[i]
                .iter()
                .filter_map(|r| r.results.iter().find(|x| x.test == test))
                .collect();
            rows.push(Row {
                model_filename: model.display().to_string(),
                model_type: meta.model_type.clone(),
                model_size: meta.model_size,
                model_n_params: meta.model_n_params,
                backends: meta.backends.clone(),
                mode: label,
                n_batch: args.batch,
                n_threads: thread_count(args),
                cache_type: cache_name(args.cache_type),
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
fn set_ratios(rows: &mut [Row]) {
    let one_stock_model = {
        let mut files: Vec<&str> = rows
            .iter()
            .filter(|r| r.mode == STOCK)
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
        let vs_dense = if row.mode == Mode::Sparse.name() {
            ratio_to(&|r| r.mode == Mode::Dense.name() && r.model_filename == row.model_filename)
        } else {
            None
        };
        let vs_stock = if one_stock_model && row.mode != STOCK {
            ratio_to(&|r| r.mode == STOCK)
        } else {
            None
        };
        rows[i].ratio_vs_dense = vs_dense;
        rows[i].ratio_vs_stock = vs_stock;
    }
}

/// The output of `-o format` for `rows`.
fn render(format: Output, rows: &[Row]) -> String {
    match format {
        Output::Md => render_md(rows),
        Output::Csv => render_csv(rows),
        Output::Json => render_json(rows),
        Output::Jsonl => render_jsonl(rows),
    }
}

/// An object with its fields in the given order (serde_json's own map would sort them); keys and
/// values are serialised by serde_json. Null values are left out.
fn json_object(fields: &[(&str, Value)], sep: &str, open: &str, close: &str) -> String {
    let parts: Vec<String> = fields
        .iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| format!("{}: {}", Value::from(*k), v))
        .collect();
    format!("{open}{}{close}", parts.join(sep))
}

fn render_json(rows: &[Row]) -> String {
    let objects: Vec<String> = rows
        .iter()
        .map(|r| json_object(&r.fields(), ",\n    ", "  {\n    ", "\n  }"))
        .collect();
    if objects.is_empty() {
        return "[]\n".into();
    }
    format!("[\n{}\n]\n", objects.join(",\n"))
}

fn render_jsonl(rows: &[Row]) -> String {
    rows.iter()
        .map(|r| json_object(&r.fields(), ", ", "{", "}") + "\n")
        .collect()
}

/// llama-bench's CSV: a header line, then every value in double quotes (quotes doubled); arrays
/// joined with ';', null empty.
fn render_csv(rows: &[Row]) -> String {
    let Some(first) = rows.first() else {
        return String::new();
    };
    let header: Vec<&str> = first.fields().iter().map(|(k, _)| *k).collect();
    let mut out = header.join(",") + "\n";
    for r in rows {
        let cells: Vec<String> = r
            .fields()
            .iter()
            .map(|(_, v)| csv_quote(&csv_text(v)))
            .collect();
        out.push_str(&cells.join(","));
        out.push('\n');
    }
    out
}

fn csv_text(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Array(items) => items.iter().map(csv_text).collect::<Vec<_>>().join(";"),
        other => other.to_string(),
    }
}

fn csv_quote(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// llama-bench's size column: MiB below 1 GiB.
fn size_text(bytes: u64) -> String {
    if bytes < 1 << 30 {
        format!("{:.2} MiB", bytes as f64 / (1u64 << 20) as f64)
    } else {
        format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
    }
}

/// llama-bench's params column: M below 1e9.
fn params_text(n: u64) -> String {
    if n < 1_000_000_000 {
        format!("{:.2} M", n as f64 / 1e6)
    } else {
        format!("{:.2} B", n as f64 / 1e9)
    }
}

/// A markdown column: header, llama-bench's width (negative = left-aligned), a row's value.
type Column = (&'static str, i32, fn(&Row) -> String);

fn column(name: &'static str, width: i32, value: fn(&Row) -> String) -> Column {
    (name, width, value)
}

/// llama-bench's markdown table (model, size, params, backend, threads, n_batch when not 2048,
/// n_ubatch, type_k/type_v when not f16, test, t/s) with Spark's mode column before the test and
/// the sparse/dense ratio after t/s, then the ratio to the stock model when there is one.
fn render_md(rows: &[Row]) -> String {
    let mut columns: Vec<Column> = vec![
        column("model", -30, |r| r.model_type.clone()),
        column("size", 10, |r| size_text(r.model_size)),
        column("params", 10, |r| params_text(r.model_n_params)),
        column("backend", -10, |r| r.backends.clone()),
        column("threads", 7, |r| r.n_threads.to_string()),
    ];
    if rows.iter().any(|r| r.n_batch != DEFAULT_BATCH) {
        columns.push(column("n_batch", 7, |r| r.n_batch.to_string()));
    }
    columns.push(column("n_ubatch", 8, |r| r.test.n_ubatch.to_string()));
    if rows.iter().any(|r| r.cache_type != "f16") {
        columns.push(column("type_k", 6, |r| r.cache_type.to_string()));
        columns.push(column("type_v", 6, |r| r.cache_type.to_string()));
    }
    columns.push(column("mode", -6, |r| r.mode.to_string()));
    columns.push(column("test", 15, |r| r.test.name()));
    columns.push(column("t/s", 20, |r| {
        let (m, s) = r.ts();
        format!("{m:.2} ± {s:.2}")
    }));
    columns.push(column("sparse / dense", 14, |r| {
        r.ratio_vs_dense
            .map_or(String::new(), |x| format!("{x:.2}x"))
    }));
    if rows.iter().any(|r| r.ratio_vs_stock.is_some()) {
        columns.push(column("vs stock", 8, |r| {
            r.ratio_vs_stock
                .map_or(String::new(), |x| format!("{x:.2}x"))
        }));
    }
    // Two models of the same type: tell them apart by file name.
    let ambiguous = |r: &Row| {
        rows.iter()
            .any(|o| o.model_type == r.model_type && o.model_filename != r.model_filename)
    };
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            columns
                .iter()
                .enumerate()
                .map(|(c, (_, _, value))| {
                    let v = value(r);
                    if c == 0 && ambiguous(r) {
                        format!("{v} ({})", file_name(Path::new(&r.model_filename)))
                    } else {
                        v
                    }
                })
                .collect()
        })
        .collect();
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(c, (name, w, _))| {
            cells
                .iter()
                .map(|row| row[c].chars().count())
                .chain([name.len(), w.unsigned_abs() as usize])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |values: Vec<String>| {
        let mut s = String::from("|");
        for ((v, width), (_, w, _)) in values.iter().zip(&widths).zip(&columns) {
            let pad = " ".repeat(width - v.chars().count());
            if *w < 0 {
                s.push_str(&format!(" {v}{pad} |"));
            } else {
                s.push_str(&format!(" {pad}{v} |"));
            }
        }
        s + "\n"
    };
    let mut out = line(columns.iter().map(|(n, _, _)| n.to_string()).collect());
    out += &line(
        columns
            .iter()
            .zip(&widths)
            .map(|((_, w, _), width)| {
                let dashes = "-".repeat(width - 1);
                if *w < 0 {
                    format!("{dashes}-")
                } else {
                    format!("{dashes}:")
                }
            })
            .collect(),
    );
    for row in cells {
        out += &line(row);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: BenchArgs,
    }

    fn parse(argv: &[&str]) -> std::result::Result<BenchArgs, clap::Error> {
        Cli::try_parse_from(["bench"].iter().chain(argv)).map(|c| c.args)
    }

    fn plan_of(argv: &[&str]) -> Result<Vec<TestSpec>> {
        test_plan(&parse(argv).expect("parses"))
    }

    fn names(tests: &[TestSpec]) -> Vec<String> {
        tests
            .iter()
            .map(|t| format!("{} ub{}", t.name(), t.n_ubatch))
            .collect()
    }

    #[test]
    fn child_output_round_trips_and_bad_output_is_refused() {
        let meta = ModelMeta {
            model_type: "spark-gemma2 ?B all F32".into(),
            model_size: 1234,
            model_n_params: 567,
            backends: "Spark".into(),
        };
        let r = TestResult {
            test: TestSpec {
                n_prompt: 8,
                n_gen: 0,
                n_depth: 16,
                n_ubatch: 8,
            },
            ns: 123_456,
            started: 1_700_000_000,
        };
        let out = format!("noise\n{}\n{}\n", model_line(&meta), result_line(&r));
        assert_eq!(
            parse_child_output(&out),
            Some(ChildReport {
                meta: meta.clone(),
                results: vec![r]
            })
        );
        // no model line, a malformed result, a missing field
        assert!(parse_child_output(&result_line(&r)).is_none());
        let bad = format!(
            "{}\nspark-bench-result {{\"n_prompt\": \"x\"}}",
            model_line(&meta)
        );
        assert!(parse_child_output(&bad).is_none());
        let bad = format!("{}\nspark-bench-result not json", model_line(&meta));
        assert!(parse_child_output(&bad).is_none());
        assert!(parse_child_output("nothing here").is_none());
    }

    #[test]
    fn bench_tokens_stay_in_the_vocabulary_and_vary() {
        let t = bench_tokens(1000, 17);
        assert!(t.iter().all(|&x| (0..17).contains(&x)));
        assert!(t.iter().collect::<std::collections::HashSet<_>>().len() > 10);
    }

    #[test]
    fn test_names_follow_llama_bench() {
        let t = |n_prompt, n_gen, n_depth| TestSpec {
            n_prompt,
            n_gen,
            n_depth,
            n_ubatch: 512,
        };
        assert_eq!(t(512, 0, 0).name(), "pp512");
        assert_eq!(t(0, 128, 0).name(), "tg128");
        assert_eq!(t(512, 0, 4096).name(), "pp512 @ d4096");
        assert_eq!(t(0, 128, 4096).name(), "tg128 @ d4096");
        assert_eq!(t(16, 4, 0).name(), "pp16+tg4");
        assert_eq!(t(0, 128, 4096).n_ctx(), 4224);
    }

    #[test]
    fn defaults_are_llama_bench_defaults() {
        let a = parse(&["-m", "x.gguf"]).unwrap();
        assert_eq!((a.batch, a.reps, a.output), (2048, 3, Output::Md));
        assert_eq!(
            names(&test_plan(&a).unwrap()),
            ["pp512 ub512", "tg128 ub512"]
        );
    }

    #[test]
    fn comma_lists_expand_in_llama_bench_order() {
        let tests = plan_of(&[
            "-m", "x.gguf", "-p", "8,16", "-n", "4", "-d", "0,32", "-ub", "4,8",
        ])
        .unwrap();
        assert_eq!(
            names(&tests),
            [
                "pp8 ub4",
                "pp16 ub4",
                "tg4 ub4",
                "pp8 @ d32 ub4",
                "pp16 @ d32 ub4",
                "tg4 @ d32 ub4",
                "pp8 ub8",
                "pp16 ub8",
                "tg4 ub8",
                "pp8 @ d32 ub8",
                "pp16 @ d32 ub8",
                "tg4 @ d32 ub8",
            ]
        );
        // n_ctx = n_prompt + n_gen + n_depth
        assert_eq!(tests[4].n_ctx(), 48);
        // repeated flags append, as in llama-bench; -p 0 skips pp tests
        let tests = plan_of(&["-m", "x", "-p", "0", "-n", "4", "-d", "1", "-d", "2"]).unwrap();
        assert_eq!(names(&tests), ["tg4 @ d1 ub512", "tg4 @ d2 ub512"]);
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
    fn bad_values_name_the_flag() {
        let clap_err = |argv: &[&str]| parse(argv).unwrap_err().to_string();
        let e = clap_err(&["-m", "x", "-d", "-5"]);
        assert!(e.contains("'-5'") && e.contains("--n-depth"), "{e}");
        let e = clap_err(&["-m", "x", "-d", "0,abc"]);
        assert!(e.contains("'abc'") && e.contains("--n-depth"), "{e}");
        let e = clap_err(&["-m", "x", "-p", "-1"]);
        assert!(e.contains("'-1'") && e.contains("--n-prompt"), "{e}");
        let e = clap_err(&["-m", "x", "--ubatch-size", "0"]);
        assert!(e.contains("'0'") && e.contains("--ubatch-size"), "{e}");
        let e = clap_err(&["-m", "x", "-b", "0"]);
        assert!(e.contains("'0'") && e.contains("--batch-size"), "{e}");
        let e = clap_err(&["-m", "x", "-o", "xml"]);
        assert!(e.contains("'xml'") && e.contains("--output"), "{e}");
        let e = clap_err(&["-m", "x", "-r", "0"]);
        assert!(e.contains("'0'") && e.contains("--repetitions"), "{e}");

        let plan_err = |argv: &[&str]| plan_of(argv).unwrap_err().to_string();
        assert_eq!(
            plan_err(&["-m", "x", "-ub", "0"]),
            "invalid value '0' for '-ub': expected a whole number >= 1"
        );
        assert_eq!(
            plan_err(&["-m", "x", "-ub", "-5"]),
            "invalid value '-5' for '-ub': expected a whole number >= 1"
        );
        assert_eq!(
            plan_err(&["-m", "x", "-ub", "8,x"]),
            "invalid value 'x' for '-ub': expected a whole number >= 1"
        );
        assert!(plan_err(&["-m", "x", "-ub", "4096"]).contains("-ub 4096 is larger than -b 2048"));
        assert!(plan_err(&["-m", "x", "-u", "8"]).contains("unknown option '-u8'"));
        assert!(plan_err(&["-m", "x", "stray"]).contains("unexpected argument 'stray'"));
        assert!(plan_err(&["-m", "x", "-p", "0", "-n", "0"]).contains("nothing to measure"));
        assert!(
            plan_err(&["-m", "x", "-p", "4294967295", "-d", "4294967295"]).contains("too large")
        );
    }

    #[test]
    fn rfc3339_matches_llama_bench_test_time() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_745_495_829), "2025-04-24T11:57:09Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    }

    /// A sparse and a dense row of one test, and a stock row.
    fn fixed_rows() -> Vec<Row> {
        let base = Row {
            model_filename: "models/a \"b\".gguf".into(),
            model_type: "spark-gemma2 2B F16".into(),
            model_size: 5 << 30,
            model_n_params: 2_600_000_000,
            backends: "Spark".into(),
            mode: "sparse",
            n_batch: 2048,
            n_threads: 2,
            cache_type: "f16",
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
            mode: "dense",
            samples_ns: vec![4_000_000_000, 4_000_000_000],
            ..base.clone()
        };
        let stock = Row {
            model_filename: "g.gguf".into(),
            model_type: "gemma2 2B Q8_0".into(),
            model_size: 3 << 20,
            model_n_params: 5_400_000,
            backends: "CPU".into(),
            mode: "stock",
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

    /// The golden sets: [`fixed_rows`]; the same with a stock row of the sparse rows' test
    /// (ratios to stock), a second Spark model of the same type (file names in the model column),
    /// several samples, `-b 256` and an f32 cache; no rows at all.
    fn golden_sets() -> Vec<(&'static str, Vec<Row>)> {
        let mut variant = fixed_rows();
        variant[2].test = variant[0].test;
        variant[2].samples_ns = vec![64_000_000_000, 63_000_000_001, 65_500_000_123];
        let mut other = variant[0].clone();
        other.model_filename = "other/\u{df} model,1.gguf".into();
        other.samples_ns = vec![3_333_333_333, 7, 1_000_000_000_000];
        variant.push(other);
        for r in &mut variant {
            r.n_batch = 256;
            r.cache_type = "f32";
        }
        set_ratios(&mut variant);
        vec![
            ("fixed", fixed_rows()),
            ("variant", variant),
            ("empty", Vec::new()),
        ]
    }

    /// Every renderer's exact bytes on fixed samples (spark-cli/testdata/bench/SET.FORMAT,
    /// written by the renderers before the bench module was split by job).
    #[test]
    fn renderers_match_golden_outputs() {
        for (set, rows) in golden_sets() {
            for (format, ext) in [
                (Output::Md, "md"),
                (Output::Csv, "csv"),
                (Output::Json, "json"),
                (Output::Jsonl, "jsonl"),
            ] {
                let path = format!("{}/testdata/bench/{set}.{ext}", env!("CARGO_MANIFEST_DIR"));
                let want = std::fs::read_to_string(&path).expect("golden file");
                assert_eq!(render(format, &rows), want, "{path}");
            }
        }
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

    #[test]
    fn ratios_compare_spark_rows_with_the_one_stock_model_of_the_same_test() {
        let mut rows = fixed_rows();
        // the stock row measured the sparse rows' test: 2 t/s (128 tokens in 64 s)
        rows[2].test = rows[0].test;
        rows[2].samples_ns = vec![64_000_000_000];
        set_ratios(&mut rows);
        assert!((rows[0].ratio_vs_stock.unwrap() - 48.0).abs() < 1e-9);
        assert!((rows[1].ratio_vs_stock.unwrap() - 16.0).abs() < 1e-9);
        assert_eq!(rows[2].ratio_vs_stock, None);
        assert!((rows[0].ratio_vs_dense.unwrap() - 3.0).abs() < 1e-9);
        let v: Value = serde_json::from_str(&render(Output::Json, &rows)).unwrap();
        assert_eq!(v[0]["spark_ratio_vs_stock"], 48.0);
        assert!(v[2].get("spark_ratio_vs_stock").is_none());
        let md = render(Output::Md, &rows);
        let header = md.lines().next().unwrap();
        assert!(header.trim_end().ends_with("| vs stock |"), "{md}");
        let last_cell = |l: &str| {
            l.trim_matches('|')
                .rsplit('|')
                .next()
                .unwrap()
                .trim()
                .to_string()
        };
        assert_eq!(last_cell(md.lines().nth(2).unwrap()), "48.00x", "{md}");
        assert_eq!(last_cell(md.lines().nth(4).unwrap()), "", "{md}");

        // a second stock model: which one a ratio would refer to is ambiguous, so none is given
        let mut other = rows[2].clone();
        other.model_filename = "h.gguf".into();
        rows.push(other);
        set_ratios(&mut rows);
        assert!(rows.iter().all(|r| r.ratio_vs_stock.is_none()));
        assert!(!render(Output::Md, &rows).contains("vs stock"));
        // the same stock model's rows of other tests do not count as a second model
        let mut rows = fixed_rows();
        let mut again = rows[2].clone();
        again.test = rows[0].test;
        again.samples_ns = vec![64_000_000_000];
        rows.insert(3, again);
        set_ratios(&mut rows);
        assert!((rows[0].ratio_vs_stock.unwrap() - 48.0).abs() < 1e-9);
    }

    #[test]
    fn json_has_llama_bench_fields() {
        let rows = fixed_rows();
        let v: Value = serde_json::from_str(&render(Output::Json, &rows)).unwrap();
        let a = v.as_array().unwrap();
        assert_eq!(a.len(), 3);
        let s = &a[0];
        assert_eq!(s["build_commit"], "unknown");
        assert_eq!(s["model_filename"], "models/a \"b\".gguf");
        assert_eq!(s["model_type"], "spark-gemma2 2B F16");
        assert_eq!(s["model_size"], 5u64 << 30);
        assert_eq!(s["model_n_params"], 2_600_000_000u64);
        assert_eq!(s["backends"], "Spark");
        assert_eq!(s["n_batch"], 2048);
        assert_eq!(s["n_ubatch"], 512);
        assert_eq!(s["n_threads"], 2);
        assert_eq!(s["type_k"], "f16");
        assert_eq!(s["type_v"], "f16");
        assert_eq!(s["n_prompt"], 0);
        assert_eq!(s["n_gen"], 128);
        assert_eq!(s["n_depth"], 4096);
        assert_eq!(s["test_time"], "2025-04-24T11:57:09Z");
        assert_eq!(s["avg_ns"], 1_500_000_000u64);
        assert_eq!(s["stddev_ns"], 707_106_781u64);
        assert_eq!(s["avg_ts"], 96.0);
        assert!((s["stddev_ts"].as_f64().unwrap() - 45.254_833_995).abs() < 1e-6);
        assert_eq!(s["samples_ns"], json!([1_000_000_000u64, 2_000_000_000u64]));
        assert_eq!(s["samples_ts"], json!([128.0, 64.0]));
        assert_eq!(s["spark_mode"], "sparse");
        assert_eq!(s["spark_ratio_vs_dense"], 3.0);
        assert_eq!(a[1]["spark_mode"], "dense");
        assert!(a[1].get("spark_ratio_vs_dense").is_none());
        assert_eq!(a[2]["spark_mode"], "stock");
        assert_eq!(a[2]["avg_ts"], 1024.0);
        // fields keep llama-bench's order
        let text = render(Output::Json, &rows);
        let pos = |k: &str| text.find(&format!("\"{k}\"")).unwrap();
        assert!(pos("build_commit") < pos("model_filename") && pos("n_depth") < pos("avg_ns"));
    }

    #[test]
    fn jsonl_is_one_object_per_line() {
        let rows = fixed_rows();
        let text = render(Output::Jsonl, &rows);
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0]["spark_ratio_vs_dense"], 3.0);
        assert_eq!(lines[2]["n_prompt"], 512);
        assert_eq!(render(Output::Json, &[]), "[]\n");
        assert_eq!(render(Output::Jsonl, &[]), "");
    }

    #[test]
    fn csv_has_a_header_and_quoted_records() {
        let text = render(Output::Csv, &fixed_rows());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4);
        let header: Vec<&str> = lines[0].split(',').collect();
        assert_eq!(header[0], "build_commit");
        for k in [
            "model_filename",
            "n_ubatch",
            "n_depth",
            "avg_ts",
            "samples_ns",
            "spark_mode",
            "spark_ratio_vs_dense",
        ] {
            assert!(header.contains(&k), "{k}");
        }
        let col = |k: &str| header.iter().position(|h| *h == k).unwrap();
        // the quote in the file name is doubled, so the naive split still lines up here only
        // because the name has no comma
        let cells: Vec<&str> = lines[1].split(',').collect();
        assert_eq!(cells.len(), header.len());
        assert_eq!(cells[col("model_filename")], "\"models/a \"\"b\"\".gguf\"");
        assert_eq!(cells[col("n_depth")], "\"4096\"");
        assert_eq!(cells[col("samples_ns")], "\"1000000000;2000000000\"");
        assert_eq!(cells[col("spark_mode")], "\"sparse\"");
        assert_eq!(cells[col("spark_ratio_vs_dense")], "\"3.0\"");
        let dense: Vec<&str> = lines[2].split(',').collect();
        assert_eq!(dense[col("spark_ratio_vs_dense")], "\"\"");
    }

    #[test]
    fn md_table_has_llama_bench_columns() {
        let text = render(Output::Md, &fixed_rows());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5);
        let cells = |l: &str| -> Vec<String> {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect()
        };
        assert_eq!(
            cells(lines[0]),
            [
                "model",
                "size",
                "params",
                "backend",
                "threads",
                "n_ubatch",
                "mode",
                "test",
                "t/s",
                "sparse / dense"
            ]
        );
        assert!(lines[1].starts_with("| ---") && lines[1].contains("-: |"));
        assert_eq!(
            cells(lines[2]),
            [
                "spark-gemma2 2B F16",
                "5.00 GiB",
                "2.60 B",
                "Spark",
                "2",
                "512",
                "sparse",
                "tg128 @ d4096",
                "96.00 ± 45.25",
                "3.00x"
            ]
        );
        assert_eq!(cells(lines[3])[9], "");
        assert_eq!(cells(lines[4])[1..3], ["3.00 MiB", "5.40 M"]);
        assert_eq!(cells(lines[4])[7], "pp512");
        // all lines equally wide (aligned columns)
        let w = lines[0].chars().count();
        assert!(lines.iter().all(|l| l.chars().count() == w), "{text}");
    }

    #[test]
    fn md_table_shows_non_default_batch_and_cache_type() {
        let rows: Vec<Row> = fixed_rows()
            .into_iter()
            .map(|r| Row {
                n_batch: 256,
                cache_type: "f32",
                ..r
            })
            .collect();
        let text = render(Output::Md, &rows);
        let header = text.lines().next().unwrap();
        assert!(header.contains("| n_batch |") && header.contains("| type_k | type_v |"));
    }
}
