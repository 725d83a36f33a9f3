//! Names of the metadata keys outside any architecture's namespace.

/// Architecture name, a string (`spark-gemma2`, `gemma2`).
pub const GENERAL_ARCHITECTURE: &str = "general.architecture";
/// `general.size_label` (e.g. "2B"; optional, written by llama.cpp's converters).
pub const GENERAL_SIZE_LABEL: &str = "general.size_label";
/// Model name, a string.
pub const GENERAL_NAME: &str = "general.name";
/// Data alignment, a u32 power of two (default 32).
pub const GENERAL_ALIGNMENT: &str = "general.alignment";
/// llama.cpp file type (`LLAMA_FTYPE_*`), a u32; see [`crate::schema::file_type_for`].
pub const GENERAL_FILE_TYPE: &str = "general.file_type";
/// Quantization format version, a u32; required once any tensor is quantized.
pub const GENERAL_QUANTIZATION_VERSION: &str = "general.quantization_version";
/// Current ggml quantization version (`GGML_QNT_VERSION`).
pub const QUANTIZATION_VERSION: u32 = 2;
/// Tokenizer model, a string (`"llama"` for SentencePiece).
pub const TOKENIZER_MODEL: &str = "tokenizer.ggml.model";
/// Pre-tokenizer name, a string.
pub const TOKENIZER_PRE: &str = "tokenizer.ggml.pre";
/// Token texts, an array of strings.
pub const TOKENIZER_TOKENS: &str = "tokenizer.ggml.tokens";
/// Token scores, an array of f32.
pub const TOKENIZER_SCORES: &str = "tokenizer.ggml.scores";
/// Token types, an array of i32 (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte).
pub const TOKENIZER_TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
/// BPE merges, an array of strings.
pub const TOKENIZER_MERGES: &str = "tokenizer.ggml.merges";
/// Beginning-of-sequence token id, a u32.
pub const TOKENIZER_BOS_ID: &str = "tokenizer.ggml.bos_token_id";
/// End-of-sequence token id, a u32.
pub const TOKENIZER_EOS_ID: &str = "tokenizer.ggml.eos_token_id";
/// Padding token id, a u32.
pub const TOKENIZER_PAD_ID: &str = "tokenizer.ggml.padding_token_id";
/// Unknown token id, a u32.
pub const TOKENIZER_UNK_ID: &str = "tokenizer.ggml.unknown_token_id";
/// Separator token id, a u32.
pub const TOKENIZER_SEP_ID: &str = "tokenizer.ggml.seperator_token_id";
/// Classifier token id, a u32.
pub const TOKENIZER_CLS_ID: &str = "tokenizer.ggml.cls_token_id";
/// End-of-turn token id, a u32.
pub const TOKENIZER_EOT_ID: &str = "tokenizer.ggml.eot_token_id";
/// End-of-message token id, a u32.
pub const TOKENIZER_EOM_ID: &str = "tokenizer.ggml.eom_token_id";
/// Mask token id, a u32.
pub const TOKENIZER_MASK_ID: &str = "tokenizer.ggml.mask_token_id";
/// Whether to add BOS, a bool.
pub const TOKENIZER_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
/// Whether to add EOS, a bool.
pub const TOKENIZER_ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
/// Whether to add a space prefix, a bool.
pub const TOKENIZER_ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";
/// Chat template, a string.
pub const TOKENIZER_CHAT_TEMPLATE: &str = "tokenizer.chat_template";

/// Token type ids of `tokenizer.ggml.token_type` (llama.cpp `llama_token_type`).
pub mod token_type {
    /// Ordinary token.
    pub const NORMAL: i32 = 1;
    /// Unknown token.
    pub const UNKNOWN: i32 = 2;
    /// Control token (bos, eos, pad, ...).
    pub const CONTROL: i32 = 3;
    /// User-defined token.
    pub const USER_DEFINED: i32 = 4;
    /// Unused token.
    pub const UNUSED: i32 = 5;
    /// Byte-fallback token `<0xXX>`.
    pub const BYTE: i32 = 6;
}
