//! Cross-checks against gguf-py (PyPI `gguf`), the ecosystem's reference implementation:
//! our encodings must be bit-identical to `gguf.quants`, and `gguf.GGUFReader` must read our files
//! with the same keys, types and tensor values.
//!
//! Needs SPARK_PYTHON (a Python with numpy and gguf, e.g. the project's .venv). Without it these
//! tests fail, unless SPARK_SKIP_PYTHON=1 says to skip them on purpose.

mod gguf_helpers;

use std::path::{Path, PathBuf};
use std::process::Command;

use gguf_helpers::*;
use serde_json::Value as Json;
use spark_gguf::quant::{decode_to_f32, encode_f32};
use spark_gguf::{keys, Array, GgmlType, GgufFile, TensorPlan, Value};

fn python() -> Option<PathBuf> {
    match std::env::var_os("SPARK_PYTHON") {
        Some(p) if !p.is_empty() => Some(PathBuf::from(p)),
        _ if std::env::var("SPARK_SKIP_PYTHON").as_deref() == Ok("1") => {
            eprintln!("SPARK_SKIP_PYTHON=1: skipping the gguf-py cross-check");
            None
        }
        _ => panic!(
            "set SPARK_PYTHON to a Python with numpy and gguf (e.g. SPARK_PYTHON=$PWD/.venv/bin/python) \
             to run the gguf-py cross-check, or SPARK_SKIP_PYTHON=1 to skip it explicitly"
        ),
    }
}

