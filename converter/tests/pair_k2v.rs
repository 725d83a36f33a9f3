//! `spark-convert --pair-k2v` (SPEC section 3, `ffn_k2v`): each row of the paired tensor holds
//! exactly the bytes of the same neuron's `ffn_up` (K2) row and `ffn_down_t` (V) row of the
//! conversion without the option; the type rule and its fallback; refusal for dense models.

mod convert_helpers;

use std::path::{Path, PathBuf};
use std::process::Command;

use convert_helpers::{checkpoint_members, write_npz, D, FF, FFN_R};
use spark_convert::convert::{convert, ConvertOptions, SparkOverrides};
use spark_convert::model::OutType;
use spark_convert::npy;
use spark_convert::synthetic::{generate, SyntheticOptions};
use spark_gguf::schema::{FfnRowLayout, Layout, QkvLayout, TensorKind};
use spark_gguf::validate::{layout_of, validate};
use spark_gguf::{GgmlType, GgufFile};

const OUTTYPES: [OutType; 3] = [OutType::F32, OutType::F16, OutType::Q8_0];

fn synthetic(
    output: &Path,
    outtype: OutType,
    layout: Layout,
    overrides: SparkOverrides,
) -> spark_convert::error::Result<()> {
    generate(&SyntheticOptions {
        preset: "tiny".into(),
        output: output.to_path_buf(),
        seed: 5,
        outtype,
        overrides,
        qkv: layout.qkv,
        ffn_rows: layout.ffn_rows,
        name: None,
        manifest: None,
        force: false,
        quiet: true,
    })
}

fn from_checkpoint(input: &Path, output: &Path, outtype: OutType, layout: Layout) {
    convert(&ConvertOptions {
        input: input.to_path_buf(),
        output: output.to_path_buf(),
        outtype,
        input_dtype: None,
        tokenizer: None,
        vocab_from: None,
        chat_template: None,
        overrides: SparkOverrides::default(),
        qkv: layout.qkv,
        ffn_rows: layout.ffn_rows,
        name: None,
        manifest: None,
        force: false,
        quiet: true,
    })
    .unwrap();
}

/// The file, after checking that `validate` accepts it and infers `layout`.
fn open_valid(path: &Path, layout: Layout) -> GgufFile {
    let f = GgufFile::open(path).unwrap();
    let problems: Vec<String> = validate(&f).iter().map(|v| v.to_string()).collect();
    assert!(problems.is_empty(), "{}: {problems:?}", path.display());
    assert_eq!(layout_of(&f), layout, "{}", path.display());
    f
}

/// The rows of tensor `name` in `f`: (type, ne, one byte slice per row).
fn rows<'a>(f: &'a GgufFile, name: &str) -> (GgmlType, Vec<u64>, Vec<&'a [u8]>) {
    let t = f.tensor(name).unwrap_or_else(|| panic!("no tensor {name}"));
    let row = t.ty.row_bytes(t.ne[0]).unwrap() as usize;
    let data = f.tensor_data(t);
    (t.ty, t.ne.clone(), data.chunks_exact(row).collect())
}

