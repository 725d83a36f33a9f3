//! User errors end in one `spark: error:` line and a non-zero exit, never a panic.

use std::process::Command;

fn spark(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_spark"))
        .args(args)
        .output()
        .expect("run spark");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_one_error_line(code: i32, stderr: &str, needle: &str) {
    assert_ne!(code, 0, "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].starts_with("spark: error: "), "{stderr}");
    assert!(lines[0].contains(needle), "{stderr}");
}

#[test]
fn missing_model_file() {
    let dir = std::env::temp_dir().join(format!("spark-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("x.npy");
    let (code, err) = spark(&[
        "eval",
        "-m",
        "/nonexistent/model.gguf",
        "--tokens",
        "1,2",
        "--logits-out",
        out.to_str().unwrap(),
    ]);
    assert_one_error_line(code, &err, "model file not found: /nonexistent/model.gguf");
    assert!(!out.exists());
}

#[test]
fn not_a_gguf_file() {
    let dir = std::env::temp_dir().join(format!("spark-cli-test-nogguf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bogus = dir.join("bogus.gguf");
    std::fs::write(&bogus, b"definitely not a gguf file").unwrap();
    let (code, err) = spark(&["run", "-m", bogus.to_str().unwrap(), "-p", "hi", "-n", "1"]);
    assert_one_error_line(code, &err, "not a readable GGUF file");
}

#[test]
fn unknown_quantization_type() {
    let (code, err) = spark(&[
        "quantize",
        "/nonexistent/in.gguf",
        "/nonexistent/out.gguf",
        "Q9_9",
    ]);
    assert_one_error_line(code, &err, "unknown quantization type \"Q9_9\"");
}
