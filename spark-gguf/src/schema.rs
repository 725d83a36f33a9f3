//! The Spark schema: the one table of keys and tensors (SPEC sections 2 and 3) shared by the
//! writer, the converter, validation and tests.

use crate::{Array, GgmlType, GgufError, Value, ValueType};

/// The most layers llama.cpp loads (`LLAMA_MAX_LAYERS` in its `src/llama-hparams.h`); its loader
/// asserts on a larger block count (patch 0014 turns that into a load error for spark-gemma2).
pub const LLAMA_MAX_LAYERS: u64 = 512;

/// The metadata key names (also at `spark_gguf::keys`).
pub use crate::keys;

/// The architectures of the schema, as llama.cpp's `llm_arch`: [`Arch::name`] is the one table
/// of their GGUF names (`general.architecture`, llama.cpp's `LLM_ARCH_NAMES`). A name read from
/// a file becomes an `Arch` through [`Arch::from_name`] or [`Arch::from_gguf`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Arch {
    /// Spark-Gemma2 (SPEC sections 2 and 3): Gemma-2 with the Spark FFN and attention.
    SparkGemma2,
    /// Dense Gemma-2, as llama.cpp's own loader reads it.
    Gemma2,
}

/// Spark-Gemma2, the architecture of Spark files.
pub const SPARK_ARCH: Arch = Arch::SparkGemma2;
/// Dense Gemma-2 (llama.cpp's own loader).
pub const GEMMA2_ARCH: Arch = Arch::Gemma2;

impl Arch {
    /// Every architecture of the schema.
    pub const ALL: [Arch; 2] = [Arch::SparkGemma2, Arch::Gemma2];

    /// The GGUF name (`general.architecture` and the prefix of the architecture keys).
    pub const fn name(self) -> &'static str {
        match self {
            Arch::SparkGemma2 => "spark-gemma2",
            Arch::Gemma2 => "gemma2",
        }
    }

    /// The architecture a file names, `None` for one the schema does not describe.
    pub fn from_name(name: &str) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.name() == name)
    }

    /// [`Arch::from_name`], with an error naming the file's architecture for others.
    pub fn from_gguf(name: &str) -> Result<Arch, GgufError> {
        Arch::from_name(name).ok_or_else(|| {
            GgufError::metadata(
                keys::GENERAL_ARCHITECTURE,
                format!("architecture '{name}' is not {SPARK_ARCH} or {GEMMA2_ARCH}"),
            )
        })
    }

    /// Whether the architecture has the Spark keys and FFN tensors.
    pub fn is_spark(self) -> bool {
        self == Arch::SparkGemma2
    }

    /// The architecture keys (SPEC section 2 for `spark-gemma2`; the same minus `spark.*` for
    /// `gemma2`).
    pub fn keys(self) -> &'static [KeySpec] {
        match self {
            Arch::SparkGemma2 => &SPARK_KEYS,
            Arch::Gemma2 => &GEMMA2_KEYS,
        }
    }

    /// The tensors, in file order (SPEC section 3 for `spark-gemma2`; llama.cpp's layout for
    /// `gemma2`), in the default [`Layout`]: Wq, Wk and Wv as three matrices
    /// ([`QkvLayout::Split`]), K2 and V as two ([`FfnRowLayout::Separate`]).
    pub fn tensors(self) -> &'static [TensorSpec] {
        self.tensors_with(Layout::default())
    }

    /// The tensors of a file laid out as `layout` ([`QkvLayout::Stacked`] and
    /// [`FfnRowLayout::Paired`] are `spark-gemma2` forms, independent of each other; `gemma2` has
    /// llama.cpp's layout whatever `layout` says: see [`Arch::supports`]).
    pub fn tensors_with(self, layout: Layout) -> &'static [TensorSpec] {
        use FfnRowLayout::{Paired, Separate};
        use QkvLayout::{Split, Stacked};
        match (self, layout.qkv, layout.ffn_rows) {
            (Arch::SparkGemma2, Split, Separate) => &SPARK_TENSORS,
            (Arch::SparkGemma2, Stacked, Separate) => &SPARK_STACKED_QKV_TENSORS,
            (Arch::SparkGemma2, Split, Paired) => &SPARK_PAIRED_K2V_TENSORS,
            (Arch::SparkGemma2, Stacked, Paired) => &SPARK_STACKED_QKV_PAIRED_K2V_TENSORS,
            (Arch::Gemma2, _, _) => &GEMMA2_TENSORS,
        }
    }

    /// Whether files of this architecture can be laid out as `layout` (`gemma2`: only the
    /// default, llama.cpp's own).
    pub fn supports(self, layout: Layout) -> bool {
        self.is_spark() || layout == Layout::default()
    }
}

/// How a file holds the attention's input matrices Wq, Wk and Wv (llama.cpp loads either).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QkvLayout {
    /// Three tensors, `attn_q`, `attn_k`, `attn_v` (llama.cpp's gemma2 layout; spark-convert's
    /// default).
    #[default]
    Split,
    /// One tensor, `attn_qkv` = [Wq; Wk; Wv] (rows): one matrix product per layer, four kernels
    /// fewer per decode layer on ggml-cuda (two per quantized product), about 4 % slower decode
    /// on the 2-core CPU it was measured on (docs/PERF.md); `spark-convert --stack-qkv`.
    Stacked,
}

/// How a file holds a Spark FFN's per-neuron rows: K2 (value weights) and V (output vector)
/// (llama.cpp loads either).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FfnRowLayout {
    /// Two tensors, `ffn_up` (K2) and `ffn_down_t` (V) (spark-convert's default).
    #[default]
    Separate,
    /// One tensor, `ffn_k2v`, whose row j is K2's row j followed by V's row j, each part in whole
    /// blocks of the tensor's type ([`TensorKind::row_parts`]): an active neuron whose rows are
    /// read from storage costs one read instead of two; `spark-convert --pair-k2v`.
    Paired,
}

/// A file's tensor layout: the two independent choices of SPEC section 3 (a file makes each
/// for all its layers; never a mix).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Layout {
    /// Wq, Wk and Wv: three matrices or one stacked.
    pub qkv: QkvLayout,
    /// K2 and V: two tensors or one paired.
    pub ffn_rows: FfnRowLayout,
}

