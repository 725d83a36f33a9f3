//! Writing NPY arrays: the `.npy` header (format version 1.0, or 2.0 when the dict needs it) and
//! float32 2-D arrays (what `spark eval --logits-out` writes).
//!
//! The one NPY writer of the workspace: the converter reads checkpoints with its own NPY header
//! parser (`spark_convert::npy`, tested against this writer) and `spark eval` writes logits here.

use std::io::{self, Write};

/// Magic bytes at the start of every `.npy` file.
pub const NPY_MAGIC: &[u8; 6] = b"\x93NUMPY";

/// Data alignment of the files [`header`] writes (numpy's `ARRAY_ALIGN`).
pub const NPY_ALIGN: usize = 64;

/// The `.npy` header of a C-order array whose elements have NPY type `descr` (e.g. `"<f4"`,
/// `"|u1"`, `"<U17"`; no quotes or backslashes) and whose numpy shape is `shape` (empty for a 0-d
/// array): magic, format version 1.0, the header length, and the dict
/// `{'descr': …, 'fortran_order': False, 'shape': …, }` padded with spaces and ended by a newline
/// so that the array data starts at a multiple of [`NPY_ALIGN`] bytes. Shapes are spelt as
/// Python does: `()`, `(5,)`, `(2, 3)`. As numpy does, a dict too long for version 1.0's 16-bit
/// length (a shape with thousands of dimensions) is written as version 2.0 instead.
pub fn header(descr: &str, shape: &[usize]) -> Vec<u8> {
    let dims = match shape {
        [] => String::new(),
        [n] => format!("{n},"),
        _ => shape
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(", "),
    };
    let dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': ({dims}), }}");
    // Header bytes (data offset) with a preamble of `p` bytes: magic, version, length field
    // (2 bytes in version 1.0, 4 in 2.0), then the dict, its padding and the newline.
    let padded = |p: usize| (p + dict.len() + 1).div_ceil(NPY_ALIGN) * NPY_ALIGN;
    let (version, preamble) = if padded(10) - 10 <= usize::from(u16::MAX) {
        (1u8, 10)
    } else {
        (2u8, 12)
    };
    let total = padded(preamble);
    let mut h = Vec::with_capacity(total);
    h.extend_from_slice(NPY_MAGIC);
    h.extend_from_slice(&[version, 0]);
    let text_len = total - preamble;
    if version == 1 {
        h.extend_from_slice(&(text_len as u16).to_le_bytes());
    } else {
        h.extend_from_slice(&(text_len as u32).to_le_bytes());
    }
    h.extend_from_slice(dict.as_bytes());
    h.resize(total - 1, b' ');
    h.push(b'\n');
    h
}

/// Writes `data` (row-major, `rows * cols` values) as a little-endian float32 `.npy` array of
/// shape `(rows, cols)`; an `InvalidInput` error when the lengths disagree.
pub fn write_f32_2d<W: Write>(
    out: &mut W,
    rows: usize,
    cols: usize,
    data: &[f32],
) -> io::Result<()> {
    if rows.checked_mul(cols) != Some(data.len()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("npy: {} values for shape ({rows}, {cols})", data.len()),
        ));
    }
    out.write_all(&header("<f4", &[rows, cols]))?;
    let mut buf = Vec::with_capacity(data.len() * 4);
    for v in data {
        buf.extend_from_slice(&v.to_le_bytes());
    }
    out.write_all(&buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `np.save` of `np.array([[1, -6.5]], dtype='<f4')` (numpy 2), byte for byte.
    fn numpy_saved_1x2() -> Vec<u8> {
        let mut b = b"\x93NUMPY\x01\x00\x76\x00".to_vec();
        b.extend_from_slice(b"{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2), }");
        b.resize(127, b' ');
        b.push(b'\n');
        b.extend_from_slice(&[0, 0, 0x80, 0x3f, 0, 0, 0xd0, 0xc0]);
        b
    }

    #[test]
    fn f32_2d_matches_numpys_save() {
        let mut out = Vec::new();
        write_f32_2d(&mut out, 1, 2, &[1.0, -6.5]).unwrap();
        assert_eq!(out, numpy_saved_1x2());
        // numpy's spellings of the other ranks
        assert!(header("|u1", &[7]).windows(6).any(|w| w == b"(7,), "));
        assert!(header("<U3", &[]).windows(4).any(|w| w == b"(), "));
        assert_eq!(header("<f4", &[2, 3]).len() % NPY_ALIGN, 0);
    }

    #[test]
    fn f32_2d_rejects_wrong_length() {
        let mut out = Vec::new();
        let e = write_f32_2d(&mut out, 2, 2, &[1.0]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(write_f32_2d(&mut out, usize::MAX, 2, &[1.0]).is_err());
        assert!(out.is_empty());
    }
}
