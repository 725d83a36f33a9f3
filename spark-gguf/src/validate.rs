//! Checks a parsed GGUF file against the rules llama.cpp enforces and, for `spark-gemma2` and
//! `gemma2` files, against the Spark schema.

use std::collections::HashMap;

use crate::reader::GgufFile;
use crate::schema::{check_row_parts, Arch, Hparams, Layout, TensorSpec, GEMMA2_ARCH, SPARK_ARCH};
use crate::writer::MAX_TENSOR_NAME_BYTES;
use crate::{keys, Array, Value, ValueType};

/// One rule a file breaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The key or tensor concerned (or `"file"`).
    pub what: String,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.what, self.message)
    }
}

/// Expected type of a key that is not in an architecture table: scalars by `ValueType`, arrays
/// by their element type.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Expect {
    Scalar(ValueType),
    ArrayOf(ValueType),
}

impl Expect {
    fn name(self) -> String {
        match self {
            Expect::Scalar(t) => t.name().to_string(),
            Expect::ArrayOf(t) => format!("arr[{}]", t.name()),
        }
    }

    fn matches(self, v: &Value) -> bool {
        match (self, v) {
            (Expect::ArrayOf(t), Value::Array(a)) => a.elem_type() == t,
            (Expect::Scalar(t), v) => v.value_type() == t,
            _ => false,
        }
    }
}

const GLOBAL_KEYS: &[(&str, Expect)] = &[
    (
        keys::GENERAL_ARCHITECTURE,
        Expect::Scalar(ValueType::String),
    ),
    (keys::GENERAL_NAME, Expect::Scalar(ValueType::String)),
    (keys::GENERAL_ALIGNMENT, Expect::Scalar(ValueType::U32)),
    (keys::GENERAL_FILE_TYPE, Expect::Scalar(ValueType::U32)),
    (
        keys::GENERAL_QUANTIZATION_VERSION,
        Expect::Scalar(ValueType::U32),
    ),
    (keys::TOKENIZER_MODEL, Expect::Scalar(ValueType::String)),
    (keys::TOKENIZER_PRE, Expect::Scalar(ValueType::String)),
    (keys::TOKENIZER_TOKENS, Expect::ArrayOf(ValueType::String)),
    (keys::TOKENIZER_SCORES, Expect::ArrayOf(ValueType::F32)),
    (keys::TOKENIZER_TOKEN_TYPE, Expect::ArrayOf(ValueType::I32)),
    (keys::TOKENIZER_MERGES, Expect::ArrayOf(ValueType::String)),
    (keys::TOKENIZER_BOS_ID, Expect::Scalar(ValueType::U32)),
    (keys::TOKENIZER_EOS_ID, Expect::Scalar(ValueType::U32)),
    (keys::TOKENIZER_PAD_ID, Expect::Scalar(ValueType::U32)),
    (keys::TOKENIZER_UNK_ID, Expect::Scalar(ValueType::U32)),
    (keys::TOKENIZER_SEP_ID, Expect::Scalar(ValueType::U32)),
    (keys::TOKENIZER_CLS_ID, Expect::Scalar(ValueType::U32)),
    (keys::TOKENIZER_MASK_ID, Expect::Scalar(ValueType::U32)),
    (keys::TOKENIZER_EOT_ID, Expect::Scalar(ValueType::U32)),
    (keys::TOKENIZER_EOM_ID, Expect::Scalar(ValueType::U32)),
    (keys::TOKENIZER_ADD_BOS, Expect::Scalar(ValueType::Bool)),
    (keys::TOKENIZER_ADD_EOS, Expect::Scalar(ValueType::Bool)),
    (
        keys::TOKENIZER_ADD_SPACE_PREFIX,
        Expect::Scalar(ValueType::Bool),
    ),
    (
        keys::TOKENIZER_CHAT_TEMPLATE,
        Expect::Scalar(ValueType::String),
    ),
];

const SPECIAL_ID_KEYS: &[&str] = &[
    keys::TOKENIZER_BOS_ID,
    keys::TOKENIZER_EOS_ID,
    keys::TOKENIZER_PAD_ID,
    keys::TOKENIZER_UNK_ID,
    keys::TOKENIZER_SEP_ID,
    keys::TOKENIZER_CLS_ID,
    keys::TOKENIZER_MASK_ID,
    keys::TOKENIZER_EOT_ID,
    keys::TOKENIZER_EOM_ID,
];

