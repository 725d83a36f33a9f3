//! Writer -> reader round trips, streaming, padding and writer refusals.

mod gguf_helpers;

use gguf_helpers::*;
use proptest::prelude::*;
use spark_gguf::{
    keys, Array, GgmlType, GgufError, GgufFile, GgufWriter, TensorPlan, Value, ValueType,
};

fn every_value() -> Vec<(String, Value)> {
    vec![
        ("t.u8".into(), Value::U8(200)),
        ("t.i8".into(), Value::I8(-100)),
        ("t.u16".into(), Value::U16(60000)),
        ("t.i16".into(), Value::I16(-30000)),
        ("t.u32".into(), Value::U32(4_000_000_000)),
        ("t.i32".into(), Value::I32(-2_000_000_000)),
        ("t.f32".into(), Value::F32(-1.5e-7)),
        ("t.bool".into(), Value::Bool(true)),
        ("t.bool0".into(), Value::Bool(false)),
        ("t.str".into(), Value::String("héllo \u{2581}wörld".into())),
        ("t.empty_str".into(), Value::String(String::new())),
        ("t.u64".into(), Value::U64(u64::MAX - 1)),
        ("t.i64".into(), Value::I64(i64::MIN + 1)),
        ("t.f64".into(), Value::F64(std::f64::consts::PI)),
        ("a.u8".into(), Value::Array(Array::U8(vec![0, 1, 255]))),
        ("a.i8".into(), Value::Array(Array::I8(vec![-128, 127]))),
        ("a.u16".into(), Value::Array(Array::U16(vec![1, 65535]))),
        ("a.i16".into(), Value::Array(Array::I16(vec![-1, 2]))),
        ("a.u32".into(), Value::Array(Array::U32(vec![7, 8, 9]))),
        ("a.i32".into(), Value::Array(Array::I32(vec![-7]))),
        (
            "a.f32".into(),
            Value::Array(Array::F32(vec![0.5, -0.0, 1e30])),
        ),
        (
            "a.bool".into(),
            Value::Array(Array::Bool(vec![true, false, true])),
        ),
        (
            "a.str".into(),
            Value::Array(Array::String(vec!["a".into(), String::new(), "ünï".into()])),
        ),
        ("a.u64".into(), Value::Array(Array::U64(vec![u64::MAX]))),
        ("a.i64".into(), Value::Array(Array::I64(vec![i64::MIN, 0]))),
        ("a.f64".into(), Value::Array(Array::F64(vec![1e-300, -2.0]))),
        ("a.empty".into(), Value::Array(Array::U32(vec![]))),
    ]
}

fn odd_plans() -> Vec<TensorPlan> {
    let p = |name: &str, ty, ne: &[u64]| TensorPlan {
        name: name.into(),
        ty,
        ne: ne.to_vec(),
    };
    vec![
        p("odd.f32", GgmlType::F32, &[3, 5]),
        p("odd.f16", GgmlType::F16, &[7]),
        p("q8", GgmlType::Q8_0, &[64, 3]),
        p("bf16.4d", GgmlType::BF16, &[1, 3, 1, 5]),
        p("empty", GgmlType::F32, &[0, 4]),
        p("i8.last", GgmlType::I8, &[13]),
    ]
}

fn random_data(plans: &[TensorPlan], seed: u64) -> Vec<Vec<u8>> {
    let mut rng = Rng(seed);
    plans
        .iter()
        .map(|p| rng.bytes(p.ty.tensor_bytes(&p.ne).unwrap() as usize))
        .collect()
}

