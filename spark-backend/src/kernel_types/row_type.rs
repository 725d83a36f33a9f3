//! The storage types of weight rows ([`RowType`]: every type ggml can dequantize) and where a
//! folded axpy pass starts ([`Start`]): what the row kernels of every table take and the
//! features hand them. Block layouts (elements and bytes per block) are the linked ggml's own
//! (`ggml_blck_size`, `ggml_type_size`), read once per process.

use llama_cpp_sys_2 as sys;
use std::sync::OnceLock;

/// A weight storage type the kernels support: every type ggml can dequantize. The variants are
/// declared in [`RowType::ALL`]'s order (their discriminant is their index there).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RowType {
    /// `GGML_TYPE_F32`.
    F32,
    /// `GGML_TYPE_F16`.
    F16,
    /// `GGML_TYPE_BF16`.
    Bf16,
    /// `GGML_TYPE_Q8_0`: blocks of 32.
    Q8_0,
    /// `GGML_TYPE_Q4_0`: blocks of 32.
    Q4_0,
    /// `GGML_TYPE_Q4_1`: blocks of 32.
    Q4_1,
    /// `GGML_TYPE_Q5_0`: blocks of 32 (llama.cpp's fallback for q4_K on rows that are not
    /// whole 256-blocks).
    Q5_0,
    /// `GGML_TYPE_Q5_1`: blocks of 32 (the fallback for q5_K).
    Q5_1,
    /// `GGML_TYPE_Q2_K`: blocks of 256.
    Q2K,
    /// `GGML_TYPE_Q3_K`: blocks of 256.
    Q3K,
    /// `GGML_TYPE_Q4_K`: blocks of 256.
    Q4K,
    /// `GGML_TYPE_Q5_K`: blocks of 256.
    Q5K,
    /// `GGML_TYPE_Q6_K`: blocks of 256.
    Q6K,
    /// `GGML_TYPE_IQ2_XXS`: blocks of 256 (quantizing needs an importance matrix).
    Iq2Xxs,
    /// `GGML_TYPE_IQ2_XS`: blocks of 256 (quantizing needs an importance matrix).
    Iq2Xs,
    /// `GGML_TYPE_IQ2_S`: blocks of 256.
    Iq2S,
    /// `GGML_TYPE_IQ3_XXS`: blocks of 256.
    Iq3Xxs,
    /// `GGML_TYPE_IQ3_S`: blocks of 256.
    Iq3S,
    /// `GGML_TYPE_IQ1_S`: blocks of 256 (quantizing needs an importance matrix).
    Iq1S,
    /// `GGML_TYPE_IQ1_M`: blocks of 256.
    Iq1M,
    /// `GGML_TYPE_IQ4_NL`: blocks of 32 (llama.cpp's fallback for iq4_xs, and for the 2- and
    /// 3-bit IQ types, on rows that are not whole 256-blocks).
    Iq4Nl,
    /// `GGML_TYPE_IQ4_XS`: blocks of 256.
    Iq4Xs,
    /// `GGML_TYPE_TQ1_0`: ternary, blocks of 256.
    Tq1_0,
    /// `GGML_TYPE_TQ2_0`: ternary, blocks of 256.
    Tq2_0,
    /// `GGML_TYPE_MXFP4`: blocks of 32.
    Mxfp4,
    /// `GGML_TYPE_NVFP4`: blocks of 64.
    Nvfp4,
    /// `GGML_TYPE_Q1_0`: blocks of 128.
    Q1_0,
    /// `GGML_TYPE_Q2_0`: blocks of 64.
    Q2_0,
}

/// Number of [`RowType`]s.
const N_TYPES: usize = 28;

impl RowType {
    /// Every supported type, in declaration order.
    pub const ALL: [RowType; N_TYPES] = [
        RowType::F32,
        RowType::F16,
        RowType::Bf16,
        RowType::Q8_0,
        RowType::Q4_0,
        RowType::Q4_1,
        RowType::Q5_0,
        RowType::Q5_1,
        RowType::Q2K,
        RowType::Q3K,
        RowType::Q4K,
        RowType::Q5K,
        RowType::Q6K,
        RowType::Iq2Xxs,
        RowType::Iq2Xs,
        RowType::Iq2S,
        RowType::Iq3Xxs,
        RowType::Iq3S,
        RowType::Iq1S,
        RowType::Iq1M,
        RowType::Iq4Nl,
        RowType::Iq4Xs,
        RowType::Tq1_0,
        RowType::Tq2_0,
        RowType::Mxfp4,
        RowType::Nvfp4,
        RowType::Q1_0,
        RowType::Q2_0,
    ];

    /// Position in [`RowType::ALL`] (for per-type tables).
    #[inline]
    pub(crate) const fn index(self) -> usize {
        self as usize
    }

    /// Every block-quantized type (those that go through ggml's type traits).
    pub fn quantized() -> impl Iterator<Item = RowType> {
        Self::ALL.into_iter().filter(|t| t.is_quantized())
    }