struct Report(Vec<Violation>);

impl Report {
    fn add(&mut self, what: impl Into<String>, message: impl Into<String>) {
        self.0.push(Violation {
            what: what.into(),
            message: message.into(),
        });
    }
}

/// Every violation in `file`, in a stable order (layout, metadata types, tokenizer, schema).
/// An empty list means llama.cpp's GGUF loader and the Spark schema accept the file.
pub fn validate(file: &GgufFile) -> Vec<Violation> {
    let mut r = Report(Vec::new());
    check_layout(file, &mut r);
    check_metadata_types(file, &mut r);
    check_tokenizer(file, &mut r);
    check_schema(file, &mut r);
    r.0
}

fn check_layout(file: &GgufFile, r: &mut Report) {
    let align = file.alignment();
    let mut expected = 0u64;
    for t in file.tensors() {
        if t.name.len() > MAX_TENSOR_NAME_BYTES {
            r.add(
                &t.name,
                format!(
                    "name is {} bytes, llama.cpp allows at most {MAX_TENSOR_NAME_BYTES}",
                    t.name.len()
                ),
            );
        }
        if t.offset != expected {
            r.add(
                &t.name,
                format!(
                    "data offset is {}, expected {expected} (offsets must be the running sum of padded sizes in tensor-info order)",
                    t.offset
                ),
            );
        }
        expected = t.offset.saturating_add(t.n_bytes.next_multiple_of(align));
    }
    if let Some(last) = file.tensors().last() {
        let end = file.data_offset().saturating_add(
            last.offset
                .saturating_add(last.n_bytes.next_multiple_of(align)),
        );
        if file.file_size() < end {
            r.add(
                &last.name,
                format!(
                    "the file ends {} bytes before the alignment padding after this last tensor ends",
                    end - file.file_size()
                ),
            );
        }
    }
    if file.tensors().iter().any(|t| t.ty.is_quantized())
        && file.get(keys::GENERAL_QUANTIZATION_VERSION).is_none()
    {
        let q = file
            .tensors()
            .iter()
            .find(|t| t.ty.is_quantized())
            .map(|t| t.name.as_str())
            .unwrap_or("");
        r.add(
            keys::GENERAL_QUANTIZATION_VERSION,
            format!("is missing but tensor '{q}' is quantized"),
        );
    }
}

fn expected_type(key: &str, arch: Option<&str>) -> Option<Expect> {
    if let Some((_, e)) = GLOBAL_KEYS.iter().find(|(k, _)| *k == key) {
        return Some(*e);
    }
    // Architecture keys: the Spark table's suffixes, under whatever architecture the file names.
    let arch = arch?;
    let suffix = key.strip_prefix(arch)?.strip_prefix('.')?;
    SPARK_ARCH
        .keys()
        .iter()
        .find(|s| s.suffix == suffix)
        .map(|s| Expect::Scalar(s.ty))
}

fn check_metadata_types(file: &GgufFile, r: &mut Report) {
    let arch = match file.get(keys::GENERAL_ARCHITECTURE) {
        None => {
            r.add(
                keys::GENERAL_ARCHITECTURE,
                "is missing (llama.cpp needs it to pick a model loader)",
            );
            None
        }
        Some(Value::String(s)) => Some(s.as_str()),
        Some(_) => None,
    };
    for (key, value) in file.metadata() {
        if let Some(e) = expected_type(key, arch) {
            if !e.matches(value) {
                r.add(
                    key,
                    format!(
                        "must have type {} but has type {}",
                        e.name(),
                        value.type_name()
                    ),
                );
            }
        }
    }
    if let Some(Value::U32(v)) = file.get(keys::GENERAL_QUANTIZATION_VERSION) {
        if *v != keys::QUANTIZATION_VERSION {
            r.add(
                keys::GENERAL_QUANTIZATION_VERSION,
                format!(
                    "is {v}, llama.cpp writes and expects {}",
                    keys::QUANTIZATION_VERSION
                ),
            );
        }
    }
}