#[test]
fn every_value_type_and_tensor_round_trips() {
    for alignment in [32u64, 1, 8, 64, 4096] {
        let dir = tmpdir();
        let path = in_dir(&dir, "rt.gguf");
        let meta = every_value();
        let plans = odd_plans();
        let data = random_data(&plans, alignment);
        write_file(&path, &meta, &plans, &data, alignment);
        let f = GgufFile::open(&path).unwrap();
        assert_eq!(f.version(), 3);
        assert_eq!(f.alignment(), alignment);
        let mut expected = meta.clone();
        if alignment != 32 {
            expected.push((keys::GENERAL_ALIGNMENT.into(), Value::U32(alignment as u32)));
        }
        assert_eq!(f.metadata(), &expected[..]);
        assert_eq!(f.get("t.u32").unwrap().value_type(), ValueType::U32);
        assert_eq!(f.get("t.u32").unwrap().as_u32(), Some(4_000_000_000));
        assert_eq!(
            f.get("t.u64").unwrap().as_u32(),
            None,
            "a u64 must not read as u32"
        );
        assert_eq!(f.tensors().len(), plans.len());
        let mut running = 0;
        for ((t, p), d) in f.tensors().iter().zip(&plans).zip(&data) {
            assert_eq!((&t.name, t.ty, &t.ne), (&p.name, p.ty, &p.ne));
            assert_eq!(t.offset, running, "{}", t.name);
            assert_eq!(t.offset % alignment, 0);
            assert_eq!((f.data_offset() + t.offset) % alignment, 0);
            assert_eq!(f.tensor_data(t), &d[..], "{}", t.name);
            running += t.n_bytes.next_multiple_of(alignment);
        }
        // The last tensor is padded too: the file ends exactly at the padded end.
        assert_eq!(f.file_size(), f.data_offset() + running);
        let whats: Vec<String> = spark_gguf::validate::validate(&f)
            .into_iter()
            .map(|v| v.what)
            .collect();
        assert_eq!(
            whats,
            [
                keys::GENERAL_QUANTIZATION_VERSION,
                keys::GENERAL_ARCHITECTURE
            ]
        );
    }
}

#[test]
fn streaming_chunks_equal_whole_writes() {
    let dir = tmpdir();
    let plans = odd_plans();
    let data = random_data(&plans, 99);
    let whole = in_dir(&dir, "whole.gguf");
    write_file(&whole, &every_value(), &plans, &data, 32);
    for chunk in [1usize, 3, 7, 64, 1000] {
        let path = in_dir(&dir, &format!("chunk{chunk}.gguf"));
        let mut w = GgufWriter::create(&path, false, &every_value(), &plans, 32).unwrap();
        for d in &data {
            if d.is_empty() {
                w.write_tensor_chunk(&[]).unwrap();
            }
            for c in d.chunks(chunk) {
                w.write_tensor_chunk(c).unwrap();
            }
        }
        assert_eq!(w.current_tensor(), None);
        let n = w.bytes_written();
        w.finish().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len() as u64, n);
        assert_eq!(bytes, std::fs::read(&whole).unwrap(), "chunk size {chunk}");
    }
}

fn dir_entries(dir: &tempfile::TempDir) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn writer_refuses_misuse_and_leaves_nothing_behind() {
    let dir = tmpdir();
    let path = in_dir(&dir, "out.gguf");
    let plans = odd_plans();
    let data = random_data(&plans, 1);

    let mut w = GgufWriter::create(&path, false, &[], &plans, 32).unwrap();
    let e = w.write_tensor(&data[0][1..]).unwrap_err().to_string();
    assert_eq!(
        e,
        "tensor 'odd.f32': got 59 bytes, the plan needs exactly 60"
    );
    w.write_tensor_chunk(&data[0][..10]).unwrap();
    let e = w.write_tensor_chunk(&data[0]).unwrap_err().to_string();
    assert_eq!(
        e,
        "tensor 'odd.f32': chunk of 60 bytes runs past the tensor's end (50 of 60 bytes left)"
    );
    let e = w.write_tensor(&data[0]).unwrap_err().to_string();
    assert_eq!(
        e,
        "tensor 'odd.f32': write_tensor after 10 bytes were streamed in chunks"
    );
    w.write_tensor_chunk(&data[0][10..]).unwrap();
    assert_eq!(w.current_tensor(), Some("odd.f16"));
    let e = w.finish().unwrap_err().to_string();
    assert_eq!(
        e,
        "tensor 'odd.f16': not written in full (0 of 14 bytes); 1 of 6 tensors are complete"
    );
    assert!(dir_entries(&dir).is_empty(), "{:?}", dir_entries(&dir));

    // Dropping without finish removes the temporary file.
    let w = GgufWriter::create(&path, false, &[], &plans, 32).unwrap();
    assert_eq!(dir_entries(&dir).len(), 1);
    drop(w);
    assert!(dir_entries(&dir).is_empty());

    // Too many tensors.
    let mut w = GgufWriter::create(&path, false, &[], &plans[..1], 32).unwrap();
    w.write_tensor(&data[0]).unwrap();
    let e = w.write_tensor(&data[1]).unwrap_err().to_string();
    assert_eq!(e, "GGUF writer: all 1 planned tensors are already written");
    w.finish().unwrap();
    assert_eq!(dir_entries(&dir), vec!["out.gguf".to_string()]);

    // An existing file is refused unless overwrite.
    let e = GgufWriter::create(&path, false, &[], &[], 32).unwrap_err();
    assert!(matches!(e, GgufError::Exists(_)), "{e}");
    assert!(
        e.to_string()
            .ends_with("out.gguf: output file exists (pass overwrite to replace it)"),
        "{e}"
    );
    let w = GgufWriter::create(&path, true, &[("k".into(), Value::U8(1))], &[], 32).unwrap();
    w.finish().unwrap();
    assert_eq!(GgufFile::open(&path).unwrap().metadata().len(), 1);
    assert_eq!(dir_entries(&dir), vec!["out.gguf".to_string()]);
}

