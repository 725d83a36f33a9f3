//! Malformed files: each must give a precise error, never a panic or a huge allocation.

mod gguf_helpers;

use gguf_helpers::*;
use spark_gguf::validate::validate;
use spark_gguf::{GgmlType, GgufError, GgufFile, TensorPlan, Value};

fn err(img: &Img) -> String {
    GgufFile::from_bytes(img.0.clone()).unwrap_err().to_string()
}

/// A valid two-tensor file written by our writer (written once, then copied).
fn small_file() -> Vec<u8> {
    static FILE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    FILE.get_or_init(write_small_file).clone()
}

fn write_small_file() -> Vec<u8> {
    let dir = tmpdir();
    let path = in_dir(&dir, "s.gguf");
    let meta = vec![
        (
            "general.architecture".to_string(),
            Value::String("x".into()),
        ),
        (
            "a.arr".to_string(),
            Value::Array(spark_gguf::Array::String(vec!["ab".into(), "c".into()])),
        ),
        ("a.f".to_string(), Value::F32(1.0)),
    ];
    let plans = vec![
        TensorPlan {
            name: "w".into(),
            ty: GgmlType::F32,
            ne: vec![3, 2],
        },
        TensorPlan {
            name: "v".into(),
            ty: GgmlType::F16,
            ne: vec![5],
        },
    ];
    let data = vec![vec![1u8; 24], vec![2u8; 10]];
    write_file(&path, &meta, &plans, &data, 32);
    std::fs::read(&path).unwrap()
}

#[test]
fn every_truncation_is_an_error_without_panic() {
    let full = small_file();
    let f = GgufFile::from_bytes(full.clone()).unwrap();
    let last = f.tensors().last().unwrap();
    let data_end = (f.data_offset() + last.offset + last.n_bytes) as usize;
    assert!(data_end < full.len(), "the test needs trailing padding");
    for len in 0..full.len() {
        let r = GgufFile::from_bytes(full[..len].to_vec());
        if len < data_end {
            let e = r.unwrap_err().to_string();
            assert!(
                e.starts_with("malformed GGUF at byte offset "),
                "{len}: {e}"
            );
        } else {
            // The data is whole; only the last tensor's padding is missing: readable, but
            // `validate` reports it (ggml reads the padded size when it loads into memory).
            let f = r.unwrap();
            let v = validate(&f);
            assert!(
                v.iter()
                    .any(|v| v.what == "v" && v.message.contains("before the alignment padding")),
                "{len}: {v:?}"
            );
        }
    }
    let e = GgufFile::from_bytes(full[..10].to_vec())
        .unwrap_err()
        .to_string();
    assert_eq!(e, "malformed GGUF at byte offset 8: file ends while reading the tensor count: 8 bytes needed, 2 left");
}

#[test]
fn header_errors() {
    assert_eq!(
        err(&Img(b"GGML\x03\0\0\0".to_vec())),
        "malformed GGUF at byte offset 0: bad magic [47, 47, 4d, 4c] (expected \"GGUF\"): not a GGUF file"
    );
    assert_eq!(
        err(&Img::header(1, 0, 0)),
        "unsupported GGUF version 1: GGUF v1 is no longer supported (llama.cpp refuses it too); reconvert the model"
    );
    assert!(err(&Img::header(3 << 24, 0, 0)).contains("big-endian"));
    assert_eq!(
        err(&Img::header(4, 0, 0)),
        "unsupported GGUF version 4: only versions 2 and 3 are supported"
    );
    // Version 2 has the same layout and is accepted.
    let f = GgufFile::from_bytes(Img::header(2, 0, 0).0).unwrap();
    assert_eq!(
        (f.version(), f.metadata().len(), f.tensors().len()),
        (2, 0, 0)
    );
}

#[test]
fn huge_counts_and_lengths_are_refused_before_allocating() {
    assert_eq!(
        err(&Img::header(3, 0, u64::MAX)),
        "malformed GGUF at byte offset 16: the metadata key-value count is 18446744073709551615, more than the remaining 0 bytes can hold"
    );
    assert_eq!(
        err(&Img::header(3, 1 << 60, 0)),
        "malformed GGUF at byte offset 8: the tensor count is 1152921504606846976, more than the remaining 0 bytes can hold"
    );
    let mut i = Img::header(3, 0, 1);
    i.u64(u64::MAX - 3).raw(b"key........");
    assert_eq!(
        err(&i),
        "malformed GGUF at byte offset 24: metadata key #0 has length 18446744073709551612 but only 11 bytes remain in the file"
    );
    let mut i = Img::header(3, 0, 1);
    i.str("big").u32(9).u32(4).u64(1 << 62).zeros(64);
    assert_eq!(
        err(&i),
        "malformed GGUF at byte offset 43: the element count of array key 'big' is 4611686018427387904, more than the remaining 64 bytes can hold"
    );
    let mut i = Img::header(3, 0, 1);
    i.str("strs")
        .u32(9)
        .u32(8)
        .u64(3)
        .u64(1)
        .raw(b"a")
        .u64(u64::MAX)
        .zeros(8);
    let e = err(&i);
    assert!(
        e.contains(
            "element 1 of array key 'strs' has length 18446744073709551615 but only 8 bytes remain"
        ),
        "{e}"
    );
    let mut i = Img::header(3, 0, 1);
    i.str("s").u32(8).u64(1000).raw(b"short");
    assert_eq!(
        err(&i),
        "malformed GGUF at byte offset 37: the value of key 's' has length 1000 but only 5 bytes remain in the file"
    );
}