impl Layout {
    /// The layout of the two choices.
    pub const fn new(qkv: QkvLayout, ffn_rows: FfnRowLayout) -> Self {
        Layout { qkv, ffn_rows }
    }

    /// The layout of a file, from whether it has a tensor of this name (`has`): layer 0's
    /// `attn_qkv` and `ffn_k2v` decide (a file that mixes layouts then fails the tensor-by-tensor
    /// comparison with [`Arch::tensors_with`] of this layout, as `spark-gguf validate` does it).
    pub fn infer(has: impl Fn(&str) -> bool) -> Layout {
        let qkv = if has(&TensorKind::AttnQkv.name_for(0)) {
            QkvLayout::Stacked
        } else {
            QkvLayout::Split
        };
        let ffn_rows = if has(&TensorKind::FfnK2v.name_for(0)) {
            FfnRowLayout::Paired
        } else {
            FfnRowLayout::Separate
        };
        Layout { qkv, ffn_rows }
    }
}

impl std::fmt::Display for Layout {
    /// The layout's tensors that are not the default's, e.g. `"attn_qkv stacked, ffn_k2v
    /// paired"`, or `"default"`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if self.qkv == QkvLayout::Stacked {
            parts.push(format!("{} stacked", TensorKind::AttnQkv.short_name()));
        }
        if self.ffn_rows == FfnRowLayout::Paired {
            parts.push(format!("{} paired", TensorKind::FfnK2v.short_name()));
        }
        if parts.is_empty() {
            f.write_str("default")
        } else {
            f.write_str(&parts.join(", "))
        }
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One architecture metadata key: the full key is `"{arch}.{suffix}"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeySpec {
    /// Key without the architecture prefix, e.g. `"spark.ffn_k"`.
    pub suffix: &'static str,
    /// The exact type the key must have.
    pub ty: ValueType,
    /// Whether a valid file must carry the key.
    pub required: bool,
    /// What the key means.
    pub doc: &'static str,
}

impl KeySpec {
    /// The full key name for `arch`.
    pub fn key(&self, arch: Arch) -> String {
        arch_key(arch, self.suffix)
    }
}

/// The full name of an architecture key: `"{arch}.{suffix}"`, e.g.
/// `arch_key(SPARK_ARCH, suffix::SPARK_FFN_K)` is `"spark-gemma2.spark.ffn_k"`.
pub fn arch_key(arch: Arch, suffix: &str) -> String {
    format!("{arch}.{suffix}")
}

/// Key suffixes, as constants so that code never spells them twice.
pub mod suffix {
    /// Maximum positions.
    pub const CONTEXT_LENGTH: &str = "context_length";
    /// D.
    pub const EMBEDDING_LENGTH: &str = "embedding_length";
    /// L.
    pub const BLOCK_COUNT: &str = "block_count";
    /// F.
    pub const FEED_FORWARD_LENGTH: &str = "feed_forward_length";
    /// N.
    pub const HEAD_COUNT: &str = "attention.head_count";
    /// KV.
    pub const HEAD_COUNT_KV: &str = "attention.head_count_kv";
    /// H (keys).
    pub const KEY_LENGTH: &str = "attention.key_length";
    /// H (values).
    pub const VALUE_LENGTH: &str = "attention.value_length";
    /// RMSNorm epsilon.
    pub const RMS_EPS: &str = "attention.layer_norm_rms_epsilon";
    /// W.
    pub const SLIDING_WINDOW: &str = "attention.sliding_window";
    /// Query scale.
    pub const ATTENTION_SCALE: &str = "attention.scale";
    /// c_attn.
    pub const ATTN_LOGIT_SOFTCAPPING: &str = "attn_logit_softcapping";
    /// c_final.
    pub const FINAL_LOGIT_SOFTCAPPING: &str = "final_logit_softcapping";
    /// RoPE base.
    pub const ROPE_FREQ_BASE: &str = "rope.freq_base";
    /// k_f.
    pub const SPARK_FFN_K: &str = "spark.ffn_k";
    /// r_f.
    pub const SPARK_FFN_R: &str = "spark.ffn_r";
    /// k_a.
    pub const SPARK_ATTN_K: &str = "spark.attn_k";
    /// r_a.
    pub const SPARK_ATTN_R: &str = "spark.attn_r";
    /// Optional vocabulary size (llama.cpp reads it if present).
    pub const VOCAB_SIZE: &str = "vocab_size";
}

const fn k(suffix: &'static str, ty: ValueType, required: bool, doc: &'static str) -> KeySpec {
    KeySpec {
        suffix,
        ty,
        required,
        doc,
    }
}

macro_rules! common_keys {
    ($($extra:expr,)*) => {
        [
            k(suffix::CONTEXT_LENGTH, ValueType::U32, true, "maximum positions"),
            k(suffix::EMBEDDING_LENGTH, ValueType::U32, true, "D, model width"),
            k(suffix::BLOCK_COUNT, ValueType::U32, true, "L, number of layers"),
            k(suffix::FEED_FORWARD_LENGTH, ValueType::U32, true, "F, FFN width"),
            k(suffix::HEAD_COUNT, ValueType::U32, true, "N, query heads"),
            k(suffix::HEAD_COUNT_KV, ValueType::U32, true, "KV, key/value heads"),
            k(suffix::KEY_LENGTH, ValueType::U32, true, "H, head dimension of keys"),
            k(suffix::VALUE_LENGTH, ValueType::U32, true, "H, head dimension of values"),
            k(suffix::RMS_EPS, ValueType::F32, true, "RMSNorm epsilon"),
            k(suffix::SLIDING_WINDOW, ValueType::U32, true, "W, sliding window of even layers"),
            k(suffix::ATTENTION_SCALE, ValueType::F32, false, "query scale (default 1/sqrt(H))"),
            k(suffix::ATTN_LOGIT_SOFTCAPPING, ValueType::F32, true, "c_attn, 0 = off"),
            k(suffix::FINAL_LOGIT_SOFTCAPPING, ValueType::F32, true, "c_final, 0 = off"),
            k(suffix::ROPE_FREQ_BASE, ValueType::F32, true, "RoPE base"),
            k(suffix::VOCAB_SIZE, ValueType::U32, false, "vocabulary size (optional)"),
            $($extra,)*
        ]
    };
}

static SPARK_KEYS: [KeySpec; 19] = common_keys!(
    k(
        suffix::SPARK_FFN_K,
        ValueType::U32,
        true,
        "k_f, FFN neurons kept per token"
    ),
    k(
        suffix::SPARK_FFN_R,
        ValueType::U32,
        true,
        "r_f, FFN predictor input dims"
    ),
    k(
        suffix::SPARK_ATTN_K,
        ValueType::U32,
        true,
        "k_a, positions kept per query"
    ),
    k(
        suffix::SPARK_ATTN_R,
        ValueType::U32,
        true,
        "r_a, attention predictor dims per head"
    ),
);

static GEMMA2_KEYS: [KeySpec; 15] = common_keys!();

/// A symbolic tensor dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dim {
    /// D
    Embd,
    /// vocabulary size
    Vocab,
    /// N * H
    NHeadTimesHeadDim,
    /// KV * H
    NKvTimesHeadDim,
    /// (N + 2 KV) * H: Wq, Wk and Wv stacked
    QkvTimesHeadDim,
    /// F
    Ff,
    /// r_f
    FfnR,
    /// D - r_f
    EmbdMinusFfnR,
    /// (D - r_f) + D: a K2 row and a V row side by side
    EmbdMinusFfnRPlusEmbd,
}

impl Dim {
    /// The dimension's value for `hp`.
    pub fn resolve(self, hp: &Hparams) -> u64 {
        match self {
            Dim::Embd => hp.d_model,
            Dim::Vocab => hp.vocab,
            Dim::NHeadTimesHeadDim => hp.n_heads * hp.head_dim,
            Dim::NKvTimesHeadDim => hp.n_kv_heads * hp.head_dim,
            Dim::QkvTimesHeadDim => (hp.n_heads + 2 * hp.n_kv_heads) * hp.head_dim,
            Dim::Ff => hp.d_ff,
            Dim::FfnR => hp.ffn_r,
            Dim::EmbdMinusFfnR => hp.d_model.saturating_sub(hp.ffn_r),
            Dim::EmbdMinusFfnRPlusEmbd => hp.d_model.saturating_sub(hp.ffn_r) + hp.d_model,
        }
    }
}

/// The tensor kinds of the schema's architectures, as llama.cpp's `llm_tensor`:
/// [`TensorKind::name`] is the one table of their GGUF names (llama.cpp's `LLM_TENSOR_NAMES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TensorKind {
    /// The token embedding (tied output).
    TokenEmbd,
    /// The final RMSNorm weight.
    OutputNorm,
    /// The pre-attention RMSNorm weight.
    AttnNorm,
    /// Wq.
    AttnQ,
    /// Wk.
    AttnK,
    /// Wv.
    AttnV,
    /// Wq, Wk and Wv stacked (rows of Q, then K, then V): one matrix product per layer.
    AttnQkv,
    /// Wo.
    AttnOutput,
    /// The post-attention RMSNorm weight.
    PostAttentionNorm,
    /// The pre-FFN RMSNorm weight.
    FfnNorm,
    /// Spark's K1 (predictor weights) or the dense gate projection.
    FfnGate,
    /// Spark's K2 (value weights) or the dense up projection.
    FfnUp,
    /// The dense down projection.
    FfnDown,
    /// Spark's V, neuron-major (the down projection transposed).
    FfnDownT,
    /// Spark's K2 and V side by side: row j = K2's row j, then V's row j.
    FfnK2v,
    /// The post-FFN RMSNorm weight.
    PostFfwNorm,
}

