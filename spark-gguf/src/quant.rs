//! Tensor data encodings, bit-identical to gguf-py's `gguf.quants` (and ggml's reference C code).
//!
//! Encode: F32, F16, BF16, Q8_0, Q4_0. Decode: the same five.

use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::{GgmlType, GgufError};

/// Elements per Q8_0 / Q4_0 block.
const QK: usize = 32;

/// Appends the `ty` encoding of `src` to `dst`.
///
/// Block types need `src.len()` to be a multiple of the block size (32 for Q8_0 and Q4_0); rows
/// are independent, so a tensor may be encoded row by row or all at once with the same result.
/// Inputs should be finite: NaN and infinities are encoded as gguf-py does on x86 (NaN stays NaN
/// in F16/BF16; in Q8_0/Q4_0 a block holding one is garbage in gguf-py and ggml alike).
pub fn encode_f32(ty: GgmlType, src: &[f32], dst: &mut Vec<u8>) -> Result<(), GgufError> {
    match ty {
        GgmlType::F32 => {
            for (o, x) in grow(dst, src.len() * 4).chunks_exact_mut(4).zip(src) {
                o.copy_from_slice(&x.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            let out = grow(dst, src.len() * 2);
            let mut tmp = [f16::ZERO; 1024];
            for (chunk, o) in src.chunks(tmp.len()).zip(out.chunks_mut(2 * tmp.len())) {
                let t = &mut tmp[..chunk.len()];
                t.convert_from_f32_slice(chunk);
                for (ob, h) in o.chunks_exact_mut(2).zip(t.iter()) {
                    ob.copy_from_slice(&h.to_bits().to_le_bytes());
                }
            }
        }
        GgmlType::BF16 => {
            for (o, &x) in grow(dst, src.len() * 2).chunks_exact_mut(2).zip(src) {
                o.copy_from_slice(&f32_to_bf16_bits(x).to_le_bytes());
            }
        }
        GgmlType::Q8_0 => {
            check_blocks(ty, src.len())?;
            let out = grow(dst, src.len() / QK * 34);
            for (block, o) in src.chunks_exact(QK).zip(out.chunks_exact_mut(34)) {
                encode_q8_0_block(block, o);
            }
        }
        GgmlType::Q4_0 => {
            check_blocks(ty, src.len())?;
            let out = grow(dst, src.len() / QK * 18);
            for (block, o) in src.chunks_exact(QK).zip(out.chunks_exact_mut(18)) {
                encode_q4_0_block(block, o);
            }
        }
        other => {
            return Err(GgufError::Quant(format!(
                "encoding to {} is not supported (supported: f32, f16, bf16, q8_0, q4_0)",
                other.name()
            )))
        }
    }
    Ok(())
}

/// Extends `dst` by `n` zero bytes and returns them for filling.
fn grow(dst: &mut Vec<u8>, n: usize) -> &mut [u8] {
    let start = dst.len();
    dst.resize(start + n, 0);
    &mut dst[start..]
}

/// Decodes `n` elements of type `ty` from `src` (which must hold exactly their bytes).
pub fn decode_to_f32(ty: GgmlType, src: &[u8], n: usize) -> Result<Vec<f32>, GgufError> {
    let expected = ty
        .row_bytes(n as u64)
        .map_err(|e| GgufError::Quant(e.to_string()))?;
    if src.len() as u64 != expected {
        return Err(GgufError::Quant(format!(
            "{n} {} elements take {expected} bytes, got {}",
            ty.name(),
            src.len()
        )));
    }
    let mut out = Vec::with_capacity(n);
    match ty {
        GgmlType::F32 => {
            out.extend(
                src.chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            );
        }
        GgmlType::F16 => {
            out.resize(n, 0.0);
            let mut tmp = [f16::ZERO; 1024];
            for (bytes, o) in src.chunks(2 * tmp.len()).zip(out.chunks_mut(tmp.len())) {
                let t = &mut tmp[..o.len()];
                for (h, b) in t.iter_mut().zip(bytes.chunks_exact(2)) {
                    *h = f16::from_bits(u16::from_le_bytes([b[0], b[1]]));
                }
                t.convert_to_f32_slice(o);
            }
        }
        GgmlType::BF16 => {
            out.extend(
                src.chunks_exact(2)
                    .map(|b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16)),
            );
        }
        GgmlType::Q8_0 => {
            for b in src.chunks_exact(34) {
                let d = f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
                out.extend(b[2..].iter().map(|&q| f32::from(q as i8) * d));
            }
        }
        GgmlType::Q4_0 => {
            for b in src.chunks_exact(18) {
                let d = f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
                let qs = &b[2..];
                out.extend(qs.iter().map(|&q| f32::from((q & 0x0F) as i8 - 8) * d));
                out.extend(qs.iter().map(|&q| f32::from((q >> 4) as i8 - 8) * d));
            }
        }
        other => {
            return Err(GgufError::Quant(format!(
                "decoding {} is not supported (supported: f32, f16, bf16, q8_0, q4_0)",
                other.name()
            )))
        }
    }
    Ok(out)
}

fn check_blocks(ty: GgmlType, n: usize) -> Result<(), GgufError> {
    if !n.is_multiple_of(QK) {
        return Err(GgufError::Quant(format!(
            "{} needs a multiple of {QK} values, got {n}",
            ty.name()
        )));
    }
    Ok(())
}

/// f32 -> bf16 bits as `ggml_compute_fp32_to_bf16` and gguf-py: NaN forced quiet, otherwise
/// round to nearest, ties to even (overflow rounds to infinity).
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let n = x.to_bits();
    if n & 0x7fff_ffff > 0x7f80_0000 {
        return (((n & 0xffff_0000) | (64 << 16)) >> 16) as u16;
    }
    ((u64::from(n) + 0x7fff + u64::from((n >> 16) & 1)) >> 16) as u16
}