/// The first token string that appears twice in `tokenizer.ggml.tokens`, as (string, first
/// id, second id): llama.cpp's vocabulary loader asserts that every token string is distinct
/// (`id_to_token.size() == token_to_id.size()` in llama-vocab.cpp), so such a file aborts it.
pub fn duplicate_token(file: &GgufFile) -> Option<(String, usize, usize)> {
    let Some(Value::Array(Array::String(tokens))) = file.get(keys::TOKENIZER_TOKENS) else {
        return None;
    };
    let mut seen: HashMap<&str, usize> = HashMap::with_capacity(tokens.len());
    for (id, t) in tokens.iter().enumerate() {
        if let Some(&first) = seen.get(t.as_str()) {
            return Some((t.clone(), first, id));
        }
        seen.insert(t, id);
    }
    None
}

fn check_tokenizer(file: &GgufFile, r: &mut Report) {
    let Some(Value::Array(Array::String(tokens))) = file.get(keys::TOKENIZER_TOKENS) else {
        return;
    };
    if let Some((t, a, b)) = duplicate_token(file) {
        r.add(
            keys::TOKENIZER_TOKENS,
            format!("tokens {a} and {b} are both {t:?} (llama.cpp's vocabulary loader asserts every token is distinct)"),
        );
    }
    let n = tokens.len();
    for key in [keys::TOKENIZER_SCORES, keys::TOKENIZER_TOKEN_TYPE] {
        if let Some(Value::Array(a)) = file.get(key) {
            if a.len() != n {
                r.add(
                    key,
                    format!(
                        "has {} entries but {} has {n}",
                        a.len(),
                        keys::TOKENIZER_TOKENS
                    ),
                );
            }
        }
    }
    for key in SPECIAL_ID_KEYS {
        if let Some(Value::U32(id)) = file.get(key) {
            if *id as usize >= n {
                r.add(
                    *key,
                    format!("token id {id} is outside the vocabulary of {n} tokens"),
                );
            }
        }
    }
    if let Some(Value::String(model)) = file.get(keys::TOKENIZER_MODEL) {
        if model == "llama" {
            let present: std::collections::HashSet<&str> =
                tokens.iter().map(String::as_str).collect();
            let missing: Vec<String> = (0..=255u8)
                .map(|b| format!("<0x{b:02X}>"))
                .filter(|t| !present.contains(t.as_str()))
                .collect();
            if !missing.is_empty() {
                r.add(
                    keys::TOKENIZER_TOKENS,
                    format!(
                        "SentencePiece ('llama') vocabulary lacks {} byte-fallback tokens (first: {}); llama.cpp can fail to tokenize unknown bytes",
                        missing.len(),
                        missing[0]
                    ),
                );
            }
        }
    }
}

fn check_schema(file: &GgufFile, r: &mut Report) {
    let Some(Value::String(arch)) = file.get(keys::GENERAL_ARCHITECTURE) else {
        return;
    };
    let Some(arch) = Arch::from_name(arch) else {
        return;
    };
    let mut key_problem = false;
    for s in arch.keys() {
        let key = s.key(arch);
        match file.get(&key) {
            None if s.required => {
                r.add(
                    &key,
                    format!("is missing (required by {arch}, type {})", s.ty.name()),
                );
                key_problem = true;
            }
            Some(v) if v.value_type() != s.ty => key_problem = true, // reported by the type check
            _ => {}
        }
    }
    if arch == GEMMA2_ARCH {
        for s in SPARK_ARCH
            .keys()
            .iter()
            .filter(|s| s.suffix.starts_with("spark."))
        {
            let key = s.key(arch);
            if file.get(&key).is_some() {
                r.add(
                    &key,
                    format!("is a Spark key in a dense {GEMMA2_ARCH} file"),
                );
            }
        }
    }
    if file.get(keys::TOKENIZER_MODEL).is_none() {
        r.add(
            keys::TOKENIZER_MODEL,
            format!("is missing (required by {arch})"),
        );
    }
    if key_problem {
        return;
    }
    let hp = match Hparams::from_metadata_checked(arch, |k| file.get(k)) {
        Ok(hp) => hp,
        Err(e) => {
            r.add(error_subject(&e), error_message(&e));
            return;
        }
    };
    let present = by_name(file);
    // a file with Wq, Wk, Wv stacked (attn_qkv), or K2 and V paired (ffn_k2v), is checked
    // against that layout (llama.cpp loads either of each); every other file against the default
    let specs = arch.tensors_with(layout_of(file));
    let expected = hp.expected_tensors_in(specs);
    for (name, shape) in &expected {
        match present.get(name.as_str()) {
            None => r.add(name, format!("is missing (expected shape {shape:?})")),
            Some(t) if !same_shape(&t.ne, shape) => {
                r.add(name, format!("has shape {:?}, expected {shape:?}", t.ne))
            }
            Some(_) => {}
        }
    }
    let expected_names: std::collections::HashSet<&str> =
        expected.iter().map(|(n, _)| n.as_str()).collect();
    for t in file.tensors() {
        if !expected_names.contains(t.name.as_str()) {
            r.add(
                &t.name,
                format!("is not a tensor of {arch} (llama.cpp refuses files with extra tensors)"),
            );
        }
    }
    check_row_parts_of(&hp, specs, &present, r);
}

