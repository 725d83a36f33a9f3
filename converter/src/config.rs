//! The checkpoint's config JSON (SPEC section 6), parsed and checked key by key.

use serde_json::{Map, Value as Json};

use crate::error::{Error, Result};

/// The model description a checkpoint carries in its `config` entry.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// Tokens in the vocabulary (the embedding may have more rows; they are dropped).
    pub vocab_size: u32,
    /// Model width D.
    pub d_model: u32,
    /// Layers L.
    pub n_layers: u32,
    /// Query heads N.
    pub n_heads: u32,
    /// Key/value heads KV.
    pub n_kv_heads: u32,
    /// Head width H.
    pub head_dim: u32,
    /// FFN width F.
    pub d_ff: u32,
    /// k_f (Spark only).
    pub ffn_k: Option<u32>,
    /// r_f (Spark only).
    pub ffn_r: Option<u32>,
    /// k_a (Spark only).
    pub attn_k: Option<u32>,
    /// r_a (Spark only).
    pub attn_r: Option<u32>,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// RoPE base.
    pub rope_theta: f32,
    /// Query pre-attention scalar s (scale = 1/sqrt(s)); absent = the model's default.
    pub query_pre_attn_scalar: Option<f32>,
    /// Attention logit soft-cap (0 = off).
    pub attn_logit_softcap: f32,
    /// Final logit soft-cap (0 = off).
    pub final_logit_softcap: f32,
    /// Sliding window W.
    pub sliding_window: u32,
    /// Context length.
    pub max_position_embeddings: u32,
    /// Beginning-of-sequence token id.
    pub bos_id: u32,
    /// End-of-sequence token id.
    pub eos_id: u32,
    /// Padding token id.
    pub pad_id: u32,
    /// Unknown-token id.
    pub unk_id: u32,
    /// `"dtype"`, if given (`"bfloat16"` makes `|V2` arrays bfloat16).
    pub dtype: Option<String>,
    /// Keys the converter does not know; they are ignored (the caller warns about them).
    pub ignored_keys: Vec<String>,
}

/// Keys every config must have.
const REQUIRED_UINT: &[&str] = &[
    "vocab_size",
    "d_model",
    "n_layers",
    "n_heads",
    "n_kv_heads",
    "head_dim",
    "d_ff",
    "sliding_window",
    "max_position_embeddings",
    "bos_id",
    "eos_id",
    "pad_id",
    "unk_id",
];

/// Keys that must be positive.
const POSITIVE: &[&str] = &[
    "vocab_size",
    "d_model",
    "n_layers",
    "n_heads",
    "n_kv_heads",
    "head_dim",
    "d_ff",
    "max_position_embeddings",
];

const KNOWN: &[&str] = &[
    "vocab_size",
    "d_model",
    "n_layers",
    "n_heads",
    "n_kv_heads",
    "head_dim",
    "d_ff",
    "ffn_k",
    "ffn_r",
    "attn_k",
    "attn_r",
    "rms_norm_eps",
    "rope_theta",
    "query_pre_attn_scalar",
    "attn_logit_softcap",
    "final_logit_softcap",
    "sliding_window",
    "max_position_embeddings",
    "bos_id",
    "eos_id",
    "pad_id",
    "unk_id",
    "dtype",
];

fn uint(obj: &Map<String, Json>, key: &str) -> Result<Option<u32>> {
    match obj.get(key) {
        None | Some(Json::Null) => Ok(None),
        Some(v) => {
            let n = v.as_u64().ok_or_else(|| {
                Error::Config(format!("'{key}' must be a non-negative integer, got {v}"))
            })?;
            let n = u32::try_from(n)
                .map_err(|_| Error::Config(format!("'{key}' = {n} does not fit in 32 bits")))?;
            Ok(Some(n))
        }
    }
}

fn float(obj: &Map<String, Json>, key: &str) -> Result<Option<f32>> {
    match obj.get(key) {
        None => Ok(None),
        Some(v) => {
            let x = v
                .as_f64()
                .ok_or_else(|| Error::Config(format!("'{key}' must be a number, got {v}")))?;
            if !x.is_finite() || !(x as f32).is_finite() {
                return Err(Error::Config(format!("'{key}' = {x} is not a finite f32")));
            }
            Ok(Some(x as f32))
        }
    }
}

