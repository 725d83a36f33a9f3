//! Writing a float32 2-D array as a NumPy `.npy` file (format version 1.0).

use std::io::{self, Write};

/// Writes `data` (row-major, `rows * cols` values) as a little-endian float32 `.npy` array of
/// shape `(rows, cols)`.
pub fn write_f32_2d<W: Write>(
    out: &mut W,
    rows: usize,
    cols: usize,
    data: &[f32],
) -> io::Result<()> {
    if data.len() != rows * cols {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("npy: {} values for shape ({rows}, {cols})", data.len()),
        ));
    }
    out.write_all(&header(rows, cols))?;
    let mut buf = Vec::with_capacity(data.len() * 4);
    for v in data {
        buf.extend_from_slice(&v.to_le_bytes());
    }
    out.write_all(&buf)
}

/// Magic, version 1.0, header length and the header dict padded with spaces so that the data
/// starts at a multiple of 64 bytes, ending in a newline.
fn header(rows: usize, cols: usize) -> Vec<u8> {
    let dict = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {cols}), }}");
    let unpadded = 10 + dict.len() + 1;
    let total = unpadded.div_ceil(64) * 64;
    let mut text = dict.into_bytes();
    text.resize(total - 10 - 1, b' ');
    text.push(b'\n');
    let mut h = Vec::with_capacity(total);
    h.extend_from_slice(b"\x93NUMPY\x01\x00");
    h.extend_from_slice(&(text.len() as u16).to_le_bytes());
    h.extend_from_slice(&text);
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_aligned_and_parsable() {
        let mut out = Vec::new();
        write_f32_2d(&mut out, 2, 3, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        let hlen = u16::from_le_bytes([out[8], out[9]]) as usize;
        assert_eq!((10 + hlen) % 64, 0);
        let text = std::str::from_utf8(&out[10..10 + hlen]).unwrap();
        assert!(text.contains("'shape': (2, 3)"));
        assert!(text.ends_with('\n'));
        let body = &out[10 + hlen..];
        assert_eq!(body.len(), 24);
        assert_eq!(f32::from_le_bytes(body[20..24].try_into().unwrap()), 6.0);
    }

    #[test]
    fn rejects_wrong_length() {
        let mut out = Vec::new();
        assert!(write_f32_2d(&mut out, 2, 2, &[1.0]).is_err());
    }
}
