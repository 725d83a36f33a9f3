//! Hostile checkpoints: small real `.npz` checkpoints (one with stored members, one deflated, as
//! `numpy.savez` and `numpy.savez_compressed` write them), truncated and mutated (in the zip local
//! headers, the central directory, the NPY headers, the `config` JSON, or anywhere), then converted
//! to GGUF. The conversion must succeed or return an error that names the file or the entry; it
//! never panics; after an error the output directory is empty (no output, no temporary file);
//! after a success it holds exactly the output, a GGUF the reader opens and the validator accepts.

mod convert_helpers;

use std::ops::Range;
use std::path::{Path, PathBuf};

use convert_helpers::{
    config_json, sentencepiece, Weights, D, FF, FFN_R, HEADS, HEAD_DIM, KV_HEADS, LAYERS, VOCAB,
};

use proptest::prelude::*;
use proptest::sample::Index;
use spark_convert::checkpoint::{layer_entry, EMBEDDING_ENTRY, FINAL_NORM_ENTRY};
use spark_convert::convert::{convert, ConvertOptions, SparkOverrides};
use spark_convert::error::Error;
use spark_convert::model::OutType;
use spark_convert::npy;
use spark_convert::tokenizer::synthetic_vocab;
use spark_gguf::schema::{Hparams, SPARK_ARCH};
use spark_gguf::validate::validate;
use spark_gguf::GgufFile;
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipArchive, ZipWriter};

/// How a base checkpoint is written.
struct Flavour {
    method: CompressionMethod,
    /// Weights as float16 (`<f2`, declared in the config) instead of float32.
    f16: bool,
    /// The config as a 0-d unicode array (what `np.savez(config=json_text)` writes) instead of
    /// 1-d uint8.
    unicode_config: bool,
    outtype: OutType,
}

const FLAVOURS: [Flavour; 2] = [
    Flavour {
        method: CompressionMethod::Stored,
        f16: false,
        unicode_config: true,
        outtype: OutType::F32,
    },
    Flavour {
        method: CompressionMethod::Deflated,
        f16: true,
        unicode_config: false,
        outtype: OutType::Q8_0,
    },
];

/// The members of a valid Spark checkpoint (SPEC section 5): layer 0 stores K fused
/// (`spark_in`), layer 1 split (`spark_k1`, `spark_k2`).
fn members(fl: &Flavour) -> Vec<(String, Vec<u8>)> {
    let mut w = Weights(0x9e37_79b9_7f4a_7c15);
    let array = |w: &mut Weights, shape: &[usize]| -> Vec<u8> {
        let n: usize = shape.iter().product();
        let mut v = npy::header(if fl.f16 { "<f2" } else { "<f4" }, shape);
        for _ in 0..n {
            let x = w.next();
            if fl.f16 {
                v.extend_from_slice(&half::f16::from_f32(x).to_le_bytes());
            } else {
                v.extend_from_slice(&x.to_le_bytes());
            }
        }
        v
    };
    let json = config_json(fl.f16.then_some("float16"));
    let config = if fl.unicode_config {
        let mut v = npy::header(&format!("<U{}", json.chars().count()), &[]);
        for c in json.chars() {
            v.extend_from_slice(&(c as u32).to_le_bytes());
        }
        v
    } else {
        let mut v = npy::header("|u1", &[json.len()]);
        v.extend_from_slice(json.as_bytes());
        v
    };
    let sp = sentencepiece(&synthetic_vocab(VOCAB).unwrap());
    let mut tokenizer = npy::header("|u1", &[sp.len()]);
    tokenizer.extend_from_slice(&sp);

    let mut m = vec![
        ("config".to_string(), config),
        ("tokenizer".to_string(), tokenizer),
        (EMBEDDING_ENTRY.to_string(), array(&mut w, &[VOCAB, D])),
        (FINAL_NORM_ENTRY.to_string(), array(&mut w, &[D])),
    ];
    for l in 0..LAYERS {
        let mut add = |what: &str, shape: &[usize]| {
            let a = array(&mut w, shape);
            m.push((layer_entry(l, what), a));
        };
        add("pre_attention_norm/scale", &[D]);
        add("attn/q_einsum/w", &[HEADS, D, HEAD_DIM]);
        add("attn/kv_einsum/w", &[2, KV_HEADS, D, HEAD_DIM]);
        add("attn/attn_vec_einsum/w", &[HEADS, HEAD_DIM, D]);
        add("post_attention_norm/scale", &[D]);
        add("pre_ffw_norm/scale", &[D]);
        if l == 0 {
            add("mlp/spark_in", &[D, FF]);
        } else {
            add("mlp/spark_k1", &[FFN_R, FF]);
            add("mlp/spark_k2", &[D - FFN_R, FF]);
        }
        add("mlp/linear", &[FF, D]);
        add("post_ffw_norm/scale", &[D]);
    }
    m
}

