//! What a GGUF file will hold, independent of where the weights come from: the hyperparameters,
//! the metadata (every key name and type taken from `spark_gguf::schema`), and the tensor types.

use spark_gguf::schema::{self, keys, suffix, Arch, Hparams};
use spark_gguf::{Array, GgmlType, Value, ValueType};

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::tokenizer::Vocab;

/// The `--outtype` choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutType {
    /// Every tensor f32.
    F32,
    /// Matrices f16, 1-D tensors f32.
    F16,
    /// Matrices bf16, 1-D tensors f32.
    BF16,
    /// Matrices Q8_0 (f16 where ne0 is not a multiple of 32), 1-D tensors f32.
    Q8_0,
    /// Matrices keep the checkpoint's precision, 1-D tensors f32.
    Auto,
}

impl OutType {
    /// Parses `f32|f16|bf16|q8_0|auto`.
    pub fn parse(s: &str) -> Result<OutType> {
        Ok(match s {
            "f32" => OutType::F32,
            "f16" => OutType::F16,
            "bf16" => OutType::BF16,
            "q8_0" => OutType::Q8_0,
            "auto" => OutType::Auto,
            _ => {
                return Err(Error::Usage(format!(
                    "--outtype must be f32, f16, bf16, q8_0 or auto, not '{s}'"
                )))
            }
        })
    }
}

/// The stored type of one tensor with ggml dims `ne`, as llama.cpp's converter chooses it:
/// 1-D tensors are f32; under Q8_0 a row length that is not a multiple of the block size falls
/// back to f16. `source` is the checkpoint precision (used by `auto`). The second value says
/// whether the fallback happened.
pub fn tensor_type(out: OutType, source: GgmlType, ne: &[u64]) -> (GgmlType, bool) {
    tensor_type_parts(out, source, ne, &ne[..ne.len().min(1)])
}

/// [`tensor_type`] of a tensor whose rows are parts of widths `parts` side by side (SPEC
/// section 3's `ffn_k2v`: K2's `D - r_f` values, then V's `D`): the output type when every part
/// is whole blocks of it, else the fallback a matrix whose rows are not whole blocks gets (f16
/// under Q8_0), so that each part of a row is stored as the part's own tensor would be.
pub fn tensor_type_parts(
    out: OutType,
    source: GgmlType,
    ne: &[u64],
    parts: &[u64],
) -> (GgmlType, bool) {
    if ne.len() <= 1 {
        return (GgmlType::F32, false);
    }
    match out {
        OutType::F32 => (GgmlType::F32, false),
        OutType::F16 => (GgmlType::F16, false),
        OutType::BF16 => (GgmlType::BF16, false),
        OutType::Auto => (source, false),
        OutType::Q8_0 => {
            let block = GgmlType::Q8_0.block_size();
            if parts.iter().all(|w| w.is_multiple_of(block)) {
                (GgmlType::Q8_0, false)
            } else {
                (GgmlType::F16, true)
            }
        }
    }
}

/// The note said when tensor `name` (row part widths `parts`, as [`tensor_type_parts`] took
/// them) falls back from Q8_0 to f16.
pub fn fallback_note(name: &str, parts: &[u64]) -> String {
    let block = GgmlType::Q8_0.block_size();
    match parts {
        [width] => format!(
            "{name}: row length {width} is not a multiple of {block}, stored as f16 instead of q8_0"
        ),
        _ => {
            let widths: Vec<String> = parts.iter().map(u64::to_string).collect();
            format!(
                "{name}: the parts of a row ({}) are not all multiples of {block}, stored as f16 instead of q8_0",
                widths.join(" + ")
            )
        }
    }
}

