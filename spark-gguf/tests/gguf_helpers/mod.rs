//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use spark_gguf::schema::{suffix, Arch, Hparams, Layout, GEMMA2_ARCH, SPARK_ARCH};
use spark_gguf::{keys, Array, GgmlType, GgufWriter, TensorPlan, Value};

/// Runs the `spark-gguf` binary: (exit code, stdout, stderr).
pub fn run(args: &[&std::ffi::OsStr]) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_spark-gguf"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// A little-endian byte image built by hand, for malformed-file tests.
#[derive(Default, Clone)]
pub struct Img(pub Vec<u8>);

impl Img {
    pub fn header(version: u32, n_tensors: u64, n_kv: u64) -> Self {
        let mut i = Img::default();
        i.raw(b"GGUF").u32(version).u64(n_tensors).u64(n_kv);
        i
    }
    pub fn raw(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.raw(&v.to_le_bytes())
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.raw(&v.to_le_bytes())
    }
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64).raw(s.as_bytes())
    }
    /// A `u32` key-value pair.
    pub fn kv_u32(&mut self, key: &str, v: u32) -> &mut Self {
        self.str(key).u32(4).u32(v)
    }
    /// A tensor info.
    pub fn tensor(&mut self, name: &str, ne: &[u64], ty: u32, offset: u64) -> &mut Self {
        self.str(name).u32(ne.len() as u32);
        for &n in ne {
            self.u64(n);
        }
        self.u32(ty).u64(offset)
    }
    /// Zero bytes up to a multiple of `a`.
    pub fn pad(&mut self, a: usize) -> &mut Self {
        let n = self.0.len().next_multiple_of(a);
        self.0.resize(n, 0);
        self
    }
    pub fn zeros(&mut self, n: usize) -> &mut Self {
        self.0.resize(self.0.len() + n, 0);
        self
    }
}

/// Writes a whole file with the writer; `data[i]` is tensor i's bytes.
pub fn write_file(
    path: &Path,
    metadata: &[(String, Value)],
    plans: &[TensorPlan],
    data: &[Vec<u8>],
    alignment: u64,
) {
    let mut w = GgufWriter::create(path, true, metadata, plans, alignment).unwrap();
    for d in data {
        w.write_tensor(d).unwrap();
    }
    w.finish().unwrap();
}

/// Deterministic pseudo-random numbers (xorshift64*).
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

pub fn tmpdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

pub fn in_dir(dir: &tempfile::TempDir, name: &str) -> PathBuf {
    dir.path().join(name)
}