/// Where mutations aim: anywhere, the zip local headers, the central directory (with the end
/// record), the NPY headers (for deflated members, the start of their stream), the config JSON.
const REGIONS: usize = 5;

/// A valid checkpoint's bytes, with the byte ranges of each region.
struct Base {
    bytes: Vec<u8>,
    outtype: OutType,
    regions: [Vec<Range<usize>>; REGIONS],
    /// Offsets where the zip structure changes (header, data, NPY data and directory starts).
    boundaries: Vec<usize>,
}

fn build_base(fl: &Flavour) -> Base {
    let mut z = ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (name, data) in members(fl) {
        z.start_file(
            format!("{name}.npy"),
            SimpleFileOptions::default().compression_method(fl.method),
        )
        .unwrap();
        std::io::Write::write_all(&mut z, &data).unwrap();
    }
    let bytes = z.finish().unwrap().into_inner();

    let mut archive = ZipArchive::new(std::io::Cursor::new(&bytes[..])).unwrap();
    let cd = archive.central_directory_start() as usize;
    let (mut local, mut npy_headers, mut config) = (Vec::new(), Vec::new(), Vec::new());
    let mut boundaries = vec![0, cd, bytes.len() - 22, bytes.len()];
    for i in 0..archive.len() {
        let f = archive.by_index_raw(i).unwrap();
        let (start, data) = (f.header_start() as usize, f.data_start() as usize);
        let end = data + f.compressed_size() as usize;
        boundaries.extend([start, data, end, f.central_header_start() as usize]);
        local.push(start..data);
        // A stored member's NPY header is plain; a deflated one's is the start of the stream.
        let header_end = if fl.method == CompressionMethod::Stored {
            data + npy::header_len("x", &bytes[data..end]).unwrap()
        } else {
            (data + 24).min(end)
        };
        boundaries.push(header_end);
        npy_headers.push(data..header_end);
        if f.name() == "config.npy" {
            let json_start = if fl.method == CompressionMethod::Stored {
                header_end
            } else {
                data
            };
            config.push(json_start..end);
        }
    }
    assert_eq!(config.len(), 1);
    boundaries.sort_unstable();
    boundaries.dedup();
    Base {
        regions: [
            std::iter::once(0..bytes.len()).collect(),
            local,
            std::iter::once(cd..bytes.len()).collect(),
            npy_headers,
            config,
        ],
        bytes,
        outtype: fl.outtype,
        boundaries,
    }
}

fn bases() -> &'static [Base] {
    static BASES: std::sync::OnceLock<Vec<Base>> = std::sync::OnceLock::new();
    BASES.get_or_init(|| FLAVOURS.iter().map(build_base).collect())
}

/// Whether `e` says where the problem is: the checkpoint's path, one of its entries (the config
/// and the tokenizer are entries too).
fn names_file_or_entry(e: &Error, input: &Path) -> bool {
    let msg = e.to_string();
    match e {
        Error::Io { path, .. } | Error::Archive { path, .. } => {
            *path == input.display().to_string() && msg.starts_with(path.as_str())
        }
        Error::Entry { entry, .. } => msg.starts_with(&format!("checkpoint entry '{entry}': ")),
        Error::Config(_) => msg.starts_with("config: "),
        Error::Tokenizer(_) => msg.starts_with("tokenizer: checkpoint entry 'tokenizer': "),
        _ => false,
    }
}

