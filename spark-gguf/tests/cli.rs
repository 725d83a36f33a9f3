//! The `spark-gguf` binary: inspect and validate.

mod gguf_helpers;

use gguf_helpers::*;
use spark_gguf::schema::SPARK_ARCH;
use spark_gguf::GgmlType;

#[test]
fn inspect_prints_keys_tensors_and_totals() {
    let dir = tmpdir();
    let path = write_tiny_model(&dir, SPARK_ARCH, GgmlType::Q8_0);
    let (code, out, err) = run(&["inspect".as_ref(), path.as_os_str()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("version: 3\nalignment: 32\n"), "{out}");
    assert!(
        out.contains("  general.architecture [str] = \"spark-gemma2\"\n"),
        "{out}"
    );
    assert!(
        out.contains("  spark-gemma2.spark.ffn_k [u32] = 8\n"),
        "{out}"
    );
    assert!(
        out.contains("  spark-gemma2.attention.layer_norm_rms_epsilon [f32] = 1e-6\n"),
        "{out}"
    );
    assert!(
        out.contains("  tokenizer.ggml.tokens [arr[str]] = [\"<pad>\", \"<eos>\", \"<bos>\", \"<unk>\", \"<0x00>\", \"<0x01>\", \"<0x02>\", \"<0x03>\", ...] (263 elements)\n"),
        "{out}"
    );
    assert!(
        out.contains("  blk.1.ffn_gate.weight q8_0 [32, 96] 3264 bytes\n"),
        "{out}"
    );
    assert!(
        out.contains("  output_norm.weight f32 [96] 384 bytes\n"),
        "{out}"
    );
    assert!(out.contains("tensors (24):\n"), "{out}");
    assert!(
        out.lines()
            .last()
            .unwrap()
            .starts_with("total: 24 tensors, "),
        "{out}"
    );
}

#[test]
fn validate_reports_and_exits() {
    let dir = tmpdir();
    let path = write_tiny_model(&dir, SPARK_ARCH, GgmlType::F16);
    let (code, out, _) = run(&["validate".as_ref(), path.as_os_str()]);
    assert_eq!(code, 0);
    assert_eq!(
        out,
        format!("{}: valid (24 tensors, 29 keys)\n", path.display())
    );

    // A truncated copy is a structural error: one line on stderr, no report.
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.truncate(bytes.len() / 2);
    let bad = in_dir(&dir, "bad.gguf");
    std::fs::write(&bad, &bytes).unwrap();
    let (code, out, err) = run(&["validate".as_ref(), bad.as_os_str()]);
    assert_ne!(code, 0);
    assert!(out.is_empty() || !out.contains("valid ("), "{out}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with(&format!(
            "spark-gguf: {}: malformed GGUF at byte offset",
            bad.display()
        )),
        "{err}"
    );

    // A structurally sound file that breaks the schema: each violation on its own line.
    let meta = tiny_metadata(SPARK_ARCH);
    let mut plans = tiny_plans(&meta, GgmlType::F32);
    plans.pop();
    let data: Vec<Vec<u8>> = plans
        .iter()
        .map(|p| vec![0u8; p.ty.tensor_bytes(&p.ne).unwrap() as usize])
        .collect();
    let incomplete = in_dir(&dir, "incomplete.gguf");
    write_file(&incomplete, &meta, &plans, &data, 32);
    let (code, out, err) = run(&["validate".as_ref(), incomplete.as_os_str()]);
    assert_eq!(code, 1);
    assert_eq!(
        out,
        format!(
            "{}: blk.1.post_ffw_norm.weight: is missing (expected shape [96])\n",
            incomplete.display()
        )
    );
    assert_eq!(
        err,
        format!("spark-gguf: {}: 1 violation(s)\n", incomplete.display())
    );

    let (code, _, err) = run(&[
        "validate".as_ref(),
        in_dir(&dir, "missing.gguf").as_os_str(),
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("cannot open"), "{err}");
}