fn required<T>(v: Option<T>, key: &str) -> Result<T> {
    v.ok_or_else(|| Error::Config(format!("missing key '{key}'")))
}

impl ModelConfig {
    /// Parses the JSON text of a config. Spark keys (`ffn_k`, ...) may be absent; whether
    /// they are needed depends on the checkpoint (checked by the caller).
    pub fn parse(text: &str) -> Result<ModelConfig> {
        let json: Json =
            serde_json::from_str(text).map_err(|e| Error::Config(format!("invalid JSON: {e}")))?;
        let obj = json
            .as_object()
            .ok_or_else(|| Error::Config("must be a JSON object".to_string()))?;
        let ignored_keys = obj
            .keys()
            .filter(|k| !KNOWN.contains(&k.as_str()))
            .cloned()
            .collect();
        for key in REQUIRED_UINT {
            required(uint(obj, key)?, key)?;
        }
        for key in POSITIVE {
            if uint(obj, key)? == Some(0) {
                return Err(Error::Config(format!("'{key}' must be positive")));
            }
        }
        let softcap = |key: &str| -> Result<f32> {
            // null means "no soft-capping", as Hugging Face configs write it.
            if matches!(obj.get(key), Some(Json::Null)) {
                return Ok(0.0);
            }
            let v = required(float(obj, key)?, key)?;
            if v < 0.0 {
                return Err(Error::Config(format!("'{key}' must be >= 0 (0 = off)")));
            }
            Ok(v)
        };
        let u = |key: &str| -> Result<u32> { required(uint(obj, key)?, key) };
        let rms_norm_eps = required(float(obj, "rms_norm_eps")?, "rms_norm_eps")?;
        if rms_norm_eps <= 0.0 {
            return Err(Error::Config("'rms_norm_eps' must be positive".into()));
        }
        let rope_theta = required(float(obj, "rope_theta")?, "rope_theta")?;
        if rope_theta <= 0.0 {
            return Err(Error::Config("'rope_theta' must be positive".into()));
        }
        let query_pre_attn_scalar = match obj.get("query_pre_attn_scalar") {
            Some(Json::Null) => None,
            _ => float(obj, "query_pre_attn_scalar")?,
        };
        if query_pre_attn_scalar.is_some_and(|s| s <= 0.0) {
            return Err(Error::Config(
                "'query_pre_attn_scalar' must be positive".into(),
            ));
        }
        let dtype = match obj.get("dtype") {
            None | Some(Json::Null) => None,
            Some(Json::String(s)) => Some(s.clone()),
            Some(v) => return Err(Error::Config(format!("'dtype' must be a string, got {v}"))),
        };
        Ok(ModelConfig {
            vocab_size: u("vocab_size")?,
            d_model: u("d_model")?,
            n_layers: u("n_layers")?,
            n_heads: u("n_heads")?,
            n_kv_heads: u("n_kv_heads")?,
            head_dim: u("head_dim")?,
            d_ff: u("d_ff")?,
            ffn_k: uint(obj, "ffn_k")?,
            ffn_r: uint(obj, "ffn_r")?,
            attn_k: uint(obj, "attn_k")?,
            attn_r: uint(obj, "attn_r")?,
            rms_norm_eps,
            rope_theta,
            query_pre_attn_scalar,
            attn_logit_softcap: softcap("attn_logit_softcap")?,
            final_logit_softcap: softcap("final_logit_softcap")?,
            sliding_window: u("sliding_window")?,
            max_position_embeddings: u("max_position_embeddings")?,
            bos_id: u("bos_id")?,
            eos_id: u("eos_id")?,
            pad_id: u("pad_id")?,
            unk_id: u("unk_id")?,
            dtype,
            ignored_keys,
        })
    }

    /// The Spark parameters (k_f, r_f, k_a, r_a); a clear error naming the first one missing.
    pub fn spark_params(&self) -> Result<[u32; 4]> {
        Ok([
            required(self.ffn_k, "ffn_k")?,
            required(self.ffn_r, "ffn_r")?,
            required(self.attn_k, "attn_k")?,
            required(self.attn_r, "attn_r")?,
        ])
    }
}