/// Converts `bytes` as a checkpoint and checks the outcome; `Ok(true)` when it converted.
fn check_conversion(bytes: &[u8], outtype: OutType) -> Result<bool, TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("hostile.npz");
    std::fs::write(&input, bytes).unwrap();
    let out_dir: PathBuf = dir.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let output = out_dir.join("model.gguf");
    let options = ConvertOptions {
        input: input.clone(),
        output: output.clone(),
        outtype,
        input_dtype: None,
        tokenizer: None,
        vocab_from: None,
        chat_template: None,
        overrides: SparkOverrides::default(),
        qkv: spark_gguf::schema::QkvLayout::Split,
        ffn_rows: spark_gguf::schema::FfnRowLayout::Separate,
        name: None,
        manifest: None,
        force: false,
        quiet: true,
    };
    let result = convert(&options);
    let left: Vec<String> = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    match result {
        Err(e) => {
            prop_assert!(
                names_file_or_entry(&e, &input),
                "the error names neither the file nor an entry: {e:?}"
            );
            prop_assert!(
                left.is_empty(),
                "after '{e}' the output directory holds {left:?}"
            );
            Ok(false)
        }
        Ok(()) => {
            prop_assert_eq!(left, vec!["model.gguf".to_string()]);
            let f = GgufFile::open(&output);
            prop_assert!(f.is_ok(), "the output does not read back: {:?}", f.err());
            let f = f.unwrap();
            let hp = Hparams::from_metadata(SPARK_ARCH, |k| f.get(k));
            prop_assert!(hp.is_ok(), "{:?}", hp.err());
            let names: Vec<String> = f.tensors().iter().map(|t| t.name.clone()).collect();
            let expected: Vec<String> = hp
                .unwrap()
                .expected_tensors()
                .into_iter()
                .map(|(n, _)| n)
                .collect();
            prop_assert_eq!(names, expected);
            // The converter copies token texts it does not judge (a mutated piece may no
            // longer be a byte token); everything else must satisfy the validator.
            let problems: Vec<String> = validate(&f)
                .into_iter()
                .filter(|v| !v.what.starts_with("tokenizer."))
                .map(|v| v.to_string())
                .collect();
            prop_assert!(problems.is_empty(), "{problems:?}");
            Ok(true)
        }
    }
}

#[test]
fn the_base_checkpoints_convert() {
    for base in bases() {
        assert!(check_conversion(&base.bytes, base.outtype).unwrap());
    }
}

#[test]
fn truncations_at_structure_boundaries_fail_cleanly() {
    for base in bases() {
        let mut cuts: Vec<usize> = base
            .boundaries
            .iter()
            .flat_map(|&b| [b.saturating_sub(1), b, b + 1])
            .filter(|&c| c < base.bytes.len())
            .collect();
        cuts.extend((0..base.bytes.len()).step_by(101));
        cuts.sort_unstable();
        cuts.dedup();
        for cut in cuts {
            let converted = check_conversion(&base.bytes[..cut], base.outtype)
                .unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
            assert!(!converted, "cut at {cut} converted");
        }
    }
}

/// One byte change in a region: which of its ranges, where in that range, how (set, xor, +1,
/// -1) and with which value.
type Edit = (Index, Index, u8, u8);

fn apply(base: &Base, region: usize, edits: &[Edit], bytes: &mut [u8]) {
    let ranges = &base.regions[region];
    for (range, at, op, value) in edits {
        let r = &ranges[range.index(ranges.len())];
        if r.is_empty() {
            continue;
        }
        let pos = r.start + at.index(r.len());
        bytes[pos] = match op % 4 {
            0 => *value,
            1 => bytes[pos] ^ (*value | 1),
            2 => bytes[pos].wrapping_add(1),
            _ => bytes[pos].wrapping_sub(1),
        };
    }
}

fn edits() -> impl Strategy<Value = Vec<Edit>> {
    proptest::collection::vec(any::<Edit>(), 1..5)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    /// Byte mutations aimed at one region of a stored or deflated checkpoint, optionally with a
    /// range of bytes cut out (every later offset then points elsewhere).
    #[test]
    fn mutated_checkpoints_convert_or_fail_cleanly(
        base in 0..FLAVOURS.len(),
        region in 0..REGIONS,
        edits in edits(),
        cut_out in proptest::option::weighted(0.2, (any::<Index>(), 1usize..64)),
    ) {
        let base = &bases()[base];
        let mut bytes = base.bytes.clone();
        apply(base, region, &edits, &mut bytes);
        if let Some((at, n)) = cut_out {
            let start = at.index(bytes.len());
            let end = (start + n).min(bytes.len());
            bytes.drain(start..end);
        }
        check_conversion(&bytes, base.outtype)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// Truncation at any offset, with or without mutations first: always an error.
    #[test]
    fn truncated_checkpoints_fail_cleanly(
        base in 0..FLAVOURS.len(),
        region in 0..REGIONS,
        edits in proptest::collection::vec(any::<Edit>(), 0..3),
        cut in any::<Index>(),
    ) {
        let base = &bases()[base];
        let mut bytes = base.bytes.clone();
        apply(base, region, &edits, &mut bytes);
        let cut = cut.index(bytes.len());
        prop_assert_eq!(check_conversion(&bytes[..cut], base.outtype)?, false);
    }
}
