//! ggml tensor types: ids, names, block sizes and byte sizes (ggml/src/ggml.c `type_traits`).

use crate::GgufError;

macro_rules! ggml_types {
    ($( $(#[$doc:meta])* $var:ident = $id:expr, $name:expr, $blck:expr, $size:expr; )*) => {
        /// A ggml tensor element type, with its id as stored in GGUF tensor infos.
        ///
        /// Ids that ggml has removed (4, 5, 31..33, 36..38) are not represented: a file using them is
        /// rejected, as ggml does.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[allow(non_camel_case_types)]
        #[repr(u32)]
        pub enum GgmlType {
            $( $(#[$doc])* $var = $id, )*
        }

        impl GgmlType {
            /// Every type, in id order.
            pub const ALL: &'static [GgmlType] = &[$(GgmlType::$var,)*];

            /// The type with ggml id `id`, if ggml defines it.
            pub fn from_u32(id: u32) -> Option<Self> {
                match id {
                    $( $id => Some(GgmlType::$var), )*
                    _ => None,
                }
            }

            /// ggml's name for the type (`type_name` in ggml.c), e.g. `"q8_0"`.
            pub fn name(self) -> &'static str {
                match self { $( GgmlType::$var => $name, )* }
            }

            /// Elements per block (1 for plain types).
            pub fn block_size(self) -> u64 {
                match self { $( GgmlType::$var => $blck, )* }
            }

            /// Bytes per block.
            pub fn type_size(self) -> u64 {
                match self { $( GgmlType::$var => $size, )* }
            }
        }
    };
}

ggml_types! {
    /// 32-bit IEEE float.
    F32 = 0, "f32", 1, 4;
    /// 16-bit IEEE float.
    F16 = 1, "f16", 1, 2;
    /// 4-bit, 32-element blocks, f16 scale.
    Q4_0 = 2, "q4_0", 32, 18;
    /// 4-bit with minimum, 32-element blocks.
    Q4_1 = 3, "q4_1", 32, 20;
    /// 5-bit, 32-element blocks.
    Q5_0 = 6, "q5_0", 32, 22;
    /// 5-bit with minimum, 32-element blocks.
    Q5_1 = 7, "q5_1", 32, 24;
    /// 8-bit, 32-element blocks, f16 scale.
    Q8_0 = 8, "q8_0", 32, 34;
    /// 8-bit with sum, 32-element blocks.
    Q8_1 = 9, "q8_1", 32, 40;
    /// 2-bit k-quant.
    Q2_K = 10, "q2_K", 256, 84;
    /// 3-bit k-quant.
    Q3_K = 11, "q3_K", 256, 110;
    /// 4-bit k-quant.
    Q4_K = 12, "q4_K", 256, 144;
    /// 5-bit k-quant.
    Q5_K = 13, "q5_K", 256, 176;
    /// 6-bit k-quant.
    Q6_K = 14, "q6_K", 256, 210;
    /// 8-bit k-quant (intermediate type).
    Q8_K = 15, "q8_K", 256, 292;
    /// i-quant 2-bit xxs.
    IQ2_XXS = 16, "iq2_xxs", 256, 66;
    /// i-quant 2-bit xs.
    IQ2_XS = 17, "iq2_xs", 256, 74;
    /// i-quant 3-bit xxs.
    IQ3_XXS = 18, "iq3_xxs", 256, 98;
    /// i-quant 1-bit s.
    IQ1_S = 19, "iq1_s", 256, 50;
    /// i-quant 4-bit non-linear.
    IQ4_NL = 20, "iq4_nl", 32, 18;
    /// i-quant 3-bit s.
    IQ3_S = 21, "iq3_s", 256, 110;
    /// i-quant 2-bit s.
    IQ2_S = 22, "iq2_s", 256, 82;
    /// i-quant 4-bit xs.
    IQ4_XS = 23, "iq4_xs", 256, 136;
    /// 8-bit signed integer.
    I8 = 24, "i8", 1, 1;
    /// 16-bit signed integer.
    I16 = 25, "i16", 1, 2;
    /// 32-bit signed integer.
    I32 = 26, "i32", 1, 4;
    /// 64-bit signed integer.
    I64 = 27, "i64", 1, 8;
    /// 64-bit IEEE float.
    F64 = 28, "f64", 1, 8;
    /// i-quant 1-bit m.
    IQ1_M = 29, "iq1_m", 256, 56;
    /// bfloat16.
    BF16 = 30, "bf16", 1, 2;
    /// ternary 1.69-bit.
    TQ1_0 = 34, "tq1_0", 256, 54;
    /// ternary 2-bit.
    TQ2_0 = 35, "tq2_0", 256, 66;
    /// MXFP4 (one 32-element block).
    MXFP4 = 39, "mxfp4", 32, 17;
    /// NVFP4 (4 sub-blocks, E4M3 scales).
    NVFP4 = 40, "nvfp4", 64, 36;
    /// 1-bit, 128-element blocks.
    Q1_0 = 41, "q1_0", 128, 18;
    /// 2-bit, 64-element blocks.
    Q2_0 = 42, "q2_0", 64, 18;
}

impl GgmlType {
    /// The ggml id stored in GGUF tensor infos.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// Whether the type is block-quantized (anything but the plain float and integer types).
    ///
    /// llama.cpp requires `general.quantization_version` once a file holds such a tensor.
    pub fn is_quantized(self) -> bool {
        !matches!(
            self,
            GgmlType::F32
                | GgmlType::F16
                | GgmlType::BF16
                | GgmlType::F64
                | GgmlType::I8
                | GgmlType::I16
                | GgmlType::I32
                | GgmlType::I64
        )
    }

    /// Bytes of one row of `ne0` elements; `ne0` must be a multiple of the block size.
    pub fn row_bytes(self, ne0: u64) -> Result<u64, GgufError> {
        let blck = self.block_size();
        if !ne0.is_multiple_of(blck) {
            return Err(GgufError::Shape(format!(
                "row length {ne0} is not a multiple of the {} block size {blck}",
                self.name()
            )));
        }
        (ne0 / blck).checked_mul(self.type_size()).ok_or_else(|| {
            GgufError::Shape(format!(
                "row of {ne0} {} elements overflows u64 bytes",
                self.name()
            ))
        })
    }

    /// Bytes of a whole tensor with ggml dimensions `ne` (ne0 fastest); `ne` may be empty (one
    /// element). Errors on a bad row length or on overflow.
    pub fn tensor_bytes(self, ne: &[u64]) -> Result<u64, GgufError> {
        let ne0 = ne.first().copied().unwrap_or(1);
        let mut total = self.row_bytes(ne0)?;
        for &n in ne.iter().skip(1) {
            total = total.checked_mul(n).ok_or_else(|| {
                GgufError::Shape(format!(
                    "{} tensor of shape {ne:?} overflows u64 bytes",
                    self.name()
                ))
            })?;
        }
        Ok(total)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_removed_ids_are_unknown() {
        for &t in GgmlType::ALL {
            assert_eq!(GgmlType::from_u32(t.id()), Some(t));
        }
        for id in [4, 5, 31, 32, 33, 36, 37, 38, 43, 1000] {
            assert_eq!(GgmlType::from_u32(id), None, "id {id}");
        }
        assert_eq!(GgmlType::ALL.len(), 43 - 8);
    }

    #[test]
    fn sizes() {
        assert_eq!(GgmlType::Q8_0.row_bytes(64).unwrap(), 68);
        assert_eq!(GgmlType::BF16.tensor_bytes(&[3, 5]).unwrap(), 30);
        assert_eq!(GgmlType::F32.tensor_bytes(&[]).unwrap(), 4);
        assert_eq!(GgmlType::Q4_K.tensor_bytes(&[256, 0]).unwrap(), 0);
        let e = GgmlType::Q8_0.row_bytes(33).unwrap_err().to_string();
        assert_eq!(
            e,
            "row length 33 is not a multiple of the q8_0 block size 32"
        );
        assert!(GgmlType::F64.tensor_bytes(&[u64::MAX / 4, 4]).is_err());
    }
}