/// Checks that `paired` holds, in every layer, `ffn_k2v` row j == `ffn_up` row j ++
/// `ffn_down_t` row j of `separate` (byte for byte), in `separate`'s tensor order with ffn_k2v
/// where ffn_up was, and every other tensor byte-identical. Returns the paired tensors' type.
fn assert_rows_side_by_side(paired: &GgufFile, separate: &GgufFile) -> GgmlType {
    let up = TensorKind::FfnUp.short_name();
    let down = TensorKind::FfnDownT.short_name();
    let k2v = TensorKind::FfnK2v.short_name();
    let want_names: Vec<String> = separate
        .tensors()
        .iter()
        .filter(|t| !t.name.contains(&format!(".{down}.")))
        .map(|t| t.name.replace(&format!(".{up}."), &format!(".{k2v}.")))
        .collect();
    let names: Vec<String> = paired.tensors().iter().map(|t| t.name.clone()).collect();
    assert_eq!(names, want_names);
    for t in paired.tensors().iter().filter(|t| !t.name.contains(k2v)) {
        let s = separate.tensor(&t.name).unwrap();
        assert_eq!((t.ty, &t.ne), (s.ty, &s.ne), "{}", t.name);
        assert!(
            paired.tensor_data(t) == separate.tensor_data(s),
            "{} differs",
            t.name
        );
    }
    let mut ty = None;
    let n_layers = names.iter().filter(|n| n.contains(k2v)).count() as u64;
    assert!(n_layers > 0);
    for l in 0..n_layers {
        let (k2v_ty, k2v_ne, k2v_rows) = rows(paired, &TensorKind::FfnK2v.name_for(l));
        let (up_ty, up_ne, up_rows) = rows(separate, &TensorKind::FfnUp.name_for(l));
        let (down_ty, down_ne, down_rows) = rows(separate, &TensorKind::FfnDownT.name_for(l));
        assert_eq!((up_ty, down_ty), (k2v_ty, k2v_ty), "layer {l}");
        assert_eq!(k2v_ne, vec![up_ne[0] + down_ne[0], up_ne[1]]);
        assert_eq!(k2v_rows.len(), up_rows.len());
        for (j, ((k, u), d)) in k2v_rows.iter().zip(&up_rows).zip(&down_rows).enumerate() {
            assert!(*k == [*u, *d].concat(), "layer {l} row {j}");
        }
        ty = Some(k2v_ty);
    }
    ty.unwrap()
}

#[test]
fn synthetic_paired_rows_are_the_separate_rows_side_by_side() {
    let dir = tempfile::tempdir().unwrap();
    for qkv in [QkvLayout::Split, QkvLayout::Stacked] {
        let separate = Layout::new(qkv, FfnRowLayout::Separate);
        let paired = Layout::new(qkv, FfnRowLayout::Paired);
        for outtype in OUTTYPES {
            let a = dir
                .path()
                .join(format!("{qkv:?}-{outtype:?}-separate.gguf"));
            let b = dir.path().join(format!("{qkv:?}-{outtype:?}-paired.gguf"));
            synthetic(&a, outtype, separate, SparkOverrides::default()).unwrap();
            synthetic(&b, outtype, paired, SparkOverrides::default()).unwrap();
            let ty = assert_rows_side_by_side(&open_valid(&b, paired), &open_valid(&a, separate));
            // tiny: D = 128, r_f = 64, both parts whole q8_0 blocks
            let want = match outtype {
                OutType::F32 => GgmlType::F32,
                OutType::F16 => GgmlType::F16,
                _ => GgmlType::Q8_0,
            };
            assert_eq!(ty, want, "{qkv:?} {outtype:?}");
        }
    }
}

#[test]
fn q8_0_falls_back_to_f16_when_a_part_is_not_whole_blocks() {
    // r_f = 40: K2 rows of 88 values (not whole q8_0 blocks), V rows of 128 (whole): the
    // separate file stores ffn_up as f16 and ffn_down_t as q8_0, the paired one both as f16,
    // which are the rows of the f16 conversion
    let dir = tempfile::tempdir().unwrap();
    let r40 = SparkOverrides {
        ffn_r: Some(40),
        ..SparkOverrides::default()
    };
    let separate = Layout::default();
    let paired = Layout::new(QkvLayout::Split, FfnRowLayout::Paired);
    let q8_separate = dir.path().join("q8-separate.gguf");
    let q8_paired = dir.path().join("q8-paired.gguf");
    let f16_separate = dir.path().join("f16-separate.gguf");
    synthetic(&q8_separate, OutType::Q8_0, separate, r40).unwrap();
    synthetic(&q8_paired, OutType::Q8_0, paired, r40).unwrap();
    synthetic(&f16_separate, OutType::F16, separate, r40).unwrap();
    let q8_separate = open_valid(&q8_separate, separate);
    assert_eq!(
        q8_separate.tensor("blk.0.ffn_up.weight").unwrap().ty,
        GgmlType::F16
    );
    assert_eq!(
        q8_separate.tensor("blk.0.ffn_down_t.weight").unwrap().ty,
        GgmlType::Q8_0
    );
    let q8_paired = open_valid(&q8_paired, paired);
    let k2v = q8_paired.tensor("blk.1.ffn_k2v.weight").unwrap();
    assert_eq!(
        (k2v.ty, k2v.ne.clone()),
        (GgmlType::F16, vec![88 + 128, 512])
    );
    let f16_separate = open_valid(&f16_separate, separate);
    for l in 0..2 {
        let (_, _, k) = rows(&q8_paired, &TensorKind::FfnK2v.name_for(l));
        let (_, _, u) = rows(&f16_separate, &TensorKind::FfnUp.name_for(l));
        let (_, _, d) = rows(&f16_separate, &TensorKind::FfnDownT.name_for(l));
        for (j, ((k, u), d)) in k.iter().zip(&u).zip(&d).enumerate() {
            assert!(*k == [*u, *d].concat(), "layer {l} row {j}");
        }
    }
    // every other tensor is the q8_0 conversion's
    for t in q8_paired
        .tensors()
        .iter()
        .filter(|t| !t.name.contains("ffn_k2v"))
    {
        let s = q8_separate.tensor(&t.name).unwrap();
        assert!(
            q8_paired.tensor_data(t) == q8_separate.tensor_data(s),
            "{}",
            t.name
        );
    }
}

