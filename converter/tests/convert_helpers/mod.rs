//! Shared by the converter's integration tests: a tiny Spark config, a SentencePiece model
//! writer, deterministic weights, and a small valid checkpoint written as a stored `.npz`.

// Each test crate uses a different part of this module.
#![allow(dead_code)]

use std::path::Path;

use spark_convert::checkpoint::{layer_entry, EMBEDDING_ENTRY, FINAL_NORM_ENTRY};
use spark_convert::npy;
use spark_convert::tokenizer::{synthetic_vocab, Vocab};
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipWriter};

/// The tiny checkpoint's dimensions (a valid Spark config: SPEC section 2).
pub const VOCAB: usize = 260;
pub const D: usize = 16;
pub const LAYERS: u64 = 2;
pub const HEADS: usize = 2;
pub const KV_HEADS: usize = 1;
pub const HEAD_DIM: usize = 8;
pub const FF: usize = 32;
pub const FFN_R: usize = 8;

/// The config JSON of the tiny checkpoint, with `"dtype"` when given.
pub fn config_json(dtype: Option<&str>) -> String {
    let dtype = dtype.map_or(String::new(), |d| format!(", \"dtype\": \"{d}\""));
    format!(
        "{{\"vocab_size\": {VOCAB}, \"d_model\": {D}, \"n_layers\": {LAYERS}, \"n_heads\": {HEADS}, \
         \"n_kv_heads\": {KV_HEADS}, \"head_dim\": {HEAD_DIM}, \"d_ff\": {FF}, \"ffn_k\": 4, \
         \"ffn_r\": {FFN_R}, \"attn_k\": 2, \"attn_r\": 4, \"rms_norm_eps\": 1e-6, \
         \"rope_theta\": 10000.0, \"query_pre_attn_scalar\": 8, \"attn_logit_softcap\": 50.0, \
         \"final_logit_softcap\": 30.0, \"sliding_window\": 4, \"max_position_embeddings\": 64, \
         \"bos_id\": 2, \"eos_id\": 1, \"pad_id\": 0, \"unk_id\": 3{dtype}}}"
    )
}

/// A SentencePiece `ModelProto` holding `vocab`'s pieces (field 1: piece, score, type).
pub fn sentencepiece(vocab: &Vocab) -> Vec<u8> {
    fn varint(mut v: u64, out: &mut Vec<u8>) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    let mut m = Vec::new();
    for i in 0..vocab.len() {
        let mut p = Vec::new();
        varint(1 << 3 | 2, &mut p);
        varint(vocab.tokens[i].len() as u64, &mut p);
        p.extend_from_slice(vocab.tokens[i].as_bytes());
        varint(2 << 3 | 5, &mut p);
        p.extend_from_slice(&vocab.scores[i].to_le_bytes());
        varint(3 << 3, &mut p);
        varint(vocab.types[i] as u64, &mut p);
        varint(1 << 3 | 2, &mut m);
        varint(p.len() as u64, &mut m);
        m.extend_from_slice(&p);
    }
    m
}

/// Deterministic weights in [-0.5, 0.5).
pub struct Weights(pub u64);

impl Weights {
    pub fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    }
}

/// A 1-d uint8 `.npy` array holding `bytes`.
pub fn npy_u8(bytes: &[u8]) -> Vec<u8> {
    let mut v = npy::header("|u1", &[bytes.len()]);
    v.extend_from_slice(bytes);
    v
}

/// A 0-d unicode `.npy` array holding `text` (what `np.savez(name=text)` writes).
pub fn npy_unicode(text: &str) -> Vec<u8> {
    let n = text.chars().count().max(1);
    let mut v = npy::header(&format!("<U{n}"), &[]);
    for c in text.chars() {
        v.extend_from_slice(&(c as u32).to_le_bytes());
    }
    if text.is_empty() {
        v.extend_from_slice(&[0; 4]);
    }
    v
}

/// The members of a valid float32 Spark checkpoint with the `config` (1-d uint8) and
/// `tokenizer` entries, all layers with a fused `spark_in`.
pub fn checkpoint_members() -> Vec<(String, Vec<u8>)> {
    let mut w = Weights(0x2545_f491_4f6c_dd1d);
    let mut array = |shape: &[usize]| -> Vec<u8> {
        let n: usize = shape.iter().product();
        let mut v = npy::header("<f4", shape);
        for _ in 0..n {
            v.extend_from_slice(&w.next().to_le_bytes());
        }
        v
    };
    let mut m = vec![
        ("config".to_string(), npy_u8(config_json(None).as_bytes())),
        (
            "tokenizer".to_string(),
            npy_u8(&sentencepiece(&synthetic_vocab(VOCAB).unwrap())),
        ),
        (EMBEDDING_ENTRY.to_string(), array(&[VOCAB, D])),
        (FINAL_NORM_ENTRY.to_string(), array(&[D])),
    ];
    for l in 0..LAYERS {
        for (what, shape) in [
            ("pre_attention_norm/scale", vec![D]),
            ("attn/q_einsum/w", vec![HEADS, D, HEAD_DIM]),
            ("attn/kv_einsum/w", vec![2, KV_HEADS, D, HEAD_DIM]),
            ("attn/attn_vec_einsum/w", vec![HEADS, HEAD_DIM, D]),
            ("post_attention_norm/scale", vec![D]),
            ("pre_ffw_norm/scale", vec![D]),
            ("mlp/spark_in", vec![D, FF]),
            ("mlp/linear", vec![FF, D]),
            ("post_ffw_norm/scale", vec![D]),
        ] {
            let a = array(&shape);
            m.push((layer_entry(l, what), a));
        }
    }
    m
}

/// Writes `members` as a stored `.npz` at `path` (each member named `NAME.npy`).
pub fn write_npz(path: &Path, members: &[(String, Vec<u8>)]) {
    let mut z = ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (name, data) in members {
        z.start_file(
            format!("{name}.npy"),
            SimpleFileOptions::default().compression_method(CompressionMethod::Stored),
        )
        .unwrap();
        std::io::Write::write_all(&mut z, data).unwrap();
    }
    std::fs::write(path, z.finish().unwrap().into_inner()).unwrap();
}