/// Which architecture a model is.
pub fn hparams(arch: Arch, cfg: &ModelConfig) -> Result<Hparams> {
    let spark = if arch.is_spark() {
        cfg.spark_params()?
    } else {
        [0; 4]
    };
    let hp = Hparams {
        arch,
        vocab: u64::from(cfg.vocab_size),
        d_model: u64::from(cfg.d_model),
        n_layers: u64::from(cfg.n_layers),
        n_heads: u64::from(cfg.n_heads),
        n_kv_heads: u64::from(cfg.n_kv_heads),
        head_dim: u64::from(cfg.head_dim),
        d_ff: u64::from(cfg.d_ff),
        ffn_k: u64::from(spark[0]),
        ffn_r: u64::from(spark[1]),
        attn_k: u64::from(spark[2]),
        attn_r: u64::from(spark[3]),
    };
    hp.validate()
        .map_err(|e| Error::Config(format!("invalid hyperparameters: {e}")))?;
    Ok(hp)
}

/// A metadata value for architecture key `suffix`, typed as the schema says.
fn arch_value(arch: Arch, suffix: &str, x: f64) -> Result<(String, Value)> {
    let spec = arch
        .keys()
        .iter()
        .find(|k| k.suffix == suffix)
        .ok_or_else(|| Error::Internal(format!("the schema of '{arch}' has no key '{suffix}'")))?;
    let v = match spec.ty {
        ValueType::U32 => Value::U32(x as u32),
        ValueType::F32 => Value::F32(x as f32),
        ValueType::U64 => Value::U64(x as u64),
        ValueType::F64 => Value::F64(x),
        ValueType::I32 => Value::I32(x as i32),
        other => {
            return Err(Error::Internal(format!(
                "key '{}' has type {}, not a number",
                spec.key(arch),
                other.name()
            )))
        }
    };
    Ok((spec.key(arch), v))
}

/// The `general.*` and architecture keys for `cfg` under `arch`.
pub fn model_metadata(
    arch: Arch,
    name: &str,
    cfg: &ModelConfig,
    hp: &Hparams,
    types: &[GgmlType],
) -> Result<Vec<(String, Value)>> {
    let file_type = schema::file_type_for(types)?;
    let mut md = vec![
        (
            keys::GENERAL_ARCHITECTURE.to_string(),
            Value::String(arch.name().to_string()),
        ),
        (
            keys::GENERAL_NAME.to_string(),
            Value::String(name.to_string()),
        ),
        (keys::GENERAL_FILE_TYPE.to_string(), Value::U32(file_type)),
        (
            keys::GENERAL_QUANTIZATION_VERSION.to_string(),
            Value::U32(keys::QUANTIZATION_VERSION),
        ),
    ];
    let mut nums: Vec<(&str, f64)> = vec![
        (
            suffix::CONTEXT_LENGTH,
            f64::from(cfg.max_position_embeddings),
        ),
        (suffix::EMBEDDING_LENGTH, hp.d_model as f64),
        (suffix::BLOCK_COUNT, hp.n_layers as f64),
        (suffix::FEED_FORWARD_LENGTH, hp.d_ff as f64),
        (suffix::HEAD_COUNT, hp.n_heads as f64),
        (suffix::HEAD_COUNT_KV, hp.n_kv_heads as f64),
        (suffix::KEY_LENGTH, hp.head_dim as f64),
        (suffix::VALUE_LENGTH, hp.head_dim as f64),
        (suffix::RMS_EPS, f64::from(cfg.rms_norm_eps)),
        (suffix::SLIDING_WINDOW, f64::from(cfg.sliding_window)),
        (
            suffix::ATTN_LOGIT_SOFTCAPPING,
            f64::from(cfg.attn_logit_softcap),
        ),
        (
            suffix::FINAL_LOGIT_SOFTCAPPING,
            f64::from(cfg.final_logit_softcap),
        ),
        (suffix::ROPE_FREQ_BASE, f64::from(cfg.rope_theta)),
    ];
    if let Some(s) = cfg.query_pre_attn_scalar {
        nums.push((suffix::ATTENTION_SCALE, 1.0 / f64::from(s).sqrt()));
    }
    if arch.is_spark() {
        nums.push((suffix::SPARK_FFN_K, hp.ffn_k as f64));
        nums.push((suffix::SPARK_FFN_R, hp.ffn_r as f64));
        nums.push((suffix::SPARK_ATTN_K, hp.attn_k as f64));
        nums.push((suffix::SPARK_ATTN_R, hp.attn_r as f64));
    }
    for (s, x) in nums {
        md.push(arch_value(arch, s, x)?);
    }
    // Every required key of the schema must now be present.
    for spec in arch.keys() {
        let key = spec.key(arch);
        if spec.required && !md.iter().any(|(k, _)| *k == key) {
            return Err(Error::Internal(format!(
                "internal: required key '{key}' was not produced"
            )));
        }
    }
    Ok(md)
}