    /// The type for a ggml type id, or `None` for an id ggml cannot dequantize (q8_1, q8_K,
    /// the integer types, f64, removed or unknown ids) or whose block layout the linked ggml
    /// does not report.
    pub fn from_ggml(ty: u32) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|t| t.ggml() == ty)
            .filter(|t| t.block_elems() > 0 && t.block_bytes() > 0)
    }

    /// The ggml type id (`GGML_TYPE_*`, from ggml's own header through the sys bindings).
    pub const fn ggml(self) -> u32 {
        match self {
            RowType::F32 => sys::GGML_TYPE_F32,
            RowType::F16 => sys::GGML_TYPE_F16,
            RowType::Q4_0 => sys::GGML_TYPE_Q4_0,
            RowType::Q4_1 => sys::GGML_TYPE_Q4_1,
            RowType::Q5_0 => sys::GGML_TYPE_Q5_0,
            RowType::Q5_1 => sys::GGML_TYPE_Q5_1,
            RowType::Q8_0 => sys::GGML_TYPE_Q8_0,
            RowType::Q2K => sys::GGML_TYPE_Q2_K,
            RowType::Q3K => sys::GGML_TYPE_Q3_K,
            RowType::Q4K => sys::GGML_TYPE_Q4_K,
            RowType::Q5K => sys::GGML_TYPE_Q5_K,
            RowType::Q6K => sys::GGML_TYPE_Q6_K,
            RowType::Bf16 => sys::GGML_TYPE_BF16,
            RowType::Iq2Xxs => sys::GGML_TYPE_IQ2_XXS,
            RowType::Iq2Xs => sys::GGML_TYPE_IQ2_XS,
            RowType::Iq2S => sys::GGML_TYPE_IQ2_S,
            RowType::Iq3Xxs => sys::GGML_TYPE_IQ3_XXS,
            RowType::Iq3S => sys::GGML_TYPE_IQ3_S,
            RowType::Iq1S => sys::GGML_TYPE_IQ1_S,
            RowType::Iq1M => sys::GGML_TYPE_IQ1_M,
            RowType::Iq4Nl => sys::GGML_TYPE_IQ4_NL,
            RowType::Iq4Xs => sys::GGML_TYPE_IQ4_XS,
            RowType::Tq1_0 => sys::GGML_TYPE_TQ1_0,
            RowType::Tq2_0 => sys::GGML_TYPE_TQ2_0,
            RowType::Mxfp4 => sys::GGML_TYPE_MXFP4,
            RowType::Nvfp4 => sys::GGML_TYPE_NVFP4,
            RowType::Q1_0 => sys::GGML_TYPE_Q1_0,
            RowType::Q2_0 => sys::GGML_TYPE_Q2_0,
        }
    }

    /// (elements, bytes) per block as the linked ggml reports them (`ggml_blck_size`,
    /// `ggml_type_size`), read once per process; (0, 0) for a type ggml gives no block size.
    #[inline]
    fn layout(self) -> (usize, usize) {
        static LAYOUT: OnceLock<[(usize, usize); N_TYPES]> = OnceLock::new();
        LAYOUT.get_or_init(|| {
            RowType::ALL.map(|t| {
                // SAFETY: both functions only index ggml's static type-traits table, and every
                // RowType maps to a valid id below GGML_TYPE_COUNT.
                let (blck, size) =
                    unsafe { (sys::ggml_blck_size(t.ggml()), sys::ggml_type_size(t.ggml())) };
                match usize::try_from(blck) {
                    Ok(b) if b > 0 && size > 0 => (b, size),
                    _ => (0, 0),
                }
            })
        })[self.index()]
    }

    /// Elements per block (1 for float types): the linked ggml's `ggml_blck_size`.
    #[inline]
    pub fn block_elems(self) -> usize {
        self.layout().0
    }

    /// Bytes per block: the linked ggml's `ggml_type_size`. Row slice lengths of the ops are
    /// computed from it.
    #[inline]
    pub fn block_bytes(self) -> usize {
        self.layout().1
    }

    /// True for the block-quantized types.
    pub fn is_quantized(self) -> bool {
        self.block_elems() > 1
    }

    /// Bytes of a row of `n` elements (ggml's `ggml_row_size`), or `None` when `n` is not a
    /// whole number of blocks.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        let (be, bb) = self.layout();
        (be > 0 && n.is_multiple_of(be)).then(|| n / be * bb)
    }

    /// Short lowercase name as ggml spells it (`ggml_type_name`; tested equal).
    pub fn name(self) -> &'static str {
        match self {
            RowType::F32 => "f32",
            RowType::F16 => "f16",
            RowType::Bf16 => "bf16",
            RowType::Q8_0 => "q8_0",
            RowType::Q4_0 => "q4_0",
            RowType::Q4_1 => "q4_1",
            RowType::Q5_0 => "q5_0",
            RowType::Q5_1 => "q5_1",
            RowType::Q2K => "q2_K",
            RowType::Q3K => "q3_K",
            RowType::Q4K => "q4_K",
            RowType::Q5K => "q5_K",
            RowType::Q6K => "q6_K",
            RowType::Iq2Xxs => "iq2_xxs",
            RowType::Iq2Xs => "iq2_xs",
            RowType::Iq2S => "iq2_s",
            RowType::Iq3Xxs => "iq3_xxs",
            RowType::Iq3S => "iq3_s",
            RowType::Iq1S => "iq1_s",
            RowType::Iq1M => "iq1_m",
            RowType::Iq4Nl => "iq4_nl",
            RowType::Iq4Xs => "iq4_xs",
            RowType::Tq1_0 => "tq1_0",
            RowType::Tq2_0 => "tq2_0",
            RowType::Mxfp4 => "mxfp4",
            RowType::Nvfp4 => "nvfp4",
            RowType::Q1_0 => "q1_0",
            RowType::Q2_0 => "q2_0",
        }
    }
}

/// Where a folded axpy pass (`rows::axpy_folded`) starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// From the output's current values.
    Accumulate,
    /// From zero: the output's old values are not read (as if it had been zero-filled first).
    Zero,
}