/// The layout of `file` (which of SPEC section 3's forms its tensors have), as [`validate`]
/// infers it: layer 0's `attn_qkv` and `ffn_k2v` decide.
pub fn layout_of(file: &GgufFile) -> Layout {
    Layout::infer(|n| file.tensor(n).is_some())
}

/// The violations of SPEC section 3's rule for tensors made of row parts (`ffn_k2v`: each part
/// of a row whole blocks of the tensor's type) in `file`, alone: what a tool that re-types a
/// file's tensors (`spark quantize`) checks its output against. Empty for a file whose
/// architecture or dimensions the schema cannot read (the full [`validate`] reports those).
pub fn row_part_violations(file: &GgufFile) -> Vec<Violation> {
    let mut r = Report(Vec::new());
    let Some(Value::String(arch)) = file.get(keys::GENERAL_ARCHITECTURE) else {
        return r.0;
    };
    let Some(arch) = Arch::from_name(arch) else {
        return r.0;
    };
    let Ok(hp) = Hparams::from_metadata(arch, |k| file.get(k)) else {
        return r.0;
    };
    check_row_parts_of(
        &hp,
        arch.tensors_with(layout_of(file)),
        &by_name(file),
        &mut r,
    );
    r.0
}

/// `file`'s tensors by name.
fn by_name(file: &GgufFile) -> HashMap<&str, &crate::TensorInfo> {
    file.tensors()
        .iter()
        .map(|t| (t.name.as_str(), t))
        .collect()
}

/// For each tensor of `specs` made of row parts that `present` holds with rows of the expected
/// width: its type makes each part whole blocks.
fn check_row_parts_of(
    hp: &Hparams,
    specs: &[TensorSpec],
    present: &HashMap<&str, &crate::TensorInfo>,
    r: &mut Report,
) {
    for spec in specs.iter().filter(|s| !s.kind.row_parts().is_empty()) {
        let parts = hp.row_parts(spec.kind);
        let width: u64 = parts.iter().map(|(_, w)| w).sum();
        let layers = if spec.per_layer() { hp.n_layers } else { 1 };
        for l in 0..layers {
            let name = spec.name_for(l);
            // a tensor of another row width is reported by the shape check
            if let Some(t) = present
                .get(name.as_str())
                .filter(|t| t.ne.first() == Some(&width))
            {
                if let Err(e) = check_row_parts(t.ty, &parts) {
                    r.add(name, e);
                }
            }
        }
    }
}

/// Shapes compared as llama.cpp does: padded with 1s to four dimensions, so `[D]` equals `[D, 1]`.
fn same_shape(a: &[u64], b: &[u64]) -> bool {
    let dim = |s: &[u64], i: usize| s.get(i).copied().unwrap_or(1);
    a.len() <= 4 && b.len() <= 4 && (0..4).all(|i| dim(a, i) == dim(b, i))
}

fn error_subject(e: &crate::GgufError) -> String {
    match e {
        crate::GgufError::Metadata { key, .. } => key.clone(),
        crate::GgufError::Tensor { tensor, .. } => tensor.clone(),
        _ => "file".to_string(),
    }
}

fn error_message(e: &crate::GgufError) -> String {
    match e {
        crate::GgufError::Metadata { message, .. } | crate::GgufError::Tensor { message, .. } => {
            message.clone()
        }
        other => other.to_string(),
    }
}