#[test]
fn writer_rejects_bad_plans() {
    let dir = tmpdir();
    let path = in_dir(&dir, "bad.gguf");
    let plan = |name: &str, ty, ne: &[u64]| TensorPlan {
        name: name.into(),
        ty,
        ne: ne.to_vec(),
    };
    let err = |meta: &[(String, Value)], plans: &[TensorPlan], a: u64| {
        GgufWriter::create(&path, false, meta, plans, a)
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        err(&[], &[plan("x", GgmlType::Q8_0, &[33])], 32),
        "tensor 'x': row length 33 is not a multiple of the q8_0 block size 32"
    );
    assert_eq!(
        err(
            &[],
            &[
                plan("x", GgmlType::F32, &[1]),
                plan("x", GgmlType::F32, &[1])
            ],
            32
        ),
        "tensor 'x': appears twice in the tensor plan"
    );
    let long = "n".repeat(64);
    assert_eq!(
        err(&[], &[plan(&long, GgmlType::F32, &[1])], 32),
        format!("tensor '{long}': name is 64 bytes, at most 63 are allowed")
    );
    assert_eq!(
        err(&[], &[plan("x", GgmlType::F32, &[1; 5])], 32),
        "tensor 'x': has 5 dimensions, 1 to 4 are allowed"
    );
    assert_eq!(
        err(&[], &[], 48),
        "GGUF writer: alignment 48 is not a power of two that fits in u32"
    );
    let dup = [
        ("k".to_string(), Value::U8(1)),
        ("k".to_string(), Value::U8(2)),
    ];
    assert_eq!(
        err(&dup, &[], 32),
        "metadata key 'k': appears twice in the metadata"
    );
    let al = [(keys::GENERAL_ALIGNMENT.to_string(), Value::U64(64))];
    assert_eq!(
        err(&al, &[], 64),
        "metadata key 'general.alignment': is 64 (u64) but the writer aligns to 64"
    );
    assert!(dir_entries_empty(&dir));
}

fn dir_entries_empty(dir: &tempfile::TempDir) -> bool {
    std::fs::read_dir(dir.path()).unwrap().next().is_none()
}