impl TensorKind {
    /// The GGUF name template; `{l}` stands for the layer index in per-layer tensors.
    pub const fn name(self) -> &'static str {
        match self {
            TensorKind::TokenEmbd => "token_embd.weight",
            TensorKind::OutputNorm => "output_norm.weight",
            TensorKind::AttnNorm => "blk.{l}.attn_norm.weight",
            TensorKind::AttnQ => "blk.{l}.attn_q.weight",
            TensorKind::AttnK => "blk.{l}.attn_k.weight",
            TensorKind::AttnV => "blk.{l}.attn_v.weight",
            TensorKind::AttnQkv => "blk.{l}.attn_qkv.weight",
            TensorKind::AttnOutput => "blk.{l}.attn_output.weight",
            TensorKind::PostAttentionNorm => "blk.{l}.post_attention_norm.weight",
            TensorKind::FfnNorm => "blk.{l}.ffn_norm.weight",
            TensorKind::FfnGate => "blk.{l}.ffn_gate.weight",
            TensorKind::FfnUp => "blk.{l}.ffn_up.weight",
            TensorKind::FfnDown => "blk.{l}.ffn_down.weight",
            TensorKind::FfnDownT => "blk.{l}.ffn_down_t.weight",
            TensorKind::FfnK2v => "blk.{l}.ffn_k2v.weight",
            TensorKind::PostFfwNorm => "blk.{l}.post_ffw_norm.weight",
        }
    }

    /// Whether the tensor exists once per layer (its name has the layer index).
    pub fn per_layer(self) -> bool {
        self.name().contains("{l}")
    }

    /// The tensor's name for layer `l` (ignored by global tensors).
    pub fn name_for(self, l: u64) -> String {
        self.name().replace("{l}", &l.to_string())
    }

    /// The name without the layer prefix and the `.weight` suffix, as messages say it
    /// (`"ffn_up"`).
    pub fn short_name(self) -> &'static str {
        let n = self.name();
        let n = n.strip_prefix("blk.{l}.").unwrap_or(n);
        n.strip_suffix(".weight").unwrap_or(n)
    }

    /// For a tensor whose every row is rows of other tensors side by side, those tensors in
    /// order: row j of `ffn_k2v` is row j of `ffn_up` (K2) followed by row j of `ffn_down_t`
    /// (V). Each part must be whole blocks of the tensor's type, so that a row's bytes are the
    /// parts' bytes in that type, concatenated. Empty for every other tensor.
    pub const fn row_parts(self) -> &'static [TensorKind] {
        match self {
            TensorKind::FfnK2v => &[TensorKind::FfnUp, TensorKind::FfnDownT],
            _ => &[],
        }
    }
}