#[test]
fn bad_utf8_names_the_offset() {
    let mut i = Img::header(3, 0, 1);
    i.u64(3).raw(b"a\xffb").u32(4).u32(1);
    assert_eq!(
        err(&i),
        "malformed GGUF at byte offset 33: metadata key #0 is not valid UTF-8"
    );
    let mut i = Img::header(3, 0, 1);
    i.str("k").u32(8).u64(2).raw(b"\xc3\x28");
    assert_eq!(
        err(&i),
        "malformed GGUF at byte offset 45: the value of key 'k' is not valid UTF-8"
    );
    let mut i = Img::header(3, 1, 0);
    i.u64(2).raw(b"\x80x").u32(1).u64(1).u32(0).u64(0);
    assert_eq!(
        err(&i),
        "malformed GGUF at byte offset 32: the name of tensor #0 is not valid UTF-8"
    );
}

#[test]
fn value_type_errors() {
    let mut i = Img::header(3, 0, 1);
    i.str("k").u32(13).u32(0);
    assert_eq!(
        err(&i),
        "malformed GGUF at byte offset 33: key 'k' has unknown value type id 13"
    );
    let mut i = Img::header(3, 0, 1);
    i.str("n").u32(9).u32(9).u32(4).u64(1);
    assert_eq!(
        err(&i),
        "malformed GGUF at byte offset 37: key 'n' is a nested array, which is not supported"
    );
    let mut i = Img::header(3, 0, 1);
    i.str("b").u32(7).raw(&[2]);
    assert_eq!(
        err(&i),
        "malformed GGUF at byte offset 37: key 'b' has bool byte 2, expected 0 or 1"
    );
    let mut i = Img::header(3, 0, 2);
    i.kv_u32("d", 1).kv_u32("d", 2);
    assert_eq!(
        err(&i),
        "malformed GGUF at byte offset 41: duplicate metadata key 'd'"
    );
    let mut i = Img::header(3, 0, 1);
    i.str("").u32(4).u32(1);
    assert_eq!(
        err(&i),
        "malformed GGUF at byte offset 24: metadata key #0 is empty"
    );
}

#[test]
fn alignment_errors() {
    let mut i = Img::header(3, 0, 1);
    i.kv_u32("general.alignment", 48);
    assert_eq!(
        err(&i),
        "metadata key 'general.alignment': alignment 48 is not a power of two"
    );
    let mut i = Img::header(3, 0, 1);
    i.kv_u32("general.alignment", 0);
    assert_eq!(
        err(&i),
        "metadata key 'general.alignment': alignment 0 is not a power of two"
    );
    let mut i = Img::header(3, 0, 1);
    i.str("general.alignment").u32(10).u64(64);
    assert_eq!(
        err(&i),
        "metadata key 'general.alignment': must have type u32 but has type u64"
    );
    // A valid non-default alignment is used for the data section.
    let mut i = Img::header(3, 1, 1);
    i.kv_u32("general.alignment", 64)
        .tensor("t", &[2], 0, 0)
        .pad(64)
        .zeros(8);
    let f = GgufFile::from_bytes(i.0).unwrap();
    assert_eq!((f.alignment(), f.data_offset() % 64), (64, 0));
}