fn arb_value() -> impl Strategy<Value = Value> {
    let scalar = prop_oneof![
        any::<u8>().prop_map(Value::U8),
        any::<i8>().prop_map(Value::I8),
        any::<u16>().prop_map(Value::U16),
        any::<i16>().prop_map(Value::I16),
        any::<u32>().prop_map(Value::U32),
        any::<i32>().prop_map(Value::I32),
        any::<u64>().prop_map(Value::U64),
        any::<i64>().prop_map(Value::I64),
        any::<bool>().prop_map(Value::Bool),
        (-1e30f32..1e30).prop_map(Value::F32),
        (-1e300f64..1e300).prop_map(Value::F64),
        ".{0,12}".prop_map(Value::String),
    ];
    let array = prop_oneof![
        proptest::collection::vec(any::<u32>(), 0..20).prop_map(|v| Value::Array(Array::U32(v))),
        proptest::collection::vec(any::<i32>(), 0..20).prop_map(|v| Value::Array(Array::I32(v))),
        proptest::collection::vec(-1e3f32..1e3, 0..20).prop_map(|v| Value::Array(Array::F32(v))),
        proptest::collection::vec(any::<bool>(), 0..20).prop_map(|v| Value::Array(Array::Bool(v))),
        proptest::collection::vec(".{0,6}", 0..20).prop_map(|v| Value::Array(Array::String(v))),
        proptest::collection::vec(any::<u8>(), 0..20).prop_map(|v| Value::Array(Array::U8(v))),
        proptest::collection::vec(any::<i64>(), 0..5).prop_map(|v| Value::Array(Array::I64(v))),
    ];
    prop_oneof![3 => scalar, 1 => array]
}

fn arb_plan() -> impl Strategy<Value = (GgmlType, Vec<u64>)> {
    let ty = prop_oneof![
        Just(GgmlType::F32),
        Just(GgmlType::F16),
        Just(GgmlType::BF16),
        Just(GgmlType::Q8_0),
        Just(GgmlType::Q4_K),
        Just(GgmlType::I8)
    ];
    (ty, proptest::collection::vec(1u64..5, 0..4), 1u64..4).prop_map(|(ty, rest, blocks)| {
        let mut ne =
            vec![blocks * ty.block_size() + if ty.block_size() == 1 { blocks % 3 } else { 0 }];
        ne.extend(rest);
        (ty, ne)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]
    #[test]
    fn arbitrary_files_round_trip(
        values in proptest::collection::vec(arb_value(), 0..12),
        shapes in proptest::collection::vec(arb_plan(), 0..6),
        align_pow in 0u32..7,
        chunk in 1usize..200,
    ) {
        let alignment = 1u64 << align_pow;
        let meta: Vec<(String, Value)> =
            values.into_iter().enumerate().map(|(i, v)| (format!("key.{i}"), v)).collect();
        let plans: Vec<TensorPlan> = shapes
            .into_iter()
            .enumerate()
            .map(|(i, (ty, ne))| TensorPlan { name: format!("t{i}"), ty, ne })
            .collect();
        let data = random_data(&plans, chunk as u64);
        let dir = tmpdir();
        let path = in_dir(&dir, "p.gguf");
        let mut w = GgufWriter::create(&path, false, &meta, &plans, alignment).unwrap();
        for d in &data {
            for c in d.chunks(chunk) {
                w.write_tensor_chunk(c).unwrap();
            }
        }
        w.finish().unwrap();
        let f = GgufFile::open(&path).unwrap();
        prop_assert_eq!(&f.metadata()[..meta.len()], &meta[..]);
        prop_assert_eq!(f.tensors().len(), plans.len());
        for ((t, p), d) in f.tensors().iter().zip(&plans).zip(&data) {
            prop_assert_eq!(&t.ne, &p.ne);
            prop_assert_eq!(t.ty, p.ty);
            prop_assert_eq!(f.tensor_data(t), &d[..]);
        }
        let layout: Vec<_> = spark_gguf::validate::validate(&f)
            .into_iter()
            .filter(|v| v.what != keys::GENERAL_ARCHITECTURE && v.what != keys::GENERAL_QUANTIZATION_VERSION)
            .collect();
        prop_assert!(layout.is_empty(), "{:?}", layout);
    }
}

#[cfg(unix)]
#[test]
fn output_gets_ordinary_file_permissions() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tmpdir();
    let plain = in_dir(&dir, "plain");
    std::fs::write(&plain, b"x").unwrap();
    let path = in_dir(&dir, "perm.gguf");
    GgufWriter::create(&path, false, &[], &[], 32)
        .unwrap()
        .finish()
        .unwrap();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&path), mode(&plain));
}
