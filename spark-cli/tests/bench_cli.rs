//! `spark bench` end to end on tiny synthetic models: llama-bench's tests (`-d`, `-ub`) and
//! output formats on stdout (parsed back), progress on stderr, bad input as one error line.

use serde_json::Value;
use spark_convert::convert::SparkOverrides;
use spark_convert::model::OutType;
use spark_convert::synthetic::{generate, SyntheticOptions};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("spark-bench-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A synthetic preset written once per test process.
fn model(preset: &str, cell: &'static OnceLock<PathBuf>) -> &'static Path {
    cell.get_or_init(|| {
        let output = dir().join(format!("{preset}.gguf"));
        generate(&SyntheticOptions {
            preset: preset.into(),
            output: output.clone(),
            seed: 7,
            outtype: OutType::F16,
            overrides: SparkOverrides::default(),
            qkv: spark_gguf::schema::QkvLayout::Split,
            ffn_rows: spark_gguf::schema::FfnRowLayout::Separate,
            name: None,
            manifest: None,
            force: true,
            quiet: true,
        })
        .expect("write the synthetic model");
        output
    })
}

fn tiny() -> &'static Path {
    static CELL: OnceLock<PathBuf> = OnceLock::new();
    model("tiny", &CELL)
}

fn tiny_dense() -> &'static Path {
    static CELL: OnceLock<PathBuf> = OnceLock::new();
    model("tiny-dense", &CELL)
}