/// One tensor of an architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorSpec {
    /// Which tensor, and so its name.
    pub kind: TensorKind,
    /// ggml dimensions (ne0 first).
    pub dims: &'static [Dim],
    /// What the tensor is.
    pub doc: &'static str,
}

impl TensorSpec {
    /// The name template ([`TensorKind::name`]).
    pub fn name(&self) -> &'static str {
        self.kind.name()
    }

    /// Whether the tensor exists once per layer.
    pub fn per_layer(&self) -> bool {
        self.kind.per_layer()
    }

    /// The tensor's name for layer `l` (ignored by global tensors).
    pub fn name_for(&self, l: u64) -> String {
        self.kind.name_for(l)
    }
}

const fn t(kind: TensorKind, dims: &'static [Dim], doc: &'static str) -> TensorSpec {
    TensorSpec { kind, dims, doc }
}

use Dim::*;
use TensorKind::*;

/// The tensor table of a Gemma-2 layout, in file order: the tensors both architectures share,
/// with the architecture's own attention input projections ($qkv: one stacked matrix or three)
/// after the pre-attention norm and its own FFN matrices ($ffn: the predictor or gate, then the
/// others) between the pre-FFN and the post-FFN norm.
macro_rules! gemma2_layout {
    ([$($qkv:expr),+], [$($ffn:expr),+ $(,)?] $(,)?) => {
        [
            t(TokenEmbd, &[Embd, Vocab], "embedding, tied output"),
            t(OutputNorm, &[Embd], "final RMSNorm weight (1 + scale)"),
            t(AttnNorm, &[Embd], "pre-attention RMSNorm (1 + scale)"),
            $($qkv,)+
            t(AttnOutput, &[NHeadTimesHeadDim, Embd], "Wo"),
            t(
                PostAttentionNorm,
                &[Embd],
                "post-attention RMSNorm (1 + scale)",
            ),
            t(FfnNorm, &[Embd], "pre-FFN RMSNorm (1 + scale)"),
            $($ffn,)+
            t(PostFfwNorm, &[Embd], "post-FFN RMSNorm (1 + scale)"),
        ]
    };
}

const WQ: TensorSpec = t(AttnQ, &[Embd, NHeadTimesHeadDim], "Wq");
const WK: TensorSpec = t(AttnK, &[Embd, NKvTimesHeadDim], "Wk");
const WV: TensorSpec = t(AttnV, &[Embd, NKvTimesHeadDim], "Wv");
const WQKV: TensorSpec = t(
    AttnQkv,
    &[Embd, QkvTimesHeadDim],
    "Wq, Wk, Wv stacked: rows of Q, then K, then V",
);
const SPARK_K1: TensorSpec = t(
    FfnGate,
    &[FfnR, Ff],
    "K1: row j = neuron j's predictor weights",
);
const SPARK_K2: TensorSpec = t(
    FfnUp,
    &[EmbdMinusFfnR, Ff],
    "K2: row j = neuron j's value weights",
);
const SPARK_V: TensorSpec = t(
    FfnDownT,
    &[Embd, Ff],
    "V, neuron-major: row j = neuron j's output",
);

const SPARK_K2V: TensorSpec = t(
    FfnK2v,
    &[EmbdMinusFfnRPlusEmbd, Ff],
    "K2 and V side by side: row j = K2's row j, then V's row j",
);

/// Spark's layout ([`Layout::default`]).
static SPARK_TENSORS: [TensorSpec; 13] =
    gemma2_layout!([WQ, WK, WV], [SPARK_K1, SPARK_K2, SPARK_V]);

/// Spark's layout with Wq, Wk and Wv stacked into one matrix, `attn_qkv`
/// ([`QkvLayout::Stacked`]).
static SPARK_STACKED_QKV_TENSORS: [TensorSpec; 11] =
    gemma2_layout!([WQKV], [SPARK_K1, SPARK_K2, SPARK_V]);

/// Spark's layout with K2 and V paired into one tensor, `ffn_k2v` ([`FfnRowLayout::Paired`]).
static SPARK_PAIRED_K2V_TENSORS: [TensorSpec; 12] =
    gemma2_layout!([WQ, WK, WV], [SPARK_K1, SPARK_K2V]);

/// Spark's layout with `attn_qkv` stacked and `ffn_k2v` paired.
static SPARK_STACKED_QKV_PAIRED_K2V_TENSORS: [TensorSpec; 10] =
    gemma2_layout!([WQKV], [SPARK_K1, SPARK_K2V]);

static GEMMA2_TENSORS: [TensorSpec; 13] = gemma2_layout!(
    [WQ, WK, WV],
    [
        t(FfnGate, &[Embd, Ff], "gate projection"),
        t(FfnUp, &[Embd, Ff], "up projection"),
        t(FfnDown, &[Ff, Embd], "down projection"),
    ],
);

/// The model dimensions that determine tensor shapes. For `gemma2` the `ffn_*`/`attn_*` Spark
/// fields are 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hparams {
    /// The architecture.
    pub arch: Arch,
    /// Vocabulary size.
    pub vocab: u64,
    /// D.
    pub d_model: u64,
    /// L.
    pub n_layers: u64,
    /// N.
    pub n_heads: u64,
    /// KV.
    pub n_kv_heads: u64,
    /// H.
    pub head_dim: u64,
    /// F.
    pub d_ff: u64,
    /// k_f.
    pub ffn_k: u64,
    /// r_f.
    pub ffn_r: u64,
    /// k_a.
    pub attn_k: u64,
    /// r_a.
    pub attn_r: u64,
}