fn run_python(py: &Path, args: &[&std::ffi::OsStr]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gguf_py_reference.py");
    let out = Command::new(py)
        .arg(&script)
        .args(args)
        .output()
        .expect("cannot run SPARK_PYTHON");
    assert!(
        out.status.success(),
        "{} failed: {}\n{}",
        script.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Inputs covering ties, signed zeros, large and tiny magnitudes; length a multiple of 64.
fn quant_inputs() -> Vec<f32> {
    let mut v: Vec<f32> = Vec::new();
    let mut rng = Rng(0x5EED);
    // Random blocks at scales from 1e-30 to 1e30.
    for e in -30..=30 {
        let scale = 10f32.powi(e);
        v.extend((0..64).map(|_| rng.f32() * scale));
    }
    // Q8_0 ties: amax 127 gives d = 1, so x * id = x exactly: halves round away from zero.
    let mut b: Vec<f32> = vec![
        127.0, -0.5, 0.5, 1.5, -1.5, 2.5, -2.5, 126.5, -126.5, 0.0, -0.0,
    ];
    b.extend((0..21).map(|i| i as f32 + 0.5));
    v.extend(&b);
    v.extend(b.iter().map(|x| -x));
    // Q4_0 boundaries: max -8 gives d = 1, so x * id + 8.5 lands on integers and halves.
    let mut b: Vec<f32> = vec![-8.0];
    b.extend((0..31).map(|i| (i as f32) * 0.5 - 8.0));
    v.extend(&b);
    v.extend(b.iter().map(|x| x * 0.999_999));
    // F16 ties: half way between neighbours (ties to even), subnormals, overflow.
    let mut b: Vec<f32> = vec![
        1.0 + 2f32.powi(-11),
        1.0 + 3.0 * 2f32.powi(-11),
        -(1.0 + 2f32.powi(-11)),
        65504.0,
        65519.0,
        65520.0,
        1e5,
        -1e5,
        2f32.powi(-24),
        2f32.powi(-25),
        3.0 * 2f32.powi(-26),
        1e-8,
        0.0,
        -0.0,
        f32::MIN_POSITIVE,
        1e-45,
    ];
    // BF16 ties (bit patterns with the low half exactly 0x8000) and f32 extremes.
    for hi in [0x3f80u32, 0x3f81, 0xbf80, 0xbf81, 0x7f7f, 0x0080, 0x0001] {
        b.push(f32::from_bits((hi << 16) | 0x8000));
        b.push(f32::from_bits((hi << 16) | 0x7fff));
        b.push(f32::from_bits((hi << 16) | 0x8001));
    }
    b.extend([f32::MAX, -f32::MAX, 3e38]);
    b.resize(64, 0.25);
    v.extend(&b);
    // All-zero, all-negative-zero, tiny blocks (scale underflows to 0 in f16) and a single spike.
    v.extend([0.0f32; 64]);
    v.extend([-0.0f32; 64]);
    v.extend((0..64).map(|i| (i as f32 - 32.0) * 1e-39));
    v.extend((0..64).map(|i| if i == 17 { 3.0 } else { 1e-6 * i as f32 }));
    assert_eq!(v.len() % 64, 0);
    v
}

#[test]
fn encodings_are_bit_identical_to_gguf_py() {
    let Some(py) = python() else { return };
    let dir = tmpdir();
    let input = quant_inputs();
    let inp = in_dir(&dir, "in.f32");
    std::fs::write(
        &inp,
        input
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect::<Vec<u8>>(),
    )
    .unwrap();
    run_python(
        &py,
        &["quant".as_ref(), inp.as_os_str(), dir.path().as_os_str()],
    );
    for (name, ty) in [
        ("f16", GgmlType::F16),
        ("bf16", GgmlType::BF16),
        ("q8_0", GgmlType::Q8_0),
        ("q4_0", GgmlType::Q4_0),
    ] {
        let reference = std::fs::read(in_dir(&dir, &format!("{name}.bin"))).unwrap();
        // Whole input at once and row by row (64 values) must give the same bytes.
        let mut ours = Vec::new();
        encode_f32(ty, &input, &mut ours).unwrap();
        let mut rows = Vec::new();
        for r in input.chunks(64) {
            encode_f32(ty, r, &mut rows).unwrap();
        }
        assert_eq!(ours, rows, "{name}: row-wise encoding differs");
        assert_eq!(ours.len(), reference.len(), "{name}: length");
        let block = ty.type_size() as usize;
        for (i, (a, b)) in ours.chunks(block).zip(reference.chunks(block)).enumerate() {
            let n = ty.block_size() as usize;
            assert_eq!(
                a,
                b,
                "{name}: block {i} differs from gguf-py; inputs {:?}",
                &input[i * n..(i + 1) * n]
            );
        }
        let ref_dec: Vec<u32> = std::fs::read(in_dir(&dir, &format!("{name}.dec.f32")))
            .unwrap()
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let dec: Vec<u32> = decode_to_f32(ty, &ours, input.len())
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect();
        assert_eq!(dec, ref_dec, "{name}: decoding differs from gguf-py");
    }
}

fn json_u64s(j: &Json) -> Vec<u64> {
    j.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

/// The values of one gguf-py field, compared with ours by exact type and bits.
fn check_field(key: &str, ours: &Value, types: &[u64], values: &[Json]) {
    let ids = |t: spark_gguf::ValueType| t.id() as u64;
    match ours {
        Value::Array(a) => assert_eq!(types, [9, ids(a.elem_type())], "{key}: types"),
        v => assert_eq!(types, [ids(v.value_type())], "{key}: type"),
    }
    let int = |j: &Json| {
        j.as_i64()
            .map(|x| x as i128)
            .or_else(|| j.as_u64().map(|x| x as i128))
            .unwrap()
    };
    let strs = || {
        values
            .iter()
            .map(|j| j.as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    let ints = || values.iter().map(int).collect::<Vec<i128>>();
    let got: Vec<i128> = match ours {
        Value::String(s) => return assert_eq!(strs(), vec![s.clone()], "{key}"),
        Value::Array(Array::String(s)) => return assert_eq!(&strs(), s, "{key}"),
        Value::U8(x) => vec![*x as i128],
        Value::I8(x) => vec![*x as i128],
        Value::U16(x) => vec![*x as i128],
        Value::I16(x) => vec![*x as i128],
        Value::U32(x) => vec![*x as i128],
        Value::I32(x) => vec![*x as i128],
        Value::U64(x) => vec![*x as i128],
        Value::I64(x) => vec![*x as i128],
        Value::Bool(x) => vec![*x as i128],
        Value::F32(x) => vec![x.to_bits() as i128],
        Value::F64(x) => vec![x.to_bits() as i128],
        Value::Array(a) => match a {
            Array::U8(v) => v.iter().map(|&x| x as i128).collect(),
            Array::I8(v) => v.iter().map(|&x| x as i128).collect(),
            Array::U16(v) => v.iter().map(|&x| x as i128).collect(),
            Array::I16(v) => v.iter().map(|&x| x as i128).collect(),
            Array::U32(v) => v.iter().map(|&x| x as i128).collect(),
            Array::I32(v) => v.iter().map(|&x| x as i128).collect(),
            Array::U64(v) => v.iter().map(|&x| x as i128).collect(),
            Array::I64(v) => v.iter().map(|&x| x as i128).collect(),
            Array::Bool(v) => v.iter().map(|&x| x as i128).collect(),
            Array::F32(v) => v.iter().map(|x| x.to_bits() as i128).collect(),
            Array::F64(v) => v.iter().map(|x| x.to_bits() as i128).collect(),
            Array::String(_) => unreachable!(),
        },
    };
    assert_eq!(ints(), got, "{key}: values");
}

fn cross_read(py: &Path, path: &Path) {
    let f = GgufFile::open(path).unwrap();
    let out = path.with_extension("json");
    run_python(py, &["read".as_ref(), path.as_os_str(), out.as_os_str()]);
    let j: Json = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(j["alignment"].as_u64().unwrap(), f.alignment());
    let fields = j["fields"].as_array().unwrap();
    assert_eq!(fields.len(), f.metadata().len());
    for (field, (key, value)) in fields.iter().zip(f.metadata()) {
        assert_eq!(field["key"].as_str().unwrap(), key);
        check_field(
            key,
            value,
            &json_u64s(&field["types"]),
            field["values"].as_array().unwrap(),
        );
    }
    let tensors = j["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), f.tensors().len());
    for (jt, t) in tensors.iter().zip(f.tensors()) {
        assert_eq!(jt["name"].as_str().unwrap(), t.name);
        assert_eq!(jt["type"].as_u64().unwrap(), t.ty.id() as u64, "{}", t.name);
        assert_eq!(json_u64s(&jt["shape"]), t.ne, "{}", t.name);
        assert_eq!(jt["n_bytes"].as_u64().unwrap(), t.n_bytes, "{}", t.name);
        assert_eq!(
            jt["data_offset"].as_u64().unwrap(),
            f.data_offset() + t.offset,
            "{}",
            t.name
        );
        let hex: String = f
            .tensor_data(t)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(jt["hex"].as_str().unwrap(), hex, "{}: bytes", t.name);
        if let Some(bits) = jt.get("f32_bits") {
            let ours: Vec<u64> = decode_to_f32(t.ty, f.tensor_data(t), t.n_elements() as usize)
                .unwrap()
                .iter()
                .map(|x| x.to_bits() as u64)
                .collect();
            assert_eq!(json_u64s(bits), ours, "{}: decoded values", t.name);
        }
    }
}

#[test]
fn gguf_py_reads_our_files_identically() {
    let Some(py) = python() else { return };
    let dir = tmpdir();
    // Every value type, several tensor types and odd shapes, default and custom alignment.
    let meta = vec![
        (
            "general.architecture".to_string(),
            Value::String("test".into()),
        ),
        ("v.u8".into(), Value::U8(250)),
        ("v.i8".into(), Value::I8(-3)),
        ("v.u16".into(), Value::U16(65000)),
        ("v.i16".into(), Value::I16(-32000)),
        ("v.u32".into(), Value::U32(4_000_000_000)),
        ("v.i32".into(), Value::I32(-5)),
        ("v.f32".into(), Value::F32(1e-6)),
        ("v.bool".into(), Value::Bool(true)),
        ("v.str".into(), Value::String("Ünïcödé ▁x".into())),
        ("v.u64".into(), Value::U64(u64::MAX)),
        ("v.i64".into(), Value::I64(i64::MIN)),
        ("v.f64".into(), Value::F64(-1e300)),
        ("a.u8".into(), Value::Array(Array::U8(vec![1, 2, 3]))),
        ("a.i8".into(), Value::Array(Array::I8(vec![-1, 1]))),
        ("a.u16".into(), Value::Array(Array::U16(vec![9]))),
        ("a.i16".into(), Value::Array(Array::I16(vec![-9, 9]))),
        (
            "a.u32".into(),
            Value::Array(Array::U32(vec![1, 4_000_000_000])),
        ),
        ("a.i32".into(), Value::Array(Array::I32(vec![-1, 2, 3]))),
        (
            "a.f32".into(),
            Value::Array(Array::F32(vec![0.1, -0.0, 3e38])),
        ),
        (
            "a.bool".into(),
            Value::Array(Array::Bool(vec![false, true])),
        ),
        (
            "a.str".into(),
            Value::Array(Array::String(vec![
                "x".into(),
                String::new(),
                "<0xFF>".into(),
            ])),
        ),
        ("a.u64".into(), Value::Array(Array::U64(vec![0, u64::MAX]))),
        ("a.i64".into(), Value::Array(Array::I64(vec![-7]))),
        ("a.f64".into(), Value::Array(Array::F64(vec![2.5e-310]))),
        (keys::GENERAL_QUANTIZATION_VERSION.into(), Value::U32(2)),
    ];
    let p = |name: &str, ty, ne: &[u64]| TensorPlan {
        name: name.into(),
        ty,
        ne: ne.to_vec(),
    };
    let plans = vec![
        p("f32", GgmlType::F32, &[3, 5]),
        p("f16", GgmlType::F16, &[7, 1, 3]),
        p("bf16", GgmlType::BF16, &[5, 2]),
        p("q8_0", GgmlType::Q8_0, &[64, 3]),
        p("q4_0", GgmlType::Q4_0, &[32, 1, 1, 2]),
        p("i32", GgmlType::I32, &[3]),
    ];
    let mut rng = Rng(42);
    let data: Vec<Vec<u8>> = plans
        .iter()
        .map(|pl| {
            let n: u64 = pl.ne.iter().product();
            if pl.ty == GgmlType::I32 {
                return rng.bytes(12);
            }
            let vals: Vec<f32> = (0..n).map(|_| rng.f32() * 3.0).collect();
            let mut b = Vec::new();
            encode_f32(pl.ty, &vals, &mut b).unwrap();
            b
        })
        .collect();
    for alignment in [32u64, 64, 8] {
        let path = in_dir(&dir, &format!("py{alignment}.gguf"));
        write_file(&path, &meta, &plans, &data, alignment);
        cross_read(&py, &path);
    }
    // And a whole tiny Spark-Gemma2 model.
    let path = write_tiny_model(&dir, spark_gguf::schema::SPARK_ARCH, GgmlType::Q8_0);
    cross_read(&py, &path);
}

/// Types of our table that the gguf-py the tests run against may not know yet: ggml added them
/// after gguf 0.19. Each is still compared in full as soon as gguf-py knows it (by name or id).
const NEWER_THAN_GGUF_PY: &[GgmlType] = &[GgmlType::Q2_0];

#[test]
fn ggml_type_table_matches_gguf_py() {
    let Some(py) = python() else { return };
    let dir = tmpdir();
    let out = in_dir(&dir, "types.json");
    run_python(&py, &["types".as_ref(), out.as_os_str()]);
    let j: Json = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let version = j["gguf_version"].as_str().unwrap_or("?").to_string();
    // gguf-py's facts: (name, id, block size, type size); sizes are None without an entry in
    // GGML_QUANT_SIZES.
    let theirs: Vec<(String, u64, Option<u64>, Option<u64>)> = j["types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap().to_string(),
                t["id"].as_u64().unwrap(),
                t["block_size"].as_u64(),
                t["type_size"].as_u64(),
            )
        })
        .collect();
    assert!(
        theirs.len() >= 30,
        "gguf {version} lists only {} types",
        theirs.len()
    );
    let ours = |t: GgmlType| {
        (
            format!("{t:?}"),
            u64::from(t.id()),
            Some(t.block_size()),
            Some(t.type_size()),
        )
    };
    let mut problems = Vec::new();
    // Every entry of our table: same name and id, block size and type size as gguf-py.
    for &t in GgmlType::ALL {
        let want = ours(t);
        let by_name = theirs.iter().find(|e| e.0 == want.0);
        let by_id = theirs.iter().find(|e| e.1 == want.1);
        match (by_name, by_id) {
            (None, None) if NEWER_THAN_GGUF_PY.contains(&t) => {}
            (None, None) => problems.push(format!("{want:?}: unknown to gguf {version}")),
            (Some(e), _) | (None, Some(e)) if *e != want => {
                problems.push(format!("ours {want:?} but gguf-py {e:?}"))
            }
            _ => {}
        }
    }
    // Every type gguf-py knows is in our table (ggml's removed ids are in neither), with the
    // same facts.
    for e in &theirs {
        match u32::try_from(e.1).ok().and_then(GgmlType::from_u32) {
            Some(t) if ours(t) == *e => {}
            Some(t) => problems.push(format!("gguf-py {e:?} but ours {:?}", ours(t))),
            None => problems.push(format!("gguf-py {e:?} is missing from our table")),
        }
    }
    assert!(
        problems.is_empty(),
        "the ggml type table differs from gguf {version}:\n{}",
        problems.join("\n")
    );
}
