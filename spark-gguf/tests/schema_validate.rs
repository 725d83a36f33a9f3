//! `validate` on whole model files: the Spark schema and llama.cpp's metadata rules.

mod gguf_helpers;

use gguf_helpers::*;
use spark_gguf::schema::{
    suffix, FfnRowLayout, Hparams, Layout, QkvLayout, GEMMA2_ARCH, SPARK_ARCH,
};
use spark_gguf::validate::{layout_of, row_part_violations, validate};
use spark_gguf::{keys, Array, GgmlType, GgufFile, GgufWriter, TensorPlan, Value};

/// Writes metadata + plans with zero data and returns the violations as "what: message" lines.
fn violations(meta: &[(String, Value)], plans: &[TensorPlan]) -> Vec<String> {
    let dir = tmpdir();
    let path = in_dir(&dir, "m.gguf");
    let mut w = GgufWriter::create(&path, false, meta, plans, 32).unwrap();
    for p in plans {
        w.write_tensor(&vec![0u8; p.ty.tensor_bytes(&p.ne).unwrap() as usize])
            .unwrap();
    }
    w.finish().unwrap();
    validate(&GgufFile::open(&path).unwrap())
        .iter()
        .map(|v| v.to_string())
        .collect()
}

fn set(meta: &mut [(String, Value)], key: &str, v: Value) {
    meta.iter_mut()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("no key {key}"))
        .1 = v;
}

fn remove(meta: &mut Vec<(String, Value)>, key: &str) {
    let n = meta.len();
    meta.retain(|(k, _)| k != key);
    assert_eq!(meta.len() + 1, n, "{key}");
}

#[test]
fn tiny_models_are_valid() {
    let dir = tmpdir();
    for arch in [SPARK_ARCH, GEMMA2_ARCH] {
        for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0] {
            let path = write_tiny_model(&dir, arch, ty);
            let f = GgufFile::open(&path).unwrap();
            assert_eq!(validate(&f), vec![], "{arch} {ty}");
            std::fs::remove_file(&path).unwrap();
        }
    }
}

#[test]
fn missing_and_mistyped_keys_are_named() {
    let base = tiny_metadata(SPARK_ARCH);
    let plans = tiny_plans(&base, GgmlType::F32);

    let mut m = base.clone();
    remove(&mut m, "spark-gemma2.spark.attn_k");
    assert_eq!(
        violations(&m, &plans),
        ["spark-gemma2.spark.attn_k: is missing (required by spark-gemma2, type u32)"]
    );

    let mut m = base.clone();
    set(&mut m, "spark-gemma2.context_length", Value::U64(128));
    set(
        &mut m,
        "spark-gemma2.attention.layer_norm_rms_epsilon",
        Value::F64(1e-6),
    );
    assert_eq!(
        violations(&m, &plans),
        [
            "spark-gemma2.context_length: must have type u32 but has type u64",
            "spark-gemma2.attention.layer_norm_rms_epsilon: must have type f32 but has type f64",
        ]
    );

    let mut m = base.clone();
    set(&mut m, keys::TOKENIZER_BOS_ID, Value::I32(2));
    set(
        &mut m,
        keys::TOKENIZER_SCORES,
        Value::Array(Array::F64(vec![0.0; 263])),
    );
    set(&mut m, keys::GENERAL_FILE_TYPE, Value::U8(0));
    assert_eq!(
        violations(&m, &plans),
        [
            "general.file_type: must have type u32 but has type u8",
            "tokenizer.ggml.scores: must have type arr[f32] but has type arr[f64]",
            "tokenizer.ggml.bos_token_id: must have type u32 but has type i32",
        ]
    );

    let mut m = base.clone();
    remove(&mut m, keys::GENERAL_ARCHITECTURE);
    let plans_any = plans.clone();
    assert_eq!(
        violations(&m, &plans_any),
        ["general.architecture: is missing (llama.cpp needs it to pick a model loader)"]
    );
}

