//! `spark bench`: prompt-processing and generation speed, llama-bench style (`pp512`, `tg128`),
//! with the Spark kernels and with the dense stock-op graph **side by side in one run**.
//!
//! The kernels are registered per process (a registered "Spark" entry cannot be removed), so each
//! measurement runs in a child process (`spark bench --child MODE ...`) that loads the model,
//! warms it up, times one `pp` and one `tg` test and prints one result line. The parent
//! alternates the modes and models over the repetitions, so slow phases of a shared machine hit
//! all of them alike, and prints mean +- standard deviation and the sparse/dense ratio.

use crate::error::{CliError, Result};
use crate::gguf_info;
use crate::sample::mean_sd;
use crate::session::{decode, CacheType, KOverrides, ModelArgs, RuntimeArgs, Session, SparkArgs};
use clap::{Args, ValueEnum};
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::token::LlamaToken;
use spark_gguf::schema::SPARK_ARCH;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// Which graph a measurement runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Spark kernels registered in-process (the sparse path; for non-Spark models, the stock
    /// graph).
    Sparse,
    /// No kernels: the dense stock-op graph.
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

/// Arguments of `spark bench`.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// GGUF model file (repeat to compare models).
    #[arg(short = 'm', long = "model", value_name = "MODEL", required = true)]
    pub models: Vec<PathBuf>,
    /// Prompt tokens of the pp test (0 = skip).
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_name = "N",
        default_value_t = 512
    )]
    pub n_prompt: u32,
    /// Generated tokens of the tg test (0 = skip).
    #[arg(short = 'n', long = "n-gen", value_name = "N", default_value_t = 128)]
    pub n_gen: u32,
    /// Repetitions of every measurement.
    #[arg(
        short = 'r',
        long = "repetitions",
        value_name = "N",
        default_value_t = 3,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub reps: u32,
    /// Threads, batch size of the pp test, KV cache type.
    #[command(flatten)]
    pub runtime: RuntimeArgs,
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
    /// Internal: run one measurement in this process and print its result line.
    #[arg(long, value_enum, hide = true)]
    pub child: Option<Mode>,
}

/// Tokens per second of one child run (`None` for a skipped test).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Speeds {
    pp: Option<f64>,
    tg: Option<f64>,
}

const RESULT_TAG: &str = "spark-bench-result";

/// Runs `spark bench`.
pub fn run(args: &BenchArgs) -> Result<()> {
    if args.n_prompt == 0 && args.n_gen == 0 {
        return Err(CliError::new("-p 0 and -n 0: nothing to measure"));
    }
    if let Some(mode) = args.child {
        let model = args.models.first().expect("clap requires -m");
        let s = measure(args, model, mode)?;
        let show = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.6}"));
        println!("{RESULT_TAG} pp={} tg={}", show(s.pp), show(s.tg));
        return Ok(());
    }
    // What to run: (model, mode) pairs, each repeated `reps` times in alternation.
    let mut plan = Vec::new();
    for model in &args.models {
        let info = gguf_info::read(model)?;
        if info.is_spark() {
            for &mode in &args.modes {
                plan.push((model.clone(), mode, info.arch.clone()));
            }
        } else {
            plan.push((model.clone(), Mode::Sparse, info.arch.clone()));
        }
    }
    let total = plan.len() * args.reps as usize;
    let mut results: Vec<Vec<Speeds>> = vec![Vec::new(); plan.len()];
    let exe = std::env::current_exe()
        .map_err(|e| CliError::new(format!("cannot find the spark executable: {e}")))?;
    for rep in 0..args.reps as usize {
        for (i, (model, mode, _)) in plan.iter().enumerate() {
            if !args.quiet {
                eprintln!(
                    "spark bench: [{}/{total}] {} {} (repetition {})",
                    rep * plan.len() + i + 1,
                    file_name(model),
                    mode.name(),
                    rep + 1
                );
            }
            results[i].push(run_child(&exe, args, model, *mode)?);
        }
    }
    print_table(args, &plan, &results);
    Ok(())
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into())
}

/// The child's command line: the same options, one model, one mode.
fn child_args(args: &BenchArgs, model: &Path, mode: Mode) -> Vec<String> {
    let mut a = vec![
        "bench".to_string(),
        "--child".into(),
        mode.name().into(),
        "-m".into(),
        model.display().to_string(),
        "-p".into(),
        args.n_prompt.to_string(),
        "-n".into(),
        args.n_gen.to_string(),
        "-b".into(),
        args.runtime.batch.to_string(),
        "--cache-type".into(),
        match args.runtime.cache_type {
            CacheType::F16 => "f16",
            CacheType::F32 => "f32",
        }
        .into(),
    ];
    if let Some(t) = args.runtime.threads {
        a.extend(["-t".into(), t.to_string()]);
    }
    if let Some(k) = args.k.ffn_k {
        a.extend(["--spark-ffn-k".into(), k.to_string()]);
    }
    if let Some(k) = args.k.attn_k {
        a.extend(["--spark-attn-k".into(), k.to_string()]);
    }
    a
}

fn run_child(exe: &Path, args: &BenchArgs, model: &Path, mode: Mode) -> Result<Speeds> {
    let out = Command::new(exe)
        .args(child_args(args, model, mode))
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
    parse_result(&stdout).ok_or_else(|| {
        CliError::new(format!(
            "{} ({}): no result line from the measuring process",
            file_name(model),
            mode.name()
        ))
    })
}