#[test]
fn checkpoint_paired_rows_are_the_separate_rows_side_by_side() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck.npz");
    write_npz(&ck, &checkpoint_members());
    for qkv in [QkvLayout::Split, QkvLayout::Stacked] {
        let separate = Layout::new(qkv, FfnRowLayout::Separate);
        let paired = Layout::new(qkv, FfnRowLayout::Paired);
        for outtype in OUTTYPES {
            let a = dir
                .path()
                .join(format!("{qkv:?}-{outtype:?}-separate.gguf"));
            let b = dir.path().join(format!("{qkv:?}-{outtype:?}-paired.gguf"));
            from_checkpoint(&ck, &a, outtype, separate);
            from_checkpoint(&ck, &b, outtype, paired);
            let ty = assert_rows_side_by_side(&open_valid(&b, paired), &open_valid(&a, separate));
            let f = GgufFile::open(&b).unwrap();
            let k2v = f.tensor("blk.0.ffn_k2v.weight").unwrap();
            assert_eq!(k2v.ne, vec![(D - FFN_R + D) as u64, FF as u64]);
            // D = 16, r_f = 8: neither part is whole q8_0 blocks, so q8_0 stores f16
            let want = match outtype {
                OutType::F32 => GgmlType::F32,
                _ => GgmlType::F16,
            };
            assert_eq!(ty, want, "{qkv:?} {outtype:?}");
        }
    }
}

fn spark_convert(args: &[&dyn AsRef<std::ffi::OsStr>]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_spark-convert"))
        .args(args.iter().map(|a| a.as_ref()))
        .arg("--quiet")
        .output()
        .expect("run spark-convert")
}

/// The tiny checkpoint with a dense FFN (`mlp/gating_einsum` [2, D, F] for `spark_in`).
fn dense_checkpoint(path: &Path) {
    let members: Vec<(String, Vec<u8>)> = checkpoint_members()
        .into_iter()
        .map(|(name, data)| match name.strip_suffix("mlp/spark_in") {
            Some(layer) => {
                let mut v = npy::header("<f4", &[2, D, FF]);
                v.extend((0..2 * D * FF).flat_map(|i| (i as f32 * 1e-3).to_le_bytes()));
                (format!("{layer}mlp/gating_einsum"), v)
            }
            None => (name, data),
        })
        .collect();
    write_npz(path, &members);
}

#[test]
fn pair_k2v_is_refused_for_dense_models_leaving_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir: PathBuf = dir.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let out = out_dir.join("m.gguf");
    let dense = dir.path().join("dense.npz");
    dense_checkpoint(&dense);
    // the dense checkpoint converts without the option
    let o = spark_convert(&[&dense, &dir.path().join("ok.gguf")]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let cases: [(Vec<&dyn AsRef<std::ffi::OsStr>>, &str); 2] = [
        (
            vec![&"--synthetic", &"tiny-dense", &out, &"--pair-k2v"],
            "spark-convert: error: --pair-k2v does not apply to the dense preset 'tiny-dense'",
        ),
        (
            vec![&dense, &out, &"--pair-k2v"],
            "spark-convert: error: --pair-k2v applies to Spark checkpoints; this one is dense (mlp/gating_einsum)",
        ),
    ];
    for (args, message) in cases {
        let o = spark_convert(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{err}");
        assert_eq!(err.trim_end(), message);
        let left: Vec<_> = std::fs::read_dir(&out_dir).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
