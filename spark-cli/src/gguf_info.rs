//! A metadata-only look at a GGUF file (through spark-gguf's bounds-checked reader and its
//! schema) before llama.cpp loads it: gives clear errors for missing or unreadable files and
//! tells which architecture the file is and, for Spark-Gemma2 and Gemma-2, its dimensions.

use crate::error::{CliError, Result};
use spark_gguf::keys;
use spark_gguf::schema::{Arch, Hparams, SPARK_ARCH};
use spark_gguf::GgufFile;
use std::ffi::CString;
use std::path::Path;

/// What the CLI needs to know about a model file before loading it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelInfo {
    /// [`keys::GENERAL_ARCHITECTURE`], as the file names it (any architecture llama.cpp knows).
    pub arch: String,
    /// The dimensions ([`Hparams::from_metadata_checked`]) when the
    /// architecture is one of the schema's (spark-gemma2, gemma2; [`read`] refuses such a file
    /// whose keys are missing, mistyped or out of range); `None` for other architectures, on
    /// which llama.cpp's loader has the last word.
    pub hparams: Option<Hparams>,
}

impl ModelInfo {
    /// Whether the file is a Spark-Gemma2 model.
    pub fn is_spark(&self) -> bool {
        Arch::from_name(&self.arch) == Some(SPARK_ARCH)
    }

    /// L, the block count.
    pub fn n_layer(&self) -> Option<u32> {
        self.dim(|h| h.n_layers)
    }

    /// F, the FFN width.
    pub fn n_ff(&self) -> Option<u32> {
        self.dim(|h| h.d_ff)
    }

    /// k_f, the FFN neurons kept per token (Spark-Gemma2 only).
    pub fn ffn_k(&self) -> Option<u32> {
        self.spark_dim(|h| h.ffn_k)
    }

    /// k_a, the positions kept per query (Spark-Gemma2 only).
    pub fn attn_k(&self) -> Option<u32> {
        self.spark_dim(|h| h.attn_k)
    }

    fn dim(&self, field: impl Fn(&Hparams) -> u64) -> Option<u32> {
        // The schema reads these keys as u32, so the conversion never fails.
        self.hparams
            .as_ref()
            .and_then(|h| u32::try_from(field(h)).ok())
    }

    fn spark_dim(&self, field: impl Fn(&Hparams) -> u64) -> Option<u32> {
        self.is_spark().then(|| self.dim(field)).flatten()
    }
}

/// Reads the metadata of `path`.
pub fn read(path: &Path) -> Result<ModelInfo> {
    if !path.exists() {
        return Err(CliError::new(format!(
            "model file not found: {}",
            path.display()
        )));
    }
    if !path.is_file() {
        return Err(CliError::new(format!("not a file: {}", path.display())));
    }
    let file = GgufFile::open(path).map_err(|e| {
        CliError::new(format!(
            "not a readable GGUF file: {} ({e})",
            path.display()
        ))
    })?;
    let arch = file
        .get(keys::GENERAL_ARCHITECTURE)
        .and_then(|v| v.as_str())
        .ok_or_else(|| {
            CliError::new(format!(
                "{}: no {} string",
                path.display(),
                keys::GENERAL_ARCHITECTURE
            ))
        })?
        .to_string();
    // A file of the schema's architectures is checked here, so that a hostile or damaged one
    // gets spark-gguf's named error instead of llama.cpp's assertions.
    let hparams = match Arch::from_name(&arch) {
        None => None,
        Some(a) => Some(
            Hparams::from_metadata_checked(a, |k| file.get(k)).map_err(|e| {
                CliError::new(format!(
                    "{}: not a valid {arch} file: {e} (`spark-gguf validate` lists every problem)",
                    path.display()
                ))
            })?,
        ),
    };
    if let Some((t, a, b)) = spark_gguf::validate::duplicate_token(&file) {
        return Err(CliError::new(format!(
            "{}: {}: tokens {a} and {b} are both {t:?} (llama.cpp's vocabulary loader would abort)",
            path.display(),
            keys::TOKENIZER_TOKENS
        )));
    }
    Ok(ModelInfo { arch, hparams })
}