/// A tiny vocabulary: specials, 256 byte-fallback tokens and a few pieces.
pub fn tiny_vocab() -> Vec<String> {
    let mut v: Vec<String> = ["<pad>", "<eos>", "<bos>", "<unk>"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    v.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
    v.extend(
        ["\u{2581}the", "\u{2581}a", "s"]
            .iter()
            .map(|s| s.to_string()),
    );
    v
}

/// Metadata for a tiny model of `arch` (`spark-gemma2` or `gemma2`).
pub fn tiny_metadata(arch: Arch) -> Vec<(String, Value)> {
    let a = |s: &str| format!("{arch}.{s}");
    let vocab = tiny_vocab();
    let n = vocab.len();
    let mut m = vec![
        (
            keys::GENERAL_ARCHITECTURE.to_string(),
            Value::String(arch.to_string()),
        ),
        (keys::GENERAL_NAME.to_string(), Value::String("tiny".into())),
        (keys::GENERAL_FILE_TYPE.to_string(), Value::U32(0)),
        (a(suffix::CONTEXT_LENGTH), Value::U32(128)),
        (a(suffix::EMBEDDING_LENGTH), Value::U32(96)),
        (a(suffix::BLOCK_COUNT), Value::U32(2)),
        (a(suffix::FEED_FORWARD_LENGTH), Value::U32(96)),
        (a(suffix::HEAD_COUNT), Value::U32(4)),
        (a(suffix::HEAD_COUNT_KV), Value::U32(2)),
        (a(suffix::KEY_LENGTH), Value::U32(16)),
        (a(suffix::VALUE_LENGTH), Value::U32(16)),
        (a(suffix::RMS_EPS), Value::F32(1e-6)),
        (a(suffix::SLIDING_WINDOW), Value::U32(32)),
        (a(suffix::ATTENTION_SCALE), Value::F32(0.25)),
        (a(suffix::ATTN_LOGIT_SOFTCAPPING), Value::F32(50.0)),
        (a(suffix::FINAL_LOGIT_SOFTCAPPING), Value::F32(30.0)),
        (a(suffix::ROPE_FREQ_BASE), Value::F32(10000.0)),
    ];
    if arch == SPARK_ARCH {
        m.extend([
            (a(suffix::SPARK_FFN_K), Value::U32(8)),
            (a(suffix::SPARK_FFN_R), Value::U32(32)),
            (a(suffix::SPARK_ATTN_K), Value::U32(8)),
            (a(suffix::SPARK_ATTN_R), Value::U32(8)),
        ]);
    }
    assert!(arch == SPARK_ARCH || arch == GEMMA2_ARCH);
    m.extend([
        (
            keys::TOKENIZER_MODEL.to_string(),
            Value::String("llama".into()),
        ),
        (
            keys::TOKENIZER_TOKENS.to_string(),
            Value::Array(Array::String(vocab)),
        ),
        (
            keys::TOKENIZER_SCORES.to_string(),
            Value::Array(Array::F32((0..n).map(|i| -(i as f32)).collect())),
        ),
        (
            keys::TOKENIZER_TOKEN_TYPE.to_string(),
            Value::Array(Array::I32(vec![1; n])),
        ),
        (keys::TOKENIZER_BOS_ID.to_string(), Value::U32(2)),
        (keys::TOKENIZER_EOS_ID.to_string(), Value::U32(1)),
        (keys::TOKENIZER_PAD_ID.to_string(), Value::U32(0)),
        (keys::TOKENIZER_UNK_ID.to_string(), Value::U32(3)),
    ]);
    m
}

/// Plans for every tensor of the tiny model, all of type `matrix_ty` except 1-D norms (F32).
pub fn tiny_plans(metadata: &[(String, Value)], matrix_ty: GgmlType) -> Vec<TensorPlan> {
    tiny_plans_in(metadata, Layout::default(), matrix_ty)
}

/// [`tiny_plans`] for a file laid out as `layout` (stacked `attn_qkv`, paired `ffn_k2v`).
pub fn tiny_plans_in(
    metadata: &[(String, Value)],
    layout: Layout,
    matrix_ty: GgmlType,
) -> Vec<TensorPlan> {
    let arch = Arch::from_gguf(metadata[0].1.as_str().unwrap()).unwrap();
    let hp = Hparams::from_metadata(arch, |k| {
        metadata.iter().find(|(kk, _)| kk == k).map(|(_, v)| v)
    })
    .unwrap();
    hp.expected_tensors_in(arch.tensors_with(layout))
        .into_iter()
        .map(|(name, ne)| TensorPlan {
            ty: if ne.len() == 1 {
                GgmlType::F32
            } else {
                matrix_ty
            },
            name,
            ne,
        })
        .collect()
}

/// Writes the tiny model with random data; returns its path.
pub fn write_tiny_model(dir: &tempfile::TempDir, arch: Arch, matrix_ty: GgmlType) -> PathBuf {
    let mut meta = tiny_metadata(arch);
    if matrix_ty.is_quantized() {
        meta.push((
            keys::GENERAL_QUANTIZATION_VERSION.into(),
            Value::U32(keys::QUANTIZATION_VERSION),
        ));
    }
    let plans = tiny_plans(&meta, matrix_ty);
    let mut rng = Rng(7);
    let path = in_dir(dir, &format!("tiny-{arch}.gguf"));
    let mut w = GgufWriter::create(&path, false, &meta, &plans, 32).unwrap();
    for p in &plans {
        let n: u64 = p.ne.iter().product();
        let vals: Vec<f32> = (0..n).map(|_| rng.f32()).collect();
        let mut bytes = Vec::new();
        spark_gguf::quant::encode_f32(p.ty, &vals, &mut bytes).unwrap();
        w.write_tensor(&bytes).unwrap();
    }
    w.finish().unwrap();
    path
}