impl Hparams {
    /// Reads the dimensions of `arch` from metadata (`get` looks a full key up). Every key must
    /// have its exact schema type. The vocabulary size is the length of `tokenizer.ggml.tokens`,
    /// or `{arch}.vocab_size` when there are no tokens; if both exist they must agree.
    pub fn from_metadata<'a>(
        arch: Arch,
        get: impl Fn(&str) -> Option<&'a Value>,
    ) -> Result<Self, GgufError> {
        let u32_key = |suffix: &str| -> Result<u64, GgufError> {
            let key = arch_key(arch, suffix);
            match get(&key) {
                Some(Value::U32(v)) => Ok(u64::from(*v)),
                Some(v) => Err(GgufError::metadata(
                    key,
                    format!("must have type u32 but has type {}", v.type_name()),
                )),
                None => Err(GgufError::metadata(key, "is missing")),
            }
        };
        let spark = arch.is_spark();
        let spark_key = |suffix: &str| if spark { u32_key(suffix) } else { Ok(0) };
        let head_dim = u32_key(suffix::KEY_LENGTH)?;
        let value_len = u32_key(suffix::VALUE_LENGTH)?;
        if value_len != head_dim {
            return Err(GgufError::metadata(
                arch_key(arch, suffix::VALUE_LENGTH),
                format!(
                    "is {value_len} but {arch}.{} is {head_dim}; they must be equal",
                    suffix::KEY_LENGTH
                ),
            ));
        }
        let vocab_key = arch_key(arch, suffix::VOCAB_SIZE);
        let declared = match get(&vocab_key) {
            None => None,
            Some(Value::U32(v)) => Some(u64::from(*v)),
            Some(v) => {
                return Err(GgufError::metadata(
                    vocab_key,
                    format!("must have type u32 but has type {}", v.type_name()),
                ))
            }
        };
        let vocab = match get(keys::TOKENIZER_TOKENS) {
            Some(Value::Array(Array::String(tokens))) => {
                let n = tokens.len() as u64;
                if let Some(d) = declared.filter(|&d| d != n) {
                    return Err(GgufError::metadata(
                        vocab_key,
                        format!("is {d} but {} has {n} tokens", keys::TOKENIZER_TOKENS),
                    ));
                }
                n
            }
            Some(v) => {
                return Err(GgufError::metadata(
                    keys::TOKENIZER_TOKENS,
                    format!("must have type arr[str] but has type {}", v.type_name()),
                ))
            }
            None => declared.ok_or_else(|| {
                GgufError::metadata(
                    keys::TOKENIZER_TOKENS,
                    format!("is missing (and so is {vocab_key})"),
                )
            })?,
        };
        Ok(Hparams {
            arch,
            vocab,
            d_model: u32_key(suffix::EMBEDDING_LENGTH)?,
            n_layers: u32_key(suffix::BLOCK_COUNT)?,
            n_heads: u32_key(suffix::HEAD_COUNT)?,
            n_kv_heads: u32_key(suffix::HEAD_COUNT_KV)?,
            head_dim,
            d_ff: u32_key(suffix::FEED_FORWARD_LENGTH)?,
            ffn_k: spark_key(suffix::SPARK_FFN_K)?,
            ffn_r: spark_key(suffix::SPARK_FFN_R)?,
            attn_k: spark_key(suffix::SPARK_ATTN_K)?,
            attn_r: spark_key(suffix::SPARK_ATTN_R)?,
        })
    }

    /// [`Hparams::from_metadata`], then [`Hparams::validate`] and [`Hparams::validate_floats`]:
    /// the dimensions of a file whose schema keys llama.cpp can load, or the first of their
    /// errors, naming the key (what `spark` and `spark-gguf validate` check before llama.cpp).
    pub fn from_metadata_checked<'a>(
        arch: Arch,
        get: impl Fn(&str) -> Option<&'a Value>,
    ) -> Result<Self, GgufError> {
        let hp = Hparams::from_metadata(arch, &get)?;
        hp.validate()?;
        Hparams::validate_floats(arch, &get)?;
        Ok(hp)
    }

    /// Checks the f32 keys of `arch` whose values ggml itself stops on (the RMSNorm epsilon:
    /// ggml's `rms_norm` asserts `eps >= 0`, false for NaN too), naming the key: a missing key
    /// is left to [`Hparams::from_metadata`]'s callers' key checks, a mistyped one to the type
    /// check.
    pub fn validate_floats<'a>(
        arch: Arch,
        get: impl Fn(&str) -> Option<&'a Value>,
    ) -> Result<(), GgufError> {
        let key = arch_key(arch, suffix::RMS_EPS);
        if let Some(Value::F32(eps)) = get(&key) {
            if !(eps.is_finite() && *eps >= 0.0) {
                return Err(GgufError::metadata(
                    key,
                    format!("is {eps}, must be finite and >= 0 (ggml's rms_norm asserts it)"),
                ));
            }
        }
        Ok(())
    }

    /// Checks SPEC section 2's validity rules, naming the offending key:
    /// all sizes positive, L <= [`LLAMA_MAX_LAYERS`], N % KV == 0, and for `spark-gemma2`
    /// 0 < r_f < D, 0 < r_a < H, r_a and H - r_a even, k_f >= 1, k_a >= 1.
    pub fn validate(&self) -> Result<(), GgufError> {
        let key = |s: &str| arch_key(self.arch, s);
        let positive = [
            (key(suffix::EMBEDDING_LENGTH), self.d_model),
            (key(suffix::BLOCK_COUNT), self.n_layers),
            (key(suffix::HEAD_COUNT), self.n_heads),
            (key(suffix::HEAD_COUNT_KV), self.n_kv_heads),
            (key(suffix::KEY_LENGTH), self.head_dim),
            (key(suffix::FEED_FORWARD_LENGTH), self.d_ff),
            (keys::TOKENIZER_TOKENS.to_string(), self.vocab),
        ];
        for (k, v) in positive {
            if v == 0 {
                return Err(GgufError::metadata(k, "must be positive, is 0"));
            }
        }
        if self.n_layers > LLAMA_MAX_LAYERS {
            return Err(GgufError::metadata(
                key(suffix::BLOCK_COUNT),
                format!(
                    "is {}, llama.cpp loads at most {LLAMA_MAX_LAYERS} layers",
                    self.n_layers
                ),
            ));
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return Err(GgufError::metadata(
                key(suffix::HEAD_COUNT_KV),
                format!(
                    "{} does not divide the head count {}",
                    self.n_kv_heads, self.n_heads
                ),
            ));
        }
        if !self.arch.is_spark() {
            return Ok(());
        }
        // 0 < value < limit, where `name` and `limit_name` are the symbols of SPEC section 2.
        let below = |s: &str, value: u64, name: &str, limit_name: &str, limit: u64| {
            if value == 0 || value >= limit {
                return Err(GgufError::metadata(
                    key(s),
                    format!("is {value}, must satisfy 0 < {name} < {limit_name} = {limit}"),
                ));
            }
            Ok(())
        };
        below(suffix::SPARK_FFN_R, self.ffn_r, "r_f", "D", self.d_model)?;
        below(suffix::SPARK_ATTN_R, self.attn_r, "r_a", "H", self.head_dim)?;
        if !self.attn_r.is_multiple_of(2) || !(self.head_dim - self.attn_r).is_multiple_of(2) {
            return Err(GgufError::metadata(
                key(suffix::SPARK_ATTN_R),
                format!(
                    "r_a = {} and H - r_a = {} must both be even (each part is rotated in pairs)",
                    self.attn_r,
                    self.head_dim - self.attn_r
                ),
            ));
        }
        if self.ffn_k == 0 {
            return Err(GgufError::metadata(
                key(suffix::SPARK_FFN_K),
                "must be at least 1, is 0",
            ));
        }
        if self.attn_k == 0 {
            return Err(GgufError::metadata(
                key(suffix::SPARK_ATTN_K),
                "must be at least 1, is 0",
            ));
        }
        Ok(())
    }

    /// Every tensor of the architecture with its ggml shape: global tensors first, then each
    /// layer's tensors in table order.
    pub fn expected_tensors(&self) -> Vec<(String, Vec<u64>)> {
        self.expected_tensors_in(self.arch.tensors())
    }

    /// The parts of a row of tensor `kind` ([`TensorKind::row_parts`]) with their widths (each
    /// part's ne0, as the default layout stores it): for `ffn_k2v`, `[(FfnUp, D - r_f),
    /// (FfnDownT, D)]`. Empty for a tensor that is not made of parts.
    pub fn row_parts(&self, kind: TensorKind) -> Vec<(TensorKind, u64)> {
        kind.row_parts()
            .iter()
            .filter_map(|&part| {
                let spec = self.arch.tensors().iter().find(|s| s.kind == part)?;
                Some((part, spec.dims.first()?.resolve(self)))
            })
            .collect()
    }

    /// [`expected_tensors`](Self::expected_tensors) of the layout `specs` (one of
    /// [`Arch::tensors_with`]'s).
    pub fn expected_tensors_in(&self, specs: &[TensorSpec]) -> Vec<(String, Vec<u64>)> {
        let shape = |s: &TensorSpec| s.dims.iter().map(|d| d.resolve(self)).collect::<Vec<u64>>();
        let mut out: Vec<(String, Vec<u64>)> = specs
            .iter()
            .filter(|s| !s.per_layer())
            .map(|s| (s.name().to_string(), shape(s)))
            .collect();
        for l in 0..self.n_layers {
            out.extend(
                specs
                    .iter()
                    .filter(|s| s.per_layer())
                    .map(|s| (s.name_for(l), shape(s))),
            );
        }
        out
    }
}