#[test]
fn hparam_rules_and_tokenizer_consistency() {
    let base = tiny_metadata(SPARK_ARCH);
    let plans = tiny_plans(&base, GgmlType::F32);

    let mut m = base.clone();
    set(&mut m, "spark-gemma2.spark.attn_r", Value::U32(7));
    assert_eq!(
        violations(&m, &plans),
        ["spark-gemma2.spark.attn_r: r_a = 7 and H - r_a = 9 must both be even (each part is rotated in pairs)"]
    );

    let mut m = base.clone();
    set(&mut m, keys::TOKENIZER_EOS_ID, Value::U32(100_000));
    set(
        &mut m,
        keys::TOKENIZER_TOKEN_TYPE,
        Value::Array(Array::I32(vec![1; 5])),
    );
    assert_eq!(
        violations(&m, &plans),
        [
            "tokenizer.ggml.token_type: has 5 entries but tokenizer.ggml.tokens has 263",
            "tokenizer.ggml.eos_token_id: token id 100000 is outside the vocabulary of 263 tokens",
        ]
    );

    // A SentencePiece vocabulary without byte-fallback tokens.
    let mut m = base.clone();
    let mut tokens = tiny_vocab();
    tokens.retain(|t| t != "<0x41>");
    tokens.push("extra".into());
    set(
        &mut m,
        keys::TOKENIZER_TOKENS,
        Value::Array(Array::String(tokens)),
    );
    assert_eq!(
        violations(&m, &plans),
        ["tokenizer.ggml.tokens: SentencePiece ('llama') vocabulary lacks 1 byte-fallback tokens (first: <0x41>); llama.cpp can fail to tokenize unknown bytes"]
    );

    let mut m = base.clone();
    set(
        &mut m,
        "spark-gemma2.attention.value_length",
        Value::U32(32),
    );
    assert_eq!(
        violations(&m, &plans),
        ["spark-gemma2.attention.value_length: is 32 but spark-gemma2.attention.key_length is 16; they must be equal"]
    );
}

#[test]
fn tensor_set_must_match_the_schema_exactly() {
    let base = tiny_metadata(SPARK_ARCH);
    let plans = tiny_plans(&base, GgmlType::F32);

    let mut p = plans.clone();
    p.retain(|t| t.name != "blk.1.ffn_down_t.weight");
    p.iter_mut()
        .find(|t| t.name == "blk.0.ffn_up.weight")
        .unwrap()
        .ne = vec![96, 96];
    p.push(TensorPlan {
        name: "blk.0.ffn_down.weight".into(),
        ty: GgmlType::F32,
        ne: vec![96, 96],
    });
    assert_eq!(
        violations(&base, &p),
        [
            "blk.0.ffn_up.weight: has shape [96, 96], expected [64, 96]",
            "blk.1.ffn_down_t.weight: is missing (expected shape [96, 96])",
            "blk.0.ffn_down.weight: is not a tensor of spark-gemma2 (llama.cpp refuses files with extra tensors)",
        ]
    );

    // Shapes compare as llama.cpp compares them: trailing 1s do not matter.
    let mut p = plans.clone();
    p.iter_mut()
        .find(|t| t.name == "output_norm.weight")
        .unwrap()
        .ne = vec![96, 1, 1];
    assert_eq!(violations(&base, &p), Vec::<String>::new());
    p.iter_mut()
        .find(|t| t.name == "output_norm.weight")
        .unwrap()
        .ne = vec![96, 1, 2];
    assert_eq!(
        violations(&base, &p),
        ["output_norm.weight: has shape [96, 1, 2], expected [96]"]
    );

    // A quantized tensor needs general.quantization_version.
    let q = tiny_plans(&base, GgmlType::Q8_0);
    assert_eq!(
        violations(&base, &q),
        ["general.quantization_version: is missing but tensor 'token_embd.weight' is quantized"]
    );
}