/// The `tokenizer.*` keys for a SentencePiece vocabulary with the config's special ids
/// (`tokenizer.ggml.model = "llama"`, as llama.cpp's converter writes Gemma's).
pub fn vocab_metadata(vocab: &Vocab, cfg: &ModelConfig) -> Result<Vec<(String, Value)>> {
    check_vocab_size(vocab.len(), cfg)?;
    Ok(vec![
        (
            keys::TOKENIZER_MODEL.to_string(),
            Value::String("llama".into()),
        ),
        (
            keys::TOKENIZER_TOKENS.to_string(),
            Value::Array(Array::String(vocab.tokens.clone())),
        ),
        (
            keys::TOKENIZER_SCORES.to_string(),
            Value::Array(Array::F32(vocab.scores.clone())),
        ),
        (
            keys::TOKENIZER_TOKEN_TYPE.to_string(),
            Value::Array(Array::I32(vocab.types.clone())),
        ),
        (keys::TOKENIZER_BOS_ID.to_string(), Value::U32(cfg.bos_id)),
        (keys::TOKENIZER_EOS_ID.to_string(), Value::U32(cfg.eos_id)),
        (keys::TOKENIZER_UNK_ID.to_string(), Value::U32(cfg.unk_id)),
        (keys::TOKENIZER_PAD_ID.to_string(), Value::U32(cfg.pad_id)),
        (keys::TOKENIZER_ADD_BOS.to_string(), Value::Bool(true)),
        (keys::TOKENIZER_ADD_EOS.to_string(), Value::Bool(false)),
        (
            keys::TOKENIZER_ADD_SPACE_PREFIX.to_string(),
            Value::Bool(false),
        ),
    ])
}

