//! The measuring process and its protocol.
//!
//! The kernels are registered per process (a registered "Spark" entry cannot be removed), so the
//! parent runs each (model, mode) entry as a child, `spark bench --child MODE ...`, with the same
//! tests. The child prints one model line and one result line per test on stdout, each a tag
//! and a JSON object (serde), and nothing else the parent reads: other output (llama.cpp's, if
//! any) is ignored. A child that fails exits non-zero with its `spark: error:` line last.

use super::args::{BenchArgs, Mode};
use super::measure::{backends, model_desc, Measurer};
use super::plan::TestSpec;
use super::text::file_name;
use super::time::unix_now;
use crate::error::{CliError, Result};
use crate::session::{thread_count, ModelArgs, RuntimeArgs, Session, SparkArgs};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::process::Command;

const MODEL_TAG: &str = "spark-bench-model";
const RESULT_TAG: &str = "spark-bench-result";

/// What llama.cpp says about the loaded model (llama-bench's model fields) and the backends
/// registered in the measuring process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelMeta {
    /// llama-bench's model_type (see [`model_desc`]).
    pub model_type: String,
    /// Bytes of the model's tensors.
    pub model_size: u64,
    /// Parameters.
    pub model_n_params: u64,
    /// llama-bench's backends (see [`backends`]).
    pub backends: String,
}

/// One timed run of one test.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TestResult {
    /// The test.
    pub test: TestSpec,
    /// Wall time of the timed part.
    pub ns: u64,
    /// Unix time (s) at which the test started (before its warm-up), as llama-bench's test_time.
    pub started: u64,
}

/// Everything one child process measured.
#[derive(Debug, Clone, PartialEq)]
pub struct ChildReport {
    /// The model line.
    pub meta: ModelMeta,
    /// The result lines, in the order printed.
    pub results: Vec<TestResult>,
}

/// A protocol line: `tag` and `value` as one-line JSON.
fn line<T: Serialize>(tag: &str, value: &T) -> Result<String> {
    let json = serde_json::to_string(value)
        .map_err(|e| CliError::new(format!("cannot write a {tag} line: {e}")))?;
    Ok(format!("{tag} {json}"))
}

fn model_line(m: &ModelMeta) -> Result<String> {
    line(MODEL_TAG, m)
}

fn result_line(r: &TestResult) -> Result<String> {
    line(RESULT_TAG, r)
}

/// Reads a child's stdout: one model line and the result lines; `None` when a line is malformed
/// or the model line is missing.
fn parse_child_output(stdout: &str) -> Option<ChildReport> {
    let mut meta = None;
    let mut results = Vec::new();
    for line in stdout.lines() {
        if let Some(rest) = line.strip_prefix(MODEL_TAG) {
            meta = Some(serde_json::from_str(rest).ok()?);
        } else if let Some(rest) = line.strip_prefix(RESULT_TAG) {
            results.push(serde_json::from_str(rest).ok()?);
        }
    }
    Some(ChildReport {
        meta: meta?,
        results,
    })
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
        thread_count(args.threads).to_string(),
        "--cache-type".into(),
        args.cache_type.name().into(),
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

/// Runs the child `exe` for `model` in `mode` and reads its report; a failed child's last
/// error line, or a report missing a test, is an error naming the model and mode.
pub fn run_child(
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

/// The child: loads the model once and runs every test once, printing a model line and one
/// result line per test.
pub fn child(args: &BenchArgs, model: &Path, mode: Mode, tests: &[TestSpec]) -> Result<()> {
    let margs = ModelArgs {
        model: model.to_path_buf(),
        ctx: 0,
        runtime: RuntimeArgs {
            threads: Some(thread_count(args.threads)),
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
    println!("{}", model_line(&meta)?);
    let mut measurer = Measurer::new(&session, !args.no_warmup);
    for &test in tests {
        let started = unix_now();
        let ns = measurer.run(test)?;
        println!("{}", result_line(&TestResult { test, ns, started })?);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let (model_line, result_line) = (
            |m: &ModelMeta| model_line(m).unwrap(),
            |r: &TestResult| result_line(r).unwrap(),
        );
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
    fn result_lines_refuse_values_out_of_range() {
        let meta = ModelMeta {
            model_type: "t".into(),
            model_size: 1,
            model_n_params: 1,
            backends: "CPU".into(),
        };
        let head = model_line(&meta).unwrap();
        let test = r#"{"n_prompt":1,"n_gen":0,"n_depth":0,"n_ubatch":1}"#;
        let ok = format!("{head}\n{RESULT_TAG} {{\"test\":{test},\"ns\":5,\"started\":0}}");
        assert_eq!(parse_child_output(&ok).unwrap().results[0].ns, 5);
        for bad in [
            test.replace("\"n_prompt\":1", "\"n_prompt\":4294967296"),
            test.replace("\"n_gen\":0", "\"n_gen\":-1"),
            test.replace(",\"n_ubatch\":1", ""),
        ] {
            let out = format!("{head}\n{RESULT_TAG} {{\"test\":{bad},\"ns\":5,\"started\":0}}");
            assert!(parse_child_output(&out).is_none(), "{bad}");
        }
        // the child's arguments name the same tests
        let args = super::super::args::tests::parse(&["-m", "x", "-ub", "8,4"]).unwrap();
        let tests = super::super::plan::test_plan(&args).unwrap();
        let argv = child_args(&args, Path::new("m.gguf"), Mode::Dense, &tests);
        let pos = |flag: &str| argv.iter().position(|a| a == flag).unwrap();
        assert_eq!(argv[pos("--child") + 1], "dense");
        assert_eq!(argv[pos("--ubatch-size") + 1], "8,4");
        assert_eq!(argv[pos("--cache-type") + 1], "f16");
    }
}