#[test]
fn tensor_info_errors() {
    let one = |name: &str, ne: &[u64], ty: u32, off: u64| {
        let mut i = Img::header(3, 1, 0);
        i.tensor(name, ne, ty, off).pad(32).zeros(256);
        i
    };
    assert_eq!(
        err(&one("t", &[1, 1, 1, 1, 1], 0, 0)),
        "malformed GGUF at byte offset 33: tensor 't' has 5 dimensions, at most 4 are allowed"
    );
    assert_eq!(
        err(&one("t", &[4], 4, 0)),
        "malformed GGUF at byte offset 45: tensor 't' has unknown ggml type id 4"
    );
    assert_eq!(
        err(&one("t", &[4], 99, 0)),
        "malformed GGUF at byte offset 45: tensor 't' has unknown ggml type id 99"
    );
    assert_eq!(
        err(&one("t", &[33], 8, 0)),
        "malformed GGUF at byte offset 45: tensor 't': row length 33 is not a multiple of the q8_0 block size 32"
    );
    assert_eq!(
        err(&one("t", &[1 << 63], 0, 0)),
        "malformed GGUF at byte offset 37: tensor 't' dimension 0 is 9223372036854775808, larger than i64::MAX"
    );
    assert_eq!(
        err(&one("t", &[1 << 40, 1 << 40], 0, 0)),
        "malformed GGUF at byte offset 33: tensor 't' shape [1099511627776, 1099511627776] has more than i64::MAX elements"
    );
    assert_eq!(
        err(&one("t", &[4], 0, 16)),
        "malformed GGUF at byte offset 49: tensor 't' data offset 16 is not a multiple of the alignment 32"
    );
    assert_eq!(
        err(&one("t", &[100], 0, 0)),
        "malformed GGUF at byte offset 64: tensor 't' data (400 bytes at data offset 0) extends beyond the end of the 320-byte file"
    );
    assert_eq!(
        err(&one("t", &[4], 0, u64::MAX - 31)),
        "malformed GGUF at byte offset 18446744073709551615: tensor 't' data (16 bytes at data offset 18446744073709551584) extends beyond the end of the 320-byte file"
    );
    let mut i = Img::header(3, 2, 0);
    i.tensor("d", &[1], 0, 0)
        .tensor("d", &[1], 0, 32)
        .pad(32)
        .zeros(64);
    assert_eq!(
        err(&i),
        "malformed GGUF at byte offset 57: duplicate tensor name 'd'"
    );
}

#[test]
fn overlapping_and_misordered_offsets() {
    let mut i = Img::header(3, 2, 0);
    i.tensor("a", &[16], 0, 0)
        .tensor("b", &[16], 0, 32)
        .pad(32)
        .zeros(128);
    assert_eq!(
        err(&i),
        "malformed GGUF at byte offset 128: tensor 'b' data (data offset 32) overlaps tensor 'a' (data offsets 0..64)"
    );
    // Disjoint but not the running sum in info order: readable, but llama.cpp refuses it.
    let mut i = Img::header(3, 2, 1);
    i.str("general.architecture").u32(8).str("x");
    i.tensor("a", &[8], 0, 32)
        .tensor("b", &[8], 0, 0)
        .pad(32)
        .zeros(64);
    let f = GgufFile::from_bytes(i.0).unwrap();
    let v: Vec<String> = validate(&f).iter().map(|v| v.to_string()).collect();
    assert_eq!(
        v,
        [
            "a: data offset is 32, expected 0 (offsets must be the running sum of padded sizes in tensor-info order)",
            "b: data offset is 0, expected 64 (offsets must be the running sum of padded sizes in tensor-info order)",
        ]
    );
    // A gap is also a violation.
    let mut i = Img::header(3, 1, 1);
    i.str("general.architecture").u32(8).str("x");
    i.tensor("a", &[8], 0, 64).pad(32).zeros(128);
    let f = GgufFile::from_bytes(i.0).unwrap();
    assert_eq!(validate(&f).len(), 1);
}

#[test]
fn long_tensor_names_are_readable_but_invalid() {
    let name = "x".repeat(64);
    let mut i = Img::header(3, 1, 1);
    i.str("general.architecture").u32(8).str("x");
    i.tensor(&name, &[8], 0, 0).pad(32).zeros(32);
    let f = GgufFile::from_bytes(i.0).unwrap();
    let v = validate(&f);
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0].what, name);
    assert_eq!(
        v[0].message,
        "name is 64 bytes, llama.cpp allows at most 63"
    );
}

#[test]
fn open_reports_missing_files_and_empty_files() {
    let dir = tmpdir();
    let missing = in_dir(&dir, "nope.gguf");
    let e = GgufFile::open(&missing).unwrap_err();
    assert!(matches!(e, GgufError::Io { op: "open", .. }), "{e}");
    let empty = in_dir(&dir, "empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    assert_eq!(
        GgufFile::open(&empty).unwrap_err().to_string(),
        "malformed GGUF at byte offset 0: file ends while reading the magic: 4 bytes needed, 0 left"
    );
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 2000, .. proptest::prelude::ProptestConfig::default() })]
    /// Random byte corruptions of a valid file: the reader and the validator either succeed or
    /// return an error; they never panic, and every tensor slice they hand out lies in the file.
    #[test]
    fn corrupted_files_never_panic(
        edits in proptest::collection::vec((0usize..4096, proptest::prelude::any::<u8>()), 1..8),
        cut in proptest::option::of(0usize..4096),
    ) {
        let mut bytes = small_file();
        for (pos, val) in edits {
            let n = bytes.len();
            bytes[pos % n] = val;
        }
        if let Some(c) = cut {
            let n = bytes.len();
            bytes.truncate(c % (n + 1));
        }
        let len = bytes.len() as u64;
        if let Ok(f) = GgufFile::from_bytes(bytes) {
            let _ = validate(&f);
            for t in f.tensors() {
                proptest::prop_assert!(f.data_offset() + t.offset + t.n_bytes <= len);
                proptest::prop_assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes);
            }
        }
    }
}