/// A path as a C string for llama.cpp / ggml.
pub fn path_cstring(path: &Path) -> Result<CString> {
    let s = path
        .to_str()
        .ok_or_else(|| CliError::new(format!("path is not valid UTF-8: {}", path.display())))?;
    CString::new(s).map_err(|_| CliError::new(format!("path contains a NUL byte: {s:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use spark_gguf::schema::{arch_key, suffix};
    use spark_gguf::{Array, GgufWriter, Value};

    /// A GGUF with metadata only.
    fn write(dir: &Path, name: &str, metadata: &[(String, Value)]) -> std::path::PathBuf {
        let path = dir.join(name);
        GgufWriter::create(&path, true, metadata, &[], 32)
            .and_then(GgufWriter::finish)
            .expect("write the test file");
        path
    }

    fn kv(key: impl Into<String>, v: Value) -> (String, Value) {
        (key.into(), v)
    }

    /// A spark-gemma2 header with every key the schema requires.
    fn spark_metadata() -> Vec<(String, Value)> {
        let a = |s: &str| arch_key(SPARK_ARCH, s);
        let mut m = vec![kv(
            keys::GENERAL_ARCHITECTURE,
            Value::String(SPARK_ARCH.name().into()),
        )];
        for (s, v) in [
            (suffix::EMBEDDING_LENGTH, 64),
            (suffix::BLOCK_COUNT, 3),
            (suffix::HEAD_COUNT, 4),
            (suffix::HEAD_COUNT_KV, 2),
            (suffix::KEY_LENGTH, 16),
            (suffix::VALUE_LENGTH, 16),
            (suffix::FEED_FORWARD_LENGTH, 256),
            (suffix::SPARK_FFN_K, 20),
            (suffix::SPARK_FFN_R, 32),
            (suffix::SPARK_ATTN_K, 8),
            (suffix::SPARK_ATTN_R, 8),
        ] {
            m.push(kv(a(s), Value::U32(v)));
        }
        m.push(kv(
            keys::TOKENIZER_TOKENS,
            Value::Array(Array::String(vec!["a".into(), "b".into()])),
        ));
        m
    }

    #[test]
    fn spark_dimensions_come_from_the_schema() {
        let dir = tempfile::tempdir().unwrap();
        let info = read(&write(dir.path(), "s.gguf", &spark_metadata())).unwrap();
        assert!(info.is_spark());
        assert_eq!(
            (info.n_layer(), info.n_ff(), info.ffn_k(), info.attn_k()),
            (Some(3), Some(256), Some(20), Some(8))
        );
        assert_eq!(info.hparams.as_ref().unwrap().vocab, 2);
    }

    #[test]
    fn other_architectures_have_no_dimensions() {
        let dir = tempfile::tempdir().unwrap();
        let llama = [kv(
            keys::GENERAL_ARCHITECTURE,
            Value::String("llama".into()),
        )];
        let info = read(&write(dir.path(), "l.gguf", &llama)).unwrap();
        assert_eq!((info.arch.as_str(), info.is_spark()), ("llama", false));
        assert_eq!((&info.hparams, info.n_layer()), (&None, None));
    }

    #[test]
    fn spark_files_with_bad_hyperparameters_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let block_count = arch_key(SPARK_ARCH, suffix::BLOCK_COUNT);
        for (value, why) in [
            (Value::U64(3), "must have type u32 but has type u64"),
            (Value::U32(0), "must be positive, is 0"),
            (Value::U32(u32::MAX), "llama.cpp loads at most 512 layers"),
        ] {
            let mut m = spark_metadata();
            m[2] = kv(block_count.clone(), value);
            let path = write(dir.path(), "w.gguf", &m);
            let e = read(&path).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!(
                    "{}: not a valid spark-gemma2 file: metadata key '{block_count}'",
                    path.display()
                )) && e.contains(why),
                "{e}"
            );
        }
        let mut m = spark_metadata();
        m.retain(|(k, _)| !k.ends_with(suffix::SPARK_FFN_R));
        let e = read(&write(dir.path(), "r.gguf", &m))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("spark-gemma2.spark.ffn_r") && e.contains("is missing"),
            "{e}"
        );
    }

    #[test]
    fn unreadable_files_are_named_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.gguf");
        let e = read(&missing).unwrap_err().to_string();
        assert_eq!(e, format!("model file not found: {}", missing.display()));
        let e = read(dir.path()).unwrap_err().to_string();
        assert_eq!(e, format!("not a file: {}", dir.path().display()));
        let bogus = dir.path().join("bogus.gguf");
        std::fs::write(&bogus, b"definitely not a gguf file").unwrap();
        let e = read(&bogus).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("not a readable GGUF file: {} (", bogus.display())),
            "{e}"
        );
        let no_arch = write(dir.path(), "n.gguf", &[kv("x", Value::U32(1))]);
        let e = read(&no_arch).unwrap_err().to_string();
        assert_eq!(
            e,
            format!("{}: no general.architecture string", no_arch.display())
        );
    }
}
