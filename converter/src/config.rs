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

/// The config object, read key by key: every error names its key, and the keys asked for are
/// recorded so that the others can be reported as ignored.
struct Fields<'a> {
    obj: &'a Map<String, Json>,
    asked: Vec<&'static str>,
}

impl<'a> Fields<'a> {
    /// The value of `key`; `None` when it is absent, or null and `null_is_absent`.
    fn get(&mut self, key: &'static str, null_is_absent: bool) -> Option<&'a Json> {
        self.asked.push(key);
        self.obj
            .get(key)
            .filter(|v| !(null_is_absent && v.is_null()))
    }

    /// A non-negative 32-bit integer; `None` when absent or null.
    fn opt_uint(&mut self, key: &'static str) -> Result<Option<u32>> {
        let Some(v) = self.get(key, true) else {
            return Ok(None);
        };
        let n = v.as_u64().ok_or_else(|| {
            Error::Config(format!("'{key}' must be a non-negative integer, got {v}"))
        })?;
        let n = u32::try_from(n)
            .map_err(|_| Error::Config(format!("'{key}' = {n} does not fit in 32 bits")))?;
        Ok(Some(n))
    }

    /// A finite f32; `None` when absent, or null and `null_is_absent`.
    fn opt_float(&mut self, key: &'static str, null_is_absent: bool) -> Result<Option<f32>> {
        let Some(v) = self.get(key, null_is_absent) else {
            return Ok(None);
        };
        let x = v
            .as_f64()
            .ok_or_else(|| Error::Config(format!("'{key}' must be a number, got {v}")))?;
        if !x.is_finite() || !(x as f32).is_finite() {
            return Err(Error::Config(format!("'{key}' = {x} is not a finite f32")));
        }
        Ok(Some(x as f32))
    }

    /// A required non-negative 32-bit integer.
    fn uint(&mut self, key: &'static str) -> Result<u32> {
        required(self.opt_uint(key)?, key)
    }

    /// A required positive 32-bit integer: a size.
    fn size(&mut self, key: &'static str) -> Result<u32> {
        positive(self.uint(key)?, key)
    }

    /// A required positive number (null is not a number here).
    fn positive_float(&mut self, key: &'static str) -> Result<f32> {
        positive(required(self.opt_float(key, false)?, key)?, key)
    }

    /// An optional positive number; `None` when absent or null.
    fn opt_positive_float(&mut self, key: &'static str) -> Result<Option<f32>> {
        self.opt_float(key, true)?
            .map(|x| positive(x, key))
            .transpose()
    }

    /// A required soft-cap, >= 0 with 0 = off; null means "no soft-capping", as Hugging Face
    /// configs write it.
    fn softcap(&mut self, key: &'static str) -> Result<f32> {
        if self.get(key, false).is_some_and(Json::is_null) {
            return Ok(0.0);
        }
        let v = required(self.opt_float(key, false)?, key)?;
        if v < 0.0 {
            return Err(Error::Config(format!("'{key}' must be >= 0 (0 = off)")));
        }
        Ok(v)
    }

    /// An optional string; `None` when absent or null.
    fn opt_string(&mut self, key: &'static str) -> Result<Option<String>> {
        match self.get(key, true) {
            None => Ok(None),
            Some(Json::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(Error::Config(format!("'{key}' must be a string, got {v}"))),
        }
    }

    /// The keys of the object never asked for, in the object's order.
    fn not_asked(&self) -> Vec<String> {
        self.obj
            .keys()
            .filter(|k| !self.asked.contains(&k.as_str()))
            .cloned()
            .collect()
    }
}

fn required<T>(v: Option<T>, key: &str) -> Result<T> {
    v.ok_or_else(|| Error::Config(format!("missing key '{key}'")))
}

fn positive<T: PartialOrd + Default>(v: T, key: &str) -> Result<T> {
    if v > T::default() {
        Ok(v)
    } else {
        Err(Error::Config(format!("'{key}' must be positive")))
    }
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
        let mut f = Fields {
            obj,
            asked: Vec::new(),
        };
        Ok(ModelConfig {
            vocab_size: f.size("vocab_size")?,
            d_model: f.size("d_model")?,
            n_layers: f.size("n_layers")?,
            n_heads: f.size("n_heads")?,
            n_kv_heads: f.size("n_kv_heads")?,
            head_dim: f.size("head_dim")?,
            d_ff: f.size("d_ff")?,
            ffn_k: f.opt_uint("ffn_k")?,
            ffn_r: f.opt_uint("ffn_r")?,
            attn_k: f.opt_uint("attn_k")?,
            attn_r: f.opt_uint("attn_r")?,
            rms_norm_eps: f.positive_float("rms_norm_eps")?,
            rope_theta: f.positive_float("rope_theta")?,
            query_pre_attn_scalar: f.opt_positive_float("query_pre_attn_scalar")?,
            attn_logit_softcap: f.softcap("attn_logit_softcap")?,
            final_logit_softcap: f.softcap("final_logit_softcap")?,
            sliding_window: f.uint("sliding_window")?,
            max_position_embeddings: f.size("max_position_embeddings")?,
            bos_id: f.uint("bos_id")?,
            eos_id: f.uint("eos_id")?,
            pad_id: f.uint("pad_id")?,
            unk_id: f.uint("unk_id")?,
            dtype: f.opt_string("dtype")?,
            ignored_keys: f.not_asked(),
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

/// Decodes a text entry other than `config` (the chat template): UTF-32LE for a 0-d unicode
/// array, UTF-8 for a 1-d uint8 array. Only trailing NULs are dropped (numpy's padding of a
/// unicode array), so the text reads back exactly as numpy returns it.
pub fn entry_text(entry: &str, bytes: &[u8], unicode: bool) -> Result<String> {
    let mut s = if unicode {
        let mut s = String::with_capacity(bytes.len() / 4);
        for c in bytes.chunks_exact(4) {
            let cp = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            s.push(char::from_u32(cp).ok_or_else(|| {
                Error::entry(entry, format!("holds an invalid code point {cp:#x}"))
            })?);
        }
        s
    } else {
        String::from_utf8(bytes.to_vec()).map_err(|e| {
            Error::entry(
                entry,
                format!(
                    "is not valid UTF-8 (bad byte at offset {})",
                    e.utf8_error().valid_up_to()
                ),
            )
        })?
    };
    if unicode {
        s.truncate(s.trim_end_matches('\0').len());
    }
    Ok(s)
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

    /// FULL with each `(key, JSON value)` of `changes` set, or removed where the value is "".
    fn full_with(changes: &[(&str, &str)]) -> String {
        let mut obj: Map<String, Json> = serde_json::from_str(FULL).unwrap();
        for (key, value) in changes {
            if value.is_empty() {
                obj.remove(*key);
            } else {
                obj.insert(key.to_string(), serde_json::from_str(value).unwrap());
            }
        }
        Json::Object(obj).to_string()
    }

    #[test]
    fn names_missing_and_bad_keys() {
        // (key, its JSON value or "" for none, what the error says about it)
        let cases = [
            ("d_model", "", "missing key 'd_model'"),
            ("n_heads", "-8", "must be a non-negative integer, got -8"),
            ("n_layers", "0", "'n_layers' must be positive"),
            ("d_ff", "5000000000", "= 5000000000 does not fit in 32 bits"),
            ("d_ff", "13824.5", "non-negative integer, got 13824.5"),
            ("rope_theta", "null", "must be a number, got null"),
            ("rms_norm_eps", "0", "'rms_norm_eps' must be positive"),
            ("rms_norm_eps", "1e39", "is not a finite f32"),
            ("dtype", "2", "'dtype' must be a string, got 2"),
            ("attn_logit_softcap", "-1", "must be >= 0 (0 = off)"),
            ("query_pre_attn_scalar", "0", "must be positive"),
        ];
        for (key, value, says) in cases {
            let e = ModelConfig::parse(&full_with(&[(key, value)]))
                .unwrap_err()
                .to_string();
            let named = e.starts_with(&format!("config: '{key}' "))
                || e == format!("config: missing key '{key}'");
            assert!(named && e.contains(says), "{key} = {value}: {e}");
        }
        let e = ModelConfig::parse("{\"vocab_size\": ").unwrap_err();
        assert!(e.to_string().starts_with("config: invalid JSON"), "{e}");
        assert!(ModelConfig::parse("[1]").is_err());
    }

    #[test]
    fn null_means_off_or_absent_and_unknown_keys_are_ignored() {
        let c = ModelConfig::parse(&full_with(&[
            ("attn_logit_softcap", "null"),
            ("query_pre_attn_scalar", "null"),
            ("dtype", "null"),
            ("ffn_k", ""),
            ("bogus", "1"),
        ]))
        .unwrap();
        assert_eq!(c.attn_logit_softcap, 0.0);
        assert_eq!(c.query_pre_attn_scalar, None);
        assert_eq!(c.dtype, None);
        assert_eq!(c.ignored_keys, vec!["bogus".to_string()]);
        assert_eq!(c.ffn_k, None);
        let e = c.spark_params().unwrap_err().to_string();
        assert_eq!(e, "config: missing key 'ffn_k'");
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

    #[test]
    fn entry_text_keeps_interior_nuls_and_names_the_entry() {
        let mut b = Vec::new();
        for c in "a\0b\0\0".chars() {
            b.extend_from_slice(&(c as u32).to_le_bytes());
        }
        assert_eq!(entry_text("t", &b, true).unwrap(), "a\0b");
        assert_eq!(entry_text("t", "x\0".as_bytes(), false).unwrap(), "x\0");
        let e = entry_text("t", &[b'a', 0xff], false)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("checkpoint entry 't'") && e.contains("offset 1"),
            "{e}"
        );
        let e = entry_text("t", &0xD800u32.to_le_bytes(), true)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("checkpoint entry 't'"), "{e}");
    }
}