/// Checks that type `ty` stores each part of a row (`parts`, as [`Hparams::row_parts`] gives
/// them) in whole blocks, so that the row's bytes are the parts' bytes in `ty`, concatenated; the
/// error says the type, its block size and every part's width.
pub fn check_row_parts(ty: GgmlType, parts: &[(TensorKind, u64)]) -> Result<(), String> {
    let block = ty.block_size();
    if parts.iter().all(|(_, w)| w.is_multiple_of(block)) {
        return Ok(());
    }
    let widths: Vec<String> = parts
        .iter()
        .map(|(k, w)| format!("{} part {w}", k.short_name()))
        .collect();
    Err(format!(
        "type {} (blocks of {block} elements) does not make each part of a row whole blocks: {} elements",
        ty.name(),
        widths.join(", ")
    ))
}

/// The llama.cpp `LLAMA_FTYPE_*` value describing tensors stored mostly as `ty`, if llama.cpp
/// has one (for k-quants with S/M/L variants, the S variant).
pub fn ftype_of(ty: GgmlType) -> Option<u32> {
    Some(match ty {
        GgmlType::F32 => 0,
        GgmlType::F16 => 1,
        GgmlType::Q4_0 => 2,
        GgmlType::Q4_1 => 3,
        GgmlType::Q8_0 => 7,
        GgmlType::Q5_0 => 8,
        GgmlType::Q5_1 => 9,
        GgmlType::Q2_K => 10,
        GgmlType::Q3_K => 11,
        GgmlType::Q4_K => 14,
        GgmlType::Q5_K => 16,
        GgmlType::Q6_K => 18,
        GgmlType::IQ2_XXS => 19,
        GgmlType::IQ2_XS => 20,
        GgmlType::IQ3_XXS => 23,
        GgmlType::IQ1_S => 24,
        GgmlType::IQ4_NL => 25,
        GgmlType::IQ3_S => 26,
        GgmlType::IQ2_S => 28,
        GgmlType::IQ4_XS => 30,
        GgmlType::IQ1_M => 31,
        GgmlType::BF16 => 32,
        GgmlType::TQ1_0 => 36,
        GgmlType::TQ2_0 => 37,
        GgmlType::MXFP4 => 38,
        GgmlType::NVFP4 => 39,
        GgmlType::Q1_0 => 40,
        GgmlType::Q2_0 => 41,
        _ => return None,
    })
}