/// Checks that a tokenizer of `n` tokens fits the config (count and special ids).
pub fn check_vocab_size(n: usize, cfg: &ModelConfig) -> Result<()> {
    if n != cfg.vocab_size as usize {
        return Err(Error::Tokenizer(format!(
            "has {n} tokens but the config's vocab_size is {}; they must be equal",
            cfg.vocab_size
        )));
    }
    for (key, id) in [
        ("bos_id", cfg.bos_id),
        ("eos_id", cfg.eos_id),
        ("pad_id", cfg.pad_id),
        ("unk_id", cfg.unk_id),
    ] {
        if id >= cfg.vocab_size {
            return Err(Error::Config(format!(
                "'{key}' = {id} is not below vocab_size {}",
                cfg.vocab_size
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use spark_gguf::schema::SPARK_ARCH;

    #[test]
    fn tensor_types_follow_llama_cpp() {
        assert_eq!(
            tensor_type(OutType::Q8_0, GgmlType::F32, &[64]),
            (GgmlType::F32, false)
        );
        assert_eq!(
            tensor_type(OutType::Q8_0, GgmlType::F32, &[64, 8]),
            (GgmlType::Q8_0, false)
        );
        assert_eq!(
            tensor_type(OutType::Q8_0, GgmlType::F32, &[48, 8]),
            (GgmlType::F16, true)
        );
        assert_eq!(
            tensor_type(OutType::Auto, GgmlType::BF16, &[48, 8]),
            (GgmlType::BF16, false)
        );
        assert_eq!(
            tensor_type(OutType::Auto, GgmlType::BF16, &[48]),
            (GgmlType::F32, false)
        );
        assert_eq!(
            tensor_type(OutType::F16, GgmlType::F32, &[48, 2]),
            (GgmlType::F16, false)
        );
        assert!(OutType::parse("q4_0").is_err());
    }

    #[test]
    fn a_paired_row_needs_every_part_in_whole_blocks() {
        // K2 and V of 32 and 64: q8_0; 24 and 64 (a row of 88), or 16 and 48 (a row of 64, whole
        // blocks as a row but not as parts): f16, as K2 alone would be
        let q8 = |parts: &[u64]| {
            let ne = [parts.iter().sum::<u64>(), 8];
            tensor_type_parts(OutType::Q8_0, GgmlType::F32, &ne, parts)
        };
        assert_eq!(q8(&[32, 64]), (GgmlType::Q8_0, false));
        assert_eq!(q8(&[24, 64]), (GgmlType::F16, true));
        assert_eq!(q8(&[16, 48]), (GgmlType::F16, true));
        for out in [OutType::F32, OutType::F16, OutType::BF16] {
            let (ty, fallback) = tensor_type_parts(out, GgmlType::F32, &[88, 8], &[24, 64]);
            assert_eq!(
                (ty, fallback),
                (tensor_type(out, GgmlType::F32, &[88, 8]).0, false)
            );
        }
        assert_eq!(
            tensor_type_parts(OutType::Auto, GgmlType::BF16, &[88, 8], &[24, 64]),
            (GgmlType::BF16, false)
        );
        assert_eq!(
            fallback_note("blk.0.ffn_k2v.weight", &[16, 48]),
            "blk.0.ffn_k2v.weight: the parts of a row (16 + 48) are not all multiples of 32, stored as f16 instead of q8_0"
        );
        assert_eq!(
            fallback_note("blk.0.ffn_gate.weight", &[40]),
            "blk.0.ffn_gate.weight: row length 40 is not a multiple of 32, stored as f16 instead of q8_0"
        );
    }

    #[test]
    fn metadata_types_come_from_the_schema() {
        let text = r#"{"vocab_size": 300, "d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
            "head_dim": 16, "d_ff": 128, "ffn_k": 10, "ffn_r": 32, "attn_k": 8, "attn_r": 8,
            "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "query_pre_attn_scalar": 16,
            "attn_logit_softcap": 50.0, "final_logit_softcap": 30.0, "sliding_window": 24,
            "max_position_embeddings": 256, "bos_id": 2, "eos_id": 1, "pad_id": 0, "unk_id": 3}"#;
        let cfg = ModelConfig::parse(text).unwrap();
        let hp = hparams(SPARK_ARCH, &cfg).unwrap();
        let md =
            model_metadata(SPARK_ARCH, "t", &cfg, &hp, &[GgmlType::F32, GgmlType::Q8_0]).unwrap();
        let get = |k: &str| md.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(get("spark-gemma2.spark.ffn_r"), Some(Value::U32(32)));
        assert_eq!(
            get("spark-gemma2.attention.layer_norm_rms_epsilon"),
            Some(Value::F32(1e-6))
        );
        assert_eq!(get("spark-gemma2.attention.scale"), Some(Value::F32(0.25)));
        assert_eq!(get("general.file_type"), Some(Value::U32(7)));
        let mut bad = cfg.clone();
        bad.attn_r = Some(7);
        assert!(hparams(SPARK_ARCH, &bad)
            .unwrap_err()
            .to_string()
            .contains("attn_r"));
        let v = crate::tokenizer::synthetic_vocab(299).unwrap();
        assert!(vocab_metadata(&v, &cfg)
            .unwrap_err()
            .to_string()
            .contains("vocab_size is 300"));
    }
}