fn spark(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_spark"))
        .args(args)
        .output()
        .expect("run spark")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn ok(args: &[&str]) -> (String, String) {
    let out = spark(args);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{args:?}\n{stderr}");
    (stdout, stderr)
}

#[test]
fn json_at_depths_with_a_ubatch_size() {
    let m = tiny().to_str().unwrap();
    let (stdout, stderr) = ok(&[
        "bench", "-m", m, "-p", "8", "-n", "4", "-d", "0,16", "-ub", "8", "-r", "1", "-t", "1",
        "-o", "json",
    ]);
    // stdout is exactly one JSON document; the progress went to stderr
    let v: Value = serde_json::from_str(&stdout).expect("stdout is JSON");
    assert_eq!(stderr.matches("spark bench: [").count(), 2, "{stderr}");
    let rows = v.as_array().unwrap();
    assert_eq!(rows.len(), 8, "{stdout}");
    let mut seen = Vec::new();
    for r in rows {
        let mode = r["spark_mode"].as_str().unwrap();
        let (p, n, d) = (
            r["n_prompt"].as_u64().unwrap(),
            r["n_gen"].as_u64().unwrap(),
            r["n_depth"].as_u64().unwrap(),
        );
        seen.push((mode.to_string(), p, n, d));
        assert_eq!(r["model_filename"], m);
        assert_eq!(r["build_commit"], "unknown");
        assert!(r["model_type"]
            .as_str()
            .unwrap()
            .starts_with("spark-gemma2"));
        assert!(r["model_size"].as_u64().unwrap() > 0);
        assert!(r["model_n_params"].as_u64().unwrap() > 0);
        assert_eq!(r["n_ubatch"], 8);
        assert_eq!(r["n_batch"], 2048);
        assert_eq!(r["n_threads"], 1);
        assert_eq!(r["type_k"], "f16");
        assert_eq!(r["type_v"], "f16");
        assert!(r["test_time"].as_str().unwrap().ends_with('Z'));
        assert!(r["avg_ts"].as_f64().unwrap() > 0.0);
        assert!(r["avg_ns"].as_u64().unwrap() > 0);
        assert_eq!(r["samples_ns"].as_array().unwrap().len(), 1);
        assert_eq!(r["samples_ts"].as_array().unwrap().len(), 1);
        // tokens/s is (n_prompt + n_gen) / time
        let ts = (p + n) as f64 * 1e9 / r["samples_ns"][0].as_f64().unwrap();
        assert!((ts - r["avg_ts"].as_f64().unwrap()).abs() < 1e-6 * ts);
        // the backends in the measuring process: the kernels only in sparse mode
        let backend = if mode == "sparse" { "Spark" } else { "CPU" };
        assert_eq!(r["backends"], backend);
        // the ratio is on sparse rows only
        assert_eq!(
            r.get("spark_ratio_vs_dense").is_some(),
            mode == "sparse",
            "{r}"
        );
    }
    let mut expected = Vec::new();
    for mode in ["sparse", "dense"] {
        for d in [0, 16] {
            expected.push((mode.to_string(), 8, 0, d));
            expected.push((mode.to_string(), 0, 4, d));
        }
    }
    assert_eq!(seen, expected);
}

#[test]
fn markdown_names_tests_like_llama_bench() {
    let m = tiny().to_str().unwrap();
    let (stdout, _) = ok(&[
        "bench", "-m", m, "-p", "8", "-n", "2", "-d", "0,8", "-r", "1", "-t", "1", "--modes",
        "sparse", "-q",
    ]);
    let lines: Vec<&str> = stdout.lines().collect();
    let cells = |l: &str| -> Vec<String> {
        l.trim_matches('|')
            .split('|')
            .map(|c| c.trim().to_string())
            .collect()
    };
    let header = cells(lines[0]);
    assert_eq!(
        header,
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
    let tests: Vec<String> = lines[2..].iter().map(|l| cells(l)[7].clone()).collect();
    assert_eq!(tests, ["pp8", "tg2", "pp8 @ d8", "tg2 @ d8"]);
    assert!(lines[2..].iter().all(|l| cells(l)[5] == "512"));
}

#[test]
fn jsonl_and_csv_of_a_stock_model() {
    let m = tiny_dense().to_str().unwrap();
    let (stdout, stderr) = ok(&[
        "bench", "-m", m, "-p", "8", "-n", "2", "-r", "2", "-t", "1", "-o", "jsonl", "-q",
    ]);
    assert_eq!(stderr, "");
    let rows: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(rows.len(), 2);
    for r in &rows {
        assert_eq!(r["spark_mode"], "stock");
        assert_eq!(r["backends"], "CPU");
        assert!(r["model_type"].as_str().unwrap().starts_with("gemma2"));
        assert_eq!(r["samples_ns"].as_array().unwrap().len(), 2);
        assert!(r.get("spark_ratio_vs_dense").is_none());
    }

    let (stdout, _) = ok(&[
        "bench", "-m", m, "-p", "8", "-n", "0", "-ub", "4,8", "-r", "1", "-t", "1", "-o", "csv",
        "-q",
    ]);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    let header: Vec<&str> = lines[0].split(',').collect();
    assert_eq!(header[0], "build_commit");
    let col = |k: &str| header.iter().position(|h| *h == k).unwrap();
    let ub: Vec<&str> = lines[1..]
        .iter()
        .map(|l| l.split(',').nth(col("n_ubatch")).unwrap())
        .collect();
    assert_eq!(ub, ["\"4\"", "\"8\""]);
}

#[test]
fn spark_rows_carry_their_ratio_to_the_stock_model() {
    let (spark_m, stock_m) = (tiny().to_str().unwrap(), tiny_dense().to_str().unwrap());
    let (stdout, _) = ok(&[
        "bench", "-m", spark_m, "-m", stock_m, "-p", "8", "-n", "0", "-r", "1", "-t", "1", "-o",
        "json", "-q",
    ]);
    let rows: Vec<Value> = serde_json::from_str(&stdout).unwrap();
    let row = |mode: &str| rows.iter().find(|r| r["spark_mode"] == mode).unwrap();
    let (sparse, dense, stock) = (row("sparse"), row("dense"), row("stock"));
    let ts = |r: &Value| r["avg_ts"].as_f64().unwrap();
    for r in [sparse, dense] {
        let got = r["spark_ratio_vs_stock"].as_f64().unwrap();
        assert!((got - ts(r) / ts(stock)).abs() < 1e-9 * got, "{r}");
    }
    assert!(stock.get("spark_ratio_vs_stock").is_none());

    // the table gets a "vs stock" column, filled on the Spark model's rows
    let (stdout, _) = ok(&[
        "bench", "-m", spark_m, "-m", stock_m, "--modes", "sparse", "-p", "8", "-n", "0", "-r",
        "1", "-t", "1", "-q",
    ]);
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].trim_end().ends_with("| vs stock |"), "{stdout}");
    let last = |l: &str| {
        l.trim_matches('|')
            .rsplit('|')
            .next()
            .unwrap()
            .trim()
            .to_string()
    };
    assert!(last(lines[2]).ends_with('x'), "{stdout}");
    assert_eq!(last(lines[3]), "", "{stdout}");
}

fn assert_fails(args: &[&str], needles: &[&str]) {
    let out = spark(args);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{args:?} succeeded");
    assert!(out.stdout.is_empty(), "{args:?}: {}", text(&out.stdout));
    for n in needles {
        assert!(stderr.contains(n), "{args:?}: no {n:?} in {stderr}");
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn bad_input_names_the_flag_and_value() {
    let m = "/nonexistent/model.gguf";
    assert_fails(&["bench", "-m", m, "-d", "-5"], &["'-5'", "--n-depth"]);
    assert_fails(&["bench", "-m", m, "-d", "0,x"], &["'x'", "--n-depth"]);
    assert_fails(&["bench", "-m", m, "-o", "xml"], &["'xml'", "--output"]);
    assert_fails(
        &["bench", "-m", m, "--ubatch-size", "0"],
        &["'0'", "--ubatch-size"],
    );
    assert_fails(
        &["bench", "-m", m, "-ub", "0"],
        &["spark: error: invalid value '0' for '-ub'"],
    );
    assert_fails(
        &["bench", "-m", m, "-ub", "1024", "-b", "512"],
        &["spark: error: -ub 1024 is larger than -b 512"],
    );
    assert_fails(
        &["bench", "-m", m, "-p", "8", "-n", "1"],
        &["spark: error: model file not found: /nonexistent/model.gguf"],
    );
}