#[test]
fn spark_files_with_wq_wk_wv_stacked_are_valid_too() {
    // spark-convert --stack-qkv writes Wq, Wk, Wv as one attn_qkv; llama.cpp loads either
    let base = tiny_metadata(SPARK_ARCH);
    let split = tiny_plans(&base, GgmlType::F32);
    assert!(split.iter().any(|t| t.name == "blk.1.attn_v.weight"));
    let hp = Hparams::from_metadata(SPARK_ARCH, |k| {
        base.iter().find(|(kk, _)| kk == k).map(|(_, v)| v)
    })
    .unwrap();
    let stacked: Vec<TensorPlan> = hp
        .expected_tensors_in(
            SPARK_ARCH.tensors_with(Layout::new(QkvLayout::Stacked, FfnRowLayout::Separate)),
        )
        .into_iter()
        .map(|(name, ne)| TensorPlan {
            name,
            ty: GgmlType::F32,
            ne,
        })
        .collect();
    let qkv = stacked
        .iter()
        .find(|t| t.name == "blk.1.attn_qkv.weight")
        .unwrap();
    let qkv_rows = (hp.n_heads + 2 * hp.n_kv_heads) * hp.head_dim;
    assert_eq!(qkv.ne, vec![hp.d_model, qkv_rows]);
    assert!(stacked.iter().all(|t| !t.name.contains("attn_q.")));
    assert_eq!(violations(&base, &stacked), Vec::<String>::new());

    // one layout or the other, never both: three matrices and one stacked one
    let mut both = split.clone();
    both.push(qkv.clone());
    assert_eq!(
        violations(&base, &both),
        ["blk.1.attn_qkv.weight: is not a tensor of spark-gemma2 (llama.cpp refuses files with extra tensors)"]
    );
}

/// Writes the file and reads it back.
fn open_written(meta: &[(String, Value)], plans: &[TensorPlan]) -> (tempfile::TempDir, GgufFile) {
    let dir = tmpdir();
    let path = in_dir(&dir, "m.gguf");
    let data: Vec<Vec<u8>> = plans
        .iter()
        .map(|p| vec![0u8; p.ty.tensor_bytes(&p.ne).unwrap() as usize])
        .collect();
    write_file(&path, meta, plans, &data, 32);
    let f = GgufFile::open(&path).unwrap();
    (dir, f)
}

#[test]
fn spark_files_with_k2_and_v_paired_are_valid_in_both_qkv_layouts() {
    // spark-convert --pair-k2v writes K2 and V as one ffn_k2v; llama.cpp loads either
    let mut base = tiny_metadata(SPARK_ARCH);
    base.push((
        keys::GENERAL_QUANTIZATION_VERSION.into(),
        Value::U32(keys::QUANTIZATION_VERSION),
    ));
    for qkv in [QkvLayout::Split, QkvLayout::Stacked] {
        let layout = Layout::new(qkv, FfnRowLayout::Paired);
        for ty in [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0] {
            let plans = tiny_plans_in(&base, layout, ty);
            let k2v = plans
                .iter()
                .find(|t| t.name == "blk.1.ffn_k2v.weight")
                .unwrap();
            // D = 96, r_f = 32: a row is K2's 64 values then V's 96
            assert_eq!(k2v.ne, vec![64 + 96, 96]);
            assert!(plans
                .iter()
                .all(|t| !t.name.contains("ffn_up") && !t.name.contains("ffn_down")));
            assert_eq!(
                violations(&base, &plans),
                Vec::<String>::new(),
                "{qkv:?} {ty}"
            );
            let (_dir, f) = open_written(&base, &plans);
            assert_eq!(layout_of(&f), layout);
            assert!(row_part_violations(&f).is_empty());
        }
    }
}

#[test]
fn paired_and_separate_k2_v_never_mix() {
    let base = tiny_metadata(SPARK_ARCH);
    let separate = tiny_plans(&base, GgmlType::F32);
    let paired = tiny_plans_in(
        &base,
        Layout::new(QkvLayout::Split, FfnRowLayout::Paired),
        GgmlType::F32,
    );
    // layer 0 paired, layer 1 separate: checked as a paired file
    let mut mixed: Vec<TensorPlan> = paired
        .iter()
        .filter(|t| !t.name.starts_with("blk.1."))
        .cloned()
        .collect();
    mixed.extend(
        separate
            .iter()
            .filter(|t| t.name.starts_with("blk.1."))
            .cloned(),
    );
    assert_eq!(
        violations(&base, &mixed),
        [
            "blk.1.ffn_k2v.weight: is missing (expected shape [160, 96])",
            "blk.1.ffn_up.weight: is not a tensor of spark-gemma2 (llama.cpp refuses files with extra tensors)",
            "blk.1.ffn_down_t.weight: is not a tensor of spark-gemma2 (llama.cpp refuses files with extra tensors)",
        ]
    );
    // layer 0 separate, layer 1 paired: checked as a separate file
    let mut mixed: Vec<TensorPlan> = separate
        .iter()
        .filter(|t| !t.name.starts_with("blk.1."))
        .cloned()
        .collect();
    mixed.extend(
        paired
            .iter()
            .filter(|t| t.name.starts_with("blk.1."))
            .cloned(),
    );
    assert_eq!(
        violations(&base, &mixed),
        [
            "blk.1.ffn_up.weight: is missing (expected shape [64, 96])",
            "blk.1.ffn_down_t.weight: is missing (expected shape [96, 96])",
            "blk.1.ffn_k2v.weight: is not a tensor of spark-gemma2 (llama.cpp refuses files with extra tensors)",
        ]
    );
    // both forms in one layer
    let mut both = paired.clone();
    both.extend(
        separate
            .iter()
            .filter(|t| t.name.contains("ffn_up"))
            .cloned(),
    );
    assert_eq!(
        violations(&base, &both),
        [
            "blk.0.ffn_up.weight: is not a tensor of spark-gemma2 (llama.cpp refuses files with extra tensors)",
            "blk.1.ffn_up.weight: is not a tensor of spark-gemma2 (llama.cpp refuses files with extra tensors)",
        ]
    );
    // a paired tensor of the wrong width is named with both shapes
    let mut wide = paired.clone();
    wide.iter_mut()
        .find(|t| t.name == "blk.0.ffn_k2v.weight")
        .unwrap()
        .ne = vec![192, 96];
    assert_eq!(
        violations(&base, &wide),
        ["blk.0.ffn_k2v.weight: has shape [192, 96], expected [160, 96]"]
    );
}