/// `general.file_type` for a file whose tensors have `types`: the llama.cpp file type of the most
/// frequent type other than F32 (norms stay F32 in every file type), or ALL_F32 (0) when every
/// tensor is F32. Errors on a type llama.cpp has no file type for (e.g. I32, Q8_K).
pub fn file_type_for(types: &[GgmlType]) -> Result<u32, GgufError> {
    let mut counts: Vec<(GgmlType, usize)> = Vec::new();
    for &t in types.iter().filter(|&&t| t != GgmlType::F32) {
        match counts.iter_mut().find(|(u, _)| *u == t) {
            Some((_, c)) => *c += 1,
            None => counts.push((t, 1)),
        }
    }
    // Most frequent; on a tie the one seen first.
    let mut best: Option<(GgmlType, usize)> = None;
    for &(t, c) in &counts {
        if best.is_none_or(|(_, bc)| c > bc) {
            best = Some((t, c));
        }
    }
    let ty = best.map_or(GgmlType::F32, |(t, _)| t);
    ftype_of(ty).ok_or_else(|| {
        GgufError::metadata(
            keys::GENERAL_FILE_TYPE,
            format!(
                "llama.cpp has no file type for tensors stored as {}",
                ty.name()
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gemma-2 2B's dimensions as `arch` metadata, with a vocabulary of 7 tokens.
    fn dense_meta(arch: Arch) -> Vec<(String, Value)> {
        let u = |s: &str, v: u32| (format!("{arch}.{s}"), Value::U32(v));
        vec![
            u(suffix::CONTEXT_LENGTH, 8192),
            u(suffix::EMBEDDING_LENGTH, 2304),
            u(suffix::BLOCK_COUNT, 2),
            u(suffix::FEED_FORWARD_LENGTH, 13824),
            u(suffix::HEAD_COUNT, 8),
            u(suffix::HEAD_COUNT_KV, 4),
            u(suffix::KEY_LENGTH, 256),
            u(suffix::VALUE_LENGTH, 256),
            (
                keys::TOKENIZER_TOKENS.into(),
                Value::Array(Array::String(vec!["a".into(); 7])),
            ),
        ]
    }

    /// `dense_meta` of `spark-gemma2` with the Spark parameters of SPEC section 2's example.
    fn spark_meta() -> Vec<(String, Value)> {
        let mut m = dense_meta(SPARK_ARCH);
        let spark = [
            (suffix::SPARK_FFN_K, 1106),
            (suffix::SPARK_FFN_R, 1024),
            (suffix::SPARK_ATTN_K, 256),
            (suffix::SPARK_ATTN_R, 128),
        ];
        m.extend(spark.map(|(s, v)| (format!("{SPARK_ARCH}.{s}"), Value::U32(v))));
        m
    }

    fn lookup<'a>(m: &'a [(String, Value)]) -> impl Fn(&str) -> Option<&'a Value> + 'a {
        move |k| m.iter().find(|(kk, _)| kk == k).map(|(_, v)| v)
    }

    #[test]
    fn spark_hparams_and_shapes() {
        let m = spark_meta();
        let hp = Hparams::from_metadata(SPARK_ARCH, lookup(&m)).unwrap();
        hp.validate().unwrap();
        assert_eq!(hp.vocab, 7);
        let t = hp.expected_tensors();
        assert_eq!(t.len(), 2 + 2 * 11);
        assert_eq!(t[0], ("token_embd.weight".to_string(), vec![2304, 7]));
        let find = |n: &str| t.iter().find(|(k, _)| k == n).unwrap().1.clone();
        assert_eq!(find("blk.1.ffn_gate.weight"), vec![1024, 13824]);
        assert_eq!(find("blk.1.ffn_up.weight"), vec![1280, 13824]);
        assert_eq!(find("blk.0.ffn_down_t.weight"), vec![2304, 13824]);
        assert_eq!(find("blk.0.attn_output.weight"), vec![2048, 2304]);
        assert_eq!(find("blk.0.attn_k.weight"), vec![2304, 1024]);
        // Wq, Wk, Wv stacked into one matrix
        let stacked_qkv = Layout::new(QkvLayout::Stacked, FfnRowLayout::Separate);
        let stacked = hp.expected_tensors_in(SPARK_ARCH.tensors_with(stacked_qkv));
        assert_eq!(stacked.len(), 2 + 2 * 9);
        let find = |n: &str| stacked.iter().find(|(k, _)| k == n).unwrap().1.clone();
        assert_eq!(find("blk.0.attn_qkv.weight"), vec![2304, (8 + 2 * 4) * 256]);
        assert_eq!(find("blk.1.ffn_down_t.weight"), vec![2304, 13824]);
        assert!(stacked.iter().all(|(n, _)| !n.contains("attn_k.")));
    }

    #[test]
    fn paired_k2v_layouts_in_both_qkv_layouts() {
        let m = spark_meta();
        let hp = Hparams::from_metadata(SPARK_ARCH, lookup(&m)).unwrap();
        let names = |layout: Layout| -> Vec<String> {
            hp.expected_tensors_in(SPARK_ARCH.tensors_with(layout))
                .into_iter()
                .map(|(n, _)| n)
                .collect()
        };
        for qkv in [QkvLayout::Split, QkvLayout::Stacked] {
            let separate = names(Layout::new(qkv, FfnRowLayout::Separate));
            let paired_layout = Layout::new(qkv, FfnRowLayout::Paired);
            let paired = hp.expected_tensors_in(SPARK_ARCH.tensors_with(paired_layout));
            // one tensor fewer per layer: ffn_k2v where ffn_up was, no ffn_down_t
            assert_eq!(paired.len(), separate.len() - 2);
            let want: Vec<String> = separate
                .iter()
                .filter(|n| !n.contains("ffn_down_t"))
                .map(|n| n.replace("ffn_up", "ffn_k2v"))
                .collect();
            let got: Vec<String> = paired.iter().map(|(n, _)| n.clone()).collect();
            assert_eq!(got, want, "{qkv:?}");
            let k2v = paired
                .iter()
                .find(|(n, _)| n == "blk.1.ffn_k2v.weight")
                .unwrap();
            assert_eq!(k2v.1, vec![(2304 - 1024) + 2304, 13824]);
            let i = got
                .iter()
                .position(|n| n == "blk.0.ffn_k2v.weight")
                .unwrap();
            assert_eq!(
                [got[i - 1].as_str(), got[i + 1].as_str()],
                ["blk.0.ffn_gate.weight", "blk.0.post_ffw_norm.weight"]
            );
            assert_eq!(
                got.iter().any(|n| n.contains("attn_qkv")),
                qkv == QkvLayout::Stacked
            );
            // inferred back from the names
            assert_eq!(Layout::infer(|n| got.iter().any(|g| g == n)), paired_layout);
            assert_eq!(
                Layout::infer(|n| separate.iter().any(|g| g == n)),
                Layout::new(qkv, FfnRowLayout::Separate)
            );
        }
        // the parts of a row, their widths and the block rule
        assert_eq!(
            hp.row_parts(TensorKind::FfnK2v),
            vec![(TensorKind::FfnUp, 1280), (TensorKind::FfnDownT, 2304)]
        );
        assert!(hp.row_parts(TensorKind::FfnUp).is_empty());
        let parts = hp.row_parts(TensorKind::FfnK2v);
        assert_eq!(check_row_parts(GgmlType::Q8_0, &parts), Ok(()));
        assert_eq!(check_row_parts(GgmlType::Q4_K, &parts), Ok(()));
        let odd = [(TensorKind::FfnUp, 128), (TensorKind::FfnDownT, 384)];
        assert_eq!(check_row_parts(GgmlType::Q8_0, &odd), Ok(()));
        assert_eq!(
            check_row_parts(GgmlType::Q4_K, &odd).unwrap_err(),
            "type q4_K (blocks of 256 elements) does not make each part of a row whole blocks: \
             ffn_up part 128, ffn_down_t part 384 elements"
        );
        assert_eq!(TensorKind::FfnK2v.short_name(), "ffn_k2v");
        assert_eq!(TensorKind::TokenEmbd.short_name(), "token_embd");
        // dense gemma2 has llama.cpp's layout only
        let paired = Layout::new(QkvLayout::Split, FfnRowLayout::Paired);
        assert!(SPARK_ARCH.supports(paired));
        assert!(!GEMMA2_ARCH.supports(paired));
        assert!(GEMMA2_ARCH.supports(Layout::default()));
        assert_eq!(paired.to_string(), "ffn_k2v paired");
        assert_eq!(
            Layout::new(QkvLayout::Stacked, FfnRowLayout::Paired).to_string(),
            "attn_qkv stacked, ffn_k2v paired"
        );
        assert_eq!(Layout::default().to_string(), "default");
    }

    #[test]
    fn hparams_rules_name_the_key() {
        let cases: [(&str, u32, &str); 5] = [
            (suffix::SPARK_FFN_R, 2304, "spark-gemma2.spark.ffn_r"),
            (suffix::SPARK_ATTN_R, 127, "spark-gemma2.spark.attn_r"),
            (suffix::SPARK_ATTN_R, 256, "spark-gemma2.spark.attn_r"),
            (suffix::SPARK_FFN_K, 0, "spark-gemma2.spark.ffn_k"),
            (
                suffix::HEAD_COUNT_KV,
                3,
                "spark-gemma2.attention.head_count_kv",
            ),
        ];
        for (s, v, key) in cases {
            let mut m = spark_meta();
            m.iter_mut().find(|(k, _)| k.ends_with(s)).unwrap().1 = Value::U32(v);
            let e = Hparams::from_metadata(SPARK_ARCH, lookup(&m))
                .unwrap()
                .validate()
                .unwrap_err();
            assert!(
                e.to_string().starts_with(&format!("metadata key '{key}'")),
                "{e}"
            );
        }
        let mut m = spark_meta();
        m[1].1 = Value::U32(1024);
        let e = Hparams::from_metadata(SPARK_ARCH, lookup(&m))
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "metadata key 'spark-gemma2.spark.ffn_r': is 1024, must satisfy 0 < r_f < D = 1024"
        );
        m[1].1 = Value::U64(2304);
        let e = Hparams::from_metadata(SPARK_ARCH, lookup(&m))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "metadata key 'spark-gemma2.embedding_length': must have type u32 but has type u64"
        );
    }

    #[test]
    fn gemma2_layout_matches_llama_cpp() {
        let mut m = dense_meta(GEMMA2_ARCH);
        m.push((
            format!("{GEMMA2_ARCH}.{}", suffix::VOCAB_SIZE),
            Value::U32(7),
        ));
        let hp = Hparams::from_metadata(GEMMA2_ARCH, lookup(&m)).unwrap();
        hp.validate().unwrap();
        let t = hp.expected_tensors();
        let find = |n: &str| t.iter().find(|(k, _)| k == n).unwrap().1.clone();
        assert_eq!(find("blk.0.ffn_gate.weight"), vec![2304, 13824]);
        assert_eq!(find("blk.0.ffn_up.weight"), vec![2304, 13824]);
        assert_eq!(find("blk.0.ffn_down.weight"), vec![13824, 2304]);
        assert_eq!(GEMMA2_ARCH.keys().len() + 4, SPARK_ARCH.keys().len());
    }

    #[test]
    fn full_key_names() {
        assert_eq!(
            arch_key(SPARK_ARCH, suffix::SPARK_FFN_K),
            "spark-gemma2.spark.ffn_k"
        );
        assert_eq!(
            arch_key(GEMMA2_ARCH, suffix::BLOCK_COUNT),
            "gemma2.block_count"
        );
        for arch in [SPARK_ARCH, GEMMA2_ARCH] {
            for spec in arch.keys() {
                assert_eq!(spec.key(arch), arch_key(arch, spec.suffix));
                assert_eq!(spec.key(arch), format!("{arch}.{}", spec.suffix));
            }
        }
    }

    #[test]
    fn architectures_by_gguf_name() {
        for arch in Arch::ALL {
            assert_eq!(Arch::from_name(arch.name()), Some(arch));
            assert_eq!(arch.to_string(), arch.name());
        }
        assert_eq!(Arch::from_name("llama"), None);
        assert_eq!(
            Arch::from_gguf("llama").unwrap_err().to_string(),
            "metadata key 'general.architecture': architecture 'llama' is not spark-gemma2 or gemma2"
        );
    }

    #[test]
    fn file_types() {
        use GgmlType::*;
        assert_eq!(file_type_for(&[F32, F32]).unwrap(), 0);
        assert_eq!(file_type_for(&[F32, Q8_0, Q8_0, F16]).unwrap(), 7);
        assert_eq!(file_type_for(&[BF16, F32]).unwrap(), 32);
        assert_eq!(file_type_for(&[]).unwrap(), 0);
        assert!(file_type_for(&[I32]).is_err());
    }
}