fn parse_result(stdout: &str) -> Option<Speeds> {
    let line = stdout.lines().find(|l| l.starts_with(RESULT_TAG))?;
    let mut pp = None;
    let mut tg = None;
    for field in line.split_whitespace().skip(1) {
        let (key, value) = field.split_once('=')?;
        let value = if value == "-" {
            None
        } else {
            Some(value.parse::<f64>().ok()?)
        };
        match key {
            "pp" => pp = value,
            "tg" => tg = value,
            _ => return None,
        }
    }
    Some(Speeds { pp, tg })
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

/// One measurement in this process: a warm-up decode, then `pp` (the prompt in batches) and
/// `tg` (one token per decode), each from an empty KV cache.
fn measure(args: &BenchArgs, model: &Path, mode: Mode) -> Result<Speeds> {
    let margs = ModelArgs {
        model: model.to_path_buf(),
        // pp and tg each start from an empty cache: the context holds the longer of the two.
        ctx: 0,
        runtime: args.runtime.clone(),
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
    let n_vocab = session.model.n_vocab();
    let mut ctx = session.context(args.n_prompt.max(args.n_gen).max(1))?;
    let n_batch = ctx.n_batch().max(1) as usize;
    let tokens = bench_tokens(args.n_prompt.max(args.n_gen) as usize, n_vocab);
    let mut batch = LlamaBatch::new(n_batch, 1);

    // Warm-up: touch every weight once (page cache, ggml thread start).
    let warm = &tokens[..tokens.len().min(n_batch).min(16)];
    batch.clear();
    for (pos, t) in warm.iter().enumerate() {
        batch
            .add(LlamaToken(*t), pos as i32, &[0], pos + 1 == warm.len())
            .map_err(|e| CliError::new(format!("batch: {e}")))?;
    }
    decode(&mut ctx, &mut batch)?;

    let mut speeds = Speeds { pp: None, tg: None };
    if args.n_prompt > 0 {
        ctx.clear_kv_cache();
        let prompt = &tokens[..args.n_prompt as usize];
        let t0 = Instant::now();
        for (b, part) in prompt.chunks(n_batch).enumerate() {
            batch.clear();
            for (j, t) in part.iter().enumerate() {
                let pos = b * n_batch + j;
                batch
                    .add(LlamaToken(*t), pos as i32, &[0], j + 1 == part.len())
                    .map_err(|e| CliError::new(format!("batch: {e}")))?;
            }
            decode(&mut ctx, &mut batch)?;
        }
        speeds.pp = Some(prompt.len() as f64 / t0.elapsed().as_secs_f64());
    }
    if args.n_gen > 0 {
        ctx.clear_kv_cache();
        let t0 = Instant::now();
        for (pos, t) in tokens[..args.n_gen as usize].iter().enumerate() {
            batch.clear();
            batch
                .add(LlamaToken(*t), pos as i32, &[0], true)
                .map_err(|e| CliError::new(format!("batch: {e}")))?;
            decode(&mut ctx, &mut batch)?;
        }
        speeds.tg = Some(f64::from(args.n_gen) / t0.elapsed().as_secs_f64());
    }
    Ok(speeds)
}

/// Picks one test's speed out of a result.
type SpeedOf = fn(&Speeds) -> Option<f64>;

fn print_table(args: &BenchArgs, plan: &[(PathBuf, Mode, String)], results: &[Vec<Speeds>]) {
    println!("| model | size | arch | mode | test | t/s | sparse / dense |");
    println!("|---|---|---|---|---|---|---|");
    let tests: [(&str, u32, SpeedOf); 2] = [
        ("pp", args.n_prompt, |s| s.pp),
        ("tg", args.n_gen, |s| s.tg),
    ];
    for (i, (model, mode, arch)) in plan.iter().enumerate() {
        let size = std::fs::metadata(model).map_or(0, |m| m.len()) as f64 / (1u64 << 30) as f64;
        for (test, n, get) in tests {
            let values: Vec<f64> = results[i].iter().filter_map(get).collect();
            if n == 0 || values.is_empty() {
                continue;
            }
            let (mean, sd) = mean_sd(&values);
            // The ratio against the dense run of the same model, on sparse rows.
            let dense = plan
                .iter()
                .position(|(m, md, _)| m == model && *md == Mode::Dense)
                .filter(|_| *mode == Mode::Sparse)
                .map(|j| mean_sd(&results[j].iter().filter_map(get).collect::<Vec<_>>()).0);
            let ratio = dense.map_or(String::new(), |d| format!("{:.2}x", mean / d));
            let mode_name = if arch == SPARK_ARCH {
                mode.name()
            } else {
                "stock"
            };
            println!(
                "| {} | {size:.2} GiB | {arch} | {mode_name} | {test}{n} | {mean:.2} +/- {sd:.2} | {ratio} |",
                file_name(model)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_lines_round_trip_and_bad_ones_are_refused() {
        let s = parse_result("noise\nspark-bench-result pp=12.5 tg=-\n").unwrap();
        assert_eq!(
            s,
            Speeds {
                pp: Some(12.5),
                tg: None
            }
        );
        assert!(parse_result("spark-bench-result pp=abc tg=1").is_none());
        assert!(parse_result("spark-bench-result xx=1").is_none());
        assert!(parse_result("nothing here").is_none());
    }

    #[test]
    fn bench_tokens_stay_in_the_vocabulary_and_vary() {
        let t = bench_tokens(1000, 17);
        assert!(t.iter().all(|&x| (0..17).contains(&x)));
        assert!(t.iter().collect::<std::collections::HashSet<_>>().len() > 10);
    }
}