/// Decodes the bytes of the `config` entry: UTF-32LE for a 0-d unicode array (trailing NULs
/// are numpy's padding), UTF-8 for a 1-d uint8 array.
pub fn config_text(bytes: &[u8], unicode: bool) -> Result<String> {
    if unicode {
        let mut s = String::with_capacity(bytes.len() / 4);
        for c in bytes.chunks_exact(4) {
            let cp = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            if cp == 0 {
                break;
            }
            s.push(
                char::from_u32(cp)
                    .ok_or_else(|| Error::entry("config", "holds an invalid code point"))?,
            );
        }
        Ok(s)
    } else {
        String::from_utf8(bytes.to_vec()).map_err(|_| Error::entry("config", "is not valid UTF-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = r#"{"vocab_size": 256000, "d_model": 2304, "n_layers": 26, "n_heads": 8, "n_kv_heads": 4,
     "head_dim": 256, "d_ff": 13824, "ffn_k": 1106, "ffn_r": 1024, "attn_k": 256, "attn_r": 128,
     "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "query_pre_attn_scalar": 256,
     "attn_logit_softcap": 50.0, "final_logit_softcap": 30.0, "sliding_window": 4096,
     "max_position_embeddings": 8192, "bos_id": 2, "eos_id": 1, "pad_id": 0, "unk_id": 3}"#;

    #[test]
    fn parses_the_spec_example() {
        let c = ModelConfig::parse(FULL).unwrap();
        assert_eq!(c.d_model, 2304);
        assert_eq!(c.spark_params().unwrap(), [1106, 1024, 256, 128]);
        assert_eq!(c.query_pre_attn_scalar, Some(256.0));
        assert_eq!((c.bos_id, c.eos_id, c.pad_id, c.unk_id), (2, 1, 0, 3));
        assert_eq!(c.rms_norm_eps, 1e-6);
        assert_eq!(c.dtype, None);
    }

    #[test]
    fn names_missing_and_bad_keys() {
        let no_d = FULL.replace("\"d_model\": 2304,", "");
        assert!(ModelConfig::parse(&no_d)
            .unwrap_err()
            .to_string()
            .contains("'d_model'"));
        let neg = FULL.replace("\"n_heads\": 8", "\"n_heads\": -8");
        assert!(ModelConfig::parse(&neg)
            .unwrap_err()
            .to_string()
            .contains("'n_heads'"));
        let zero = FULL.replace("\"n_layers\": 26", "\"n_layers\": 0");
        assert!(ModelConfig::parse(&zero)
            .unwrap_err()
            .to_string()
            .contains("'n_layers'"));
        let extra = FULL.replace("\"unk_id\": 3", "\"unk_id\": 3, \"bogus\": 1");
        assert_eq!(
            ModelConfig::parse(&extra).unwrap().ignored_keys,
            vec!["bogus".to_string()]
        );
        assert!(ModelConfig::parse("{\"vocab_size\": ")
            .unwrap_err()
            .to_string()
            .contains("invalid JSON"));
        assert!(ModelConfig::parse("[1]").is_err());
        let no_k = FULL.replace("\"ffn_k\": 1106,", "");
        let c = ModelConfig::parse(&no_k).unwrap();
        assert!(c
            .spark_params()
            .unwrap_err()
            .to_string()
            .contains("'ffn_k'"));
        let big = FULL.replace("\"d_ff\": 13824", "\"d_ff\": 5000000000");
        assert!(ModelConfig::parse(&big)
            .unwrap_err()
            .to_string()
            .contains("'d_ff'"));
        let float_int = FULL.replace("\"d_ff\": 13824", "\"d_ff\": 13824.5");
        assert!(ModelConfig::parse(&float_int)
            .unwrap_err()
            .to_string()
            .contains("'d_ff'"));
    }

    #[test]
    fn decodes_unicode_and_utf8_entries() {
        let mut b = Vec::new();
        for c in "{\"a\": \"é\"}".chars() {
            b.extend_from_slice(&(c as u32).to_le_bytes());
        }
        b.extend_from_slice(&[0; 8]);
        assert_eq!(config_text(&b, true).unwrap(), "{\"a\": \"é\"}");
        assert_eq!(config_text("{}".as_bytes(), false).unwrap(), "{}");
        assert!(config_text(&[0xff, 0xfe], false).is_err());
    }
}