#[test]
fn a_paired_tensor_s_type_must_make_both_parts_whole_blocks() {
    // D = 80, r_f = 32: a row of 48 + 80 = 128 values is four q8_0 blocks, but K2's 48 values
    // end in the middle of the second one
    let mut base = tiny_metadata(SPARK_ARCH);
    set(&mut base, "spark-gemma2.embedding_length", Value::U32(80));
    base.push((
        keys::GENERAL_QUANTIZATION_VERSION.into(),
        Value::U32(keys::QUANTIZATION_VERSION),
    ));
    let layout = Layout::new(QkvLayout::Split, FfnRowLayout::Paired);
    let mut plans = tiny_plans_in(&base, layout, GgmlType::F32);
    assert_eq!(violations(&base, &plans), Vec::<String>::new());
    for t in plans
        .iter_mut()
        .filter(|t| t.name.ends_with("ffn_k2v.weight"))
    {
        assert_eq!(t.ne, vec![48 + 80, 96]);
        t.ty = GgmlType::Q8_0;
    }
    let msg = "type q8_0 (blocks of 32 elements) does not make each part of a row whole blocks: \
               ffn_up part 48, ffn_down_t part 80 elements";
    assert_eq!(
        violations(&base, &plans),
        [
            format!("blk.0.ffn_k2v.weight: {msg}"),
            format!("blk.1.ffn_k2v.weight: {msg}"),
        ]
    );
    let (_dir, f) = open_written(&base, &plans);
    let alone: Vec<String> = row_part_violations(&f)
        .iter()
        .map(|v| v.to_string())
        .collect();
    assert_eq!(
        alone,
        [
            format!("blk.0.ffn_k2v.weight: {msg}"),
            format!("blk.1.ffn_k2v.weight: {msg}")
        ]
    );
    // f16 (block size 1) makes any parts whole
    for t in plans
        .iter_mut()
        .filter(|t| t.name.ends_with("ffn_k2v.weight"))
    {
        t.ty = GgmlType::F16;
    }
    assert_eq!(violations(&base, &plans), Vec::<String>::new());
}

#[test]
fn gemma2_files_follow_llama_cpp_layout() {
    let base = tiny_metadata(GEMMA2_ARCH);
    let plans = tiny_plans(&base, GgmlType::F32);
    assert!(plans
        .iter()
        .any(|p| p.name == "blk.1.ffn_down.weight" && p.ne == vec![96, 96]));
    assert!(plans
        .iter()
        .any(|p| p.name == "blk.1.ffn_gate.weight" && p.ne == vec![96, 96]));
    assert_eq!(violations(&base, &plans), Vec::<String>::new());
    let mut m = base.clone();
    m.push((
        format!("{GEMMA2_ARCH}.{}", suffix::SPARK_FFN_K),
        Value::U32(3),
    ));
    assert_eq!(
        violations(&m, &plans),
        ["gemma2.spark.ffn_k: is a Spark key in a dense gemma2 file"]
    );
}