/// float -> integer conversion as numpy does it on x86 (through a 32-bit `cvttss2si`): values
/// outside the int32 range, infinities and NaN become 0x80000000, whose low byte is 0.
fn low_byte_like_numpy(x: f32) -> u8 {
    if x.is_finite() && x > i32::MIN as f32 && x < i32::MAX as f32 {
        (x as i32) as u8
    } else {
        0
    }
}

fn encode_q8_0_block(block: &[f32], out: &mut [u8]) {
    let amax = block.iter().fold(0.0f32, |m, &x| m.max(x.abs()));
    let d = amax / 127.0;
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    out[..2].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
    for (o, &x) in out[2..].iter_mut().zip(block) {
        // gguf-py's np_roundf is round-half-away-from-zero, which is f32::round.
        *o = low_byte_like_numpy((x * id).round());
    }
}

fn encode_q4_0_block(block: &[f32], out: &mut [u8]) {
    // The value of largest magnitude, first one on ties (numpy argmax).
    let mut max = 0.0f32;
    let mut amax = -1.0f32;
    for &x in block {
        if x.abs() > amax {
            amax = x.abs();
            max = x;
        }
    }
    let d = max / -8.0;
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    out[..2].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
    let q = |x: f32| low_byte_like_numpy((x * id + 8.5).trunc()).min(15);
    let (lo, hi) = block.split_at(QK / 2);
    for ((o, &a), &b) in out[2..].iter_mut().zip(lo).zip(hi) {
        *o = q(a) | (q(b) << 4);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding() {
        assert_eq!(f32_to_bf16_bits(1.0), 0x3f80);
        // 1 + 2^-8 is exactly half way between two bf16 values: ties to even (down).
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f80_8000)), 0x3f80);
        // ... and up when the upper neighbour is even.
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16_bits(-0.0), 0x8000);
        assert_eq!(f32_to_bf16_bits(f32::MAX), 0x7f80);
        assert_eq!(f32_to_bf16_bits(f32::NAN) & 0x7fc0, 0x7fc0);
    }

    #[test]
    fn q8_0_block_layout_and_round_trip() {
        let src: Vec<f32> = (0..64).map(|i| (i as f32 - 31.5) / 8.0).collect();
        let mut enc = Vec::new();
        encode_f32(GgmlType::Q8_0, &src, &mut enc).unwrap();
        assert_eq!(enc.len(), 68);
        let dec = decode_to_f32(GgmlType::Q8_0, &enc, 64).unwrap();
        for (a, b) in src.iter().zip(&dec) {
            assert!((a - b).abs() <= 4.0 / 127.0 * 0.5 + 1e-3, "{a} vs {b}");
        }
        // The largest magnitude maps to +-127.
        assert_eq!(enc[2] as i8, -127);
        assert!(encode_f32(GgmlType::Q8_0, &src[..33], &mut enc).is_err());
    }

    #[test]
    fn q4_0_round_trip() {
        let src: Vec<f32> = (0..32).map(|i| (i as f32 - 16.0) / 4.0).collect();
        let mut enc = Vec::new();
        encode_f32(GgmlType::Q4_0, &src, &mut enc).unwrap();
        let dec = decode_to_f32(GgmlType::Q4_0, &enc, 32).unwrap();
        for (a, b) in src.iter().zip(&dec) {
            assert!((a - b).abs() <= 0.5 * 4.0 / 8.0 + 1e-3, "{a} vs {b}");
        }
    }

    #[test]
    fn plain_types_round_trip() {
        let src = [0.0f32, -0.0, 1.5, -2.25, 65504.0, 1e-3];
        for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
            let mut enc = Vec::new();
            encode_f32(ty, &src, &mut enc).unwrap();
            assert_eq!(enc.len() as u64, ty.row_bytes(src.len() as u64).unwrap());
            let dec = decode_to_f32(ty, &enc, src.len()).unwrap();
            for (a, b) in src.iter().zip(&dec) {
                assert!((a - b).abs() <= a.abs() / 100.0, "{ty}: {a} vs {b}");
                assert_eq!(a.is_sign_negative(), b.is_sign_negative());
            }
        }
        assert!(decode_to_f32(GgmlType::F16, &[0u8; 3], 2).is_err());
        assert!(encode_f32(GgmlType::Q4_K, &[0.0; 256], &mut Vec::new()).is_err());
    }
}
