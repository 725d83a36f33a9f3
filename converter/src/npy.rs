//! The NPY array header (format versions 1, 2 and 3) and the element types a checkpoint may use.
//!
//! Only what SPEC section 5 needs is accepted: little-endian `f4`, `f2`, raw 2-byte `V2`
//! (bfloat16 as numpy stores it through `ml_dtypes`), `u1`, and 0-d little-endian unicode (`<U…`)
//! for the config; C order only. Everything else is a clear error.
//!
//! The writer is spark-gguf's (`spark_gguf::npy`, re-exported here): [`header`] (any `descr` and
//! shape, C order) and [`write_f32_2d`] (what `spark eval --logits-out` writes). The tests below
//! read what it writes.

use crate::error::{Error, Result};

pub use spark_gguf::npy::{header, write_f32_2d, NPY_ALIGN, NPY_MAGIC};

/// The element type of a stored array, as its NPY `descr` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NpyDtype {
    /// `<f4`: IEEE single precision.
    F32,
    /// `<f2`: IEEE half precision.
    F16,
    /// `|V2` (or `<V2`): two raw bytes per element; bfloat16 when the caller says so.
    Raw2,
    /// `|u1` / `<u1`: bytes.
    U8,
    /// `<U{n}`: fixed-width UTF-32LE strings of `n` code points.
    Unicode(usize),
}

impl NpyDtype {
    /// Bytes per element.
    pub fn item_size(self) -> usize {
        match self {
            NpyDtype::F32 => 4,
            NpyDtype::F16 | NpyDtype::Raw2 => 2,
            NpyDtype::U8 => 1,
            NpyDtype::Unicode(n) => 4 * n,
        }
    }

    /// The `descr` spelling, for messages.
    pub fn describe(self) -> String {
        match self {
            NpyDtype::F32 => "float32 (<f4)".into(),
            NpyDtype::F16 => "float16 (<f2)".into(),
            NpyDtype::Raw2 => "raw 2-byte (|V2)".into(),
            NpyDtype::U8 => "uint8 (|u1)".into(),
            NpyDtype::Unicode(n) => format!("unicode (<U{n})"),
        }
    }

    fn parse(descr: &str) -> std::result::Result<NpyDtype, String> {
        let (order, kind) = match descr.chars().next() {
            Some(c @ ('<' | '>' | '|' | '=')) => (c, &descr[1..]),
            _ => ('=', descr),
        };
        if order == '>' && !matches!(kind, "u1" | "V2") {
            return Err(format!(
                "big-endian dtype '{descr}' is not supported (save little-endian arrays)"
            ));
        }
        match kind {
            "f4" => Ok(NpyDtype::F32),
            "f2" => Ok(NpyDtype::F16),
            "V2" => Ok(NpyDtype::Raw2),
            "u1" => Ok(NpyDtype::U8),
            _ if kind.starts_with('U') => kind[1..]
                .parse::<usize>()
                .map(NpyDtype::Unicode)
                .map_err(|_| format!("unsupported dtype '{descr}'")),
            _ => Err(format!(
                "unsupported dtype '{descr}' (expected <f4, <f2, |V2 (bfloat16), |u1 or <U)"
            )),
        }
    }
}

/// A parsed NPY header: what the data bytes that follow it hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NpyHeader {
    /// Element type.
    pub dtype: NpyDtype,
    /// Array shape (numpy order; empty for a 0-d array).
    pub shape: Vec<usize>,
    /// Bytes from the start of the `.npy` data to the first array element.
    pub data_offset: usize,
}

impl NpyHeader {
    /// Number of elements (1 for a 0-d array); `None` on overflow.
    pub fn element_count(&self) -> Option<usize> {
        self.shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
    }

    /// Number of data bytes the shape and dtype call for; `None` on overflow.
    pub fn data_len(&self) -> Option<usize> {
        self.element_count()?.checked_mul(self.dtype.item_size())
    }
}

/// Smallest prefix that always contains the header length field.
pub const NPY_PREAMBLE_LEN: usize = 12;

/// Total header length (preamble + dict) from the first bytes of a `.npy` file, so a caller
/// streaming the file knows how much to read before calling [`parse_header`].
pub fn header_len(entry: &str, prefix: &[u8]) -> Result<usize> {
    if prefix.len() < 10 || &prefix[..6] != NPY_MAGIC {
        return Err(Error::entry(entry, "is not a .npy array (bad magic)"));
    }
    match prefix[6] {
        1 => Ok(10 + u16::from_le_bytes([prefix[8], prefix[9]]) as usize),
        2 | 3 => {
            if prefix.len() < 12 {
                return Err(Error::entry(entry, "truncated .npy header"));
            }
            let n = u32::from_le_bytes([prefix[8], prefix[9], prefix[10], prefix[11]]) as usize;
            Ok(12 + n)
        }
        v => Err(Error::entry(
            entry,
            format!("unsupported .npy format version {v}"),
        )),
    }
}

/// Parses the header at the start of `bytes` (which must hold at least [`header_len`] bytes).
pub fn parse_header(entry: &str, bytes: &[u8]) -> Result<NpyHeader> {
    let total = header_len(entry, bytes)?;
    if bytes.len() < total {
        return Err(Error::entry(entry, "truncated .npy header"));
    }
    let dict_start = if bytes[6] == 1 { 10 } else { 12 };
    let text = std::str::from_utf8(&bytes[dict_start..total])
        .map_err(|_| Error::entry(entry, "the .npy header is not valid text"))?;
    let fields =
        parse_dict(text).map_err(|m| Error::entry(entry, format!("bad .npy header: {m}")))?;
    let mut descr = None;
    let mut fortran = None;
    let mut shape = None;
    for (key, value) in fields {
        match (key.as_str(), value) {
            ("descr", PyValue::Str(s)) => descr = Some(s),
            ("fortran_order", PyValue::Bool(b)) => fortran = Some(b),
            ("shape", PyValue::Tuple(t)) => shape = Some(t),
            (k, _) => {
                return Err(Error::entry(
                    entry,
                    format!("bad .npy header: unexpected field '{k}'"),
                ))
            }
        }
    }
    let descr = descr.ok_or_else(|| Error::entry(entry, "bad .npy header: no 'descr'"))?;
    let shape = shape.ok_or_else(|| Error::entry(entry, "bad .npy header: no 'shape'"))?;
    if fortran.ok_or_else(|| Error::entry(entry, "bad .npy header: no 'fortran_order'"))? {
        return Err(Error::entry(
            entry,
            "is stored in Fortran order; save it C-contiguous (np.ascontiguousarray)",
        ));
    }
    let dtype = NpyDtype::parse(&descr).map_err(|m| Error::entry(entry, m))?;
    let header = NpyHeader {
        dtype,
        shape,
        data_offset: total,
    };
    if header.data_len().is_none() {
        return Err(Error::entry(entry, "shape is too large"));
    }
    Ok(header)
}

/// A value in the header's Python dict literal.
#[derive(Debug, PartialEq)]
enum PyValue {
    Str(String),
    Bool(bool),
    Tuple(Vec<usize>),
}

/// Parses `{'key': value, ...}` where values are strings, True/False, or tuples of integers.
fn parse_dict(text: &str) -> std::result::Result<Vec<(String, PyValue)>, String> {
    let mut p = Parser {
        s: text.as_bytes(),
        i: 0,
    };
    p.skip_ws();
    p.expect(b'{')?;
    let mut out = Vec::new();
    loop {
        p.skip_ws();
        if p.eat(b'}') {
            break;
        }
        let key = p.string()?;
        p.skip_ws();
        p.expect(b':')?;
        p.skip_ws();
        let value = p.value()?;
        out.push((key, value));
        p.skip_ws();
        if p.eat(b',') {
            continue;
        }
        p.skip_ws();
        p.expect(b'}')?;
        break;
    }
    p.skip_ws();
    if p.i != p.s.len() {
        return Err("trailing characters after the dict".into());
    }
    Ok(out)
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn skip_ws(&mut self) {
        while self.i < self.s.len() && matches!(self.s[self.i], b' ' | b'\n' | b'\t' | b'\r') {
            self.i += 1;
        }
    }
    fn eat(&mut self, c: u8) -> bool {
        if self.s.get(self.i) == Some(&c) {
            self.i += 1;
            true
        } else {
            false
        }
    }
    fn expect(&mut self, c: u8) -> std::result::Result<(), String> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(format!("expected '{}' at byte {}", c as char, self.i))
        }
    }
    fn string(&mut self) -> std::result::Result<String, String> {
        let quote = match self.s.get(self.i) {
            Some(&q @ (b'\'' | b'"')) => q,
            _ => return Err(format!("expected a string at byte {}", self.i)),
        };
        self.i += 1;
        let start = self.i;
        while self.i < self.s.len() && self.s[self.i] != quote {
            self.i += 1;
        }
        if self.i >= self.s.len() {
            return Err("unterminated string".into());
        }
        let v = String::from_utf8_lossy(&self.s[start..self.i]).into_owned();
        self.i += 1;
        Ok(v)
    }
    fn word(&mut self) -> &[u8] {
        let start = self.i;
        while self.i < self.s.len() && self.s[self.i].is_ascii_alphanumeric() {
            self.i += 1;
        }
        &self.s[start..self.i]
    }
    fn value(&mut self) -> std::result::Result<PyValue, String> {
        match self.s.get(self.i) {
            Some(b'\'' | b'"') => Ok(PyValue::Str(self.string()?)),
            Some(b'(') => {
                self.i += 1;
                let mut dims = Vec::new();
                loop {
                    self.skip_ws();
                    if self.eat(b')') {
                        break;
                    }
                    let w = self.word();
                    let w = w.strip_suffix(b"L").unwrap_or(w);
                    let n = std::str::from_utf8(w)
                        .ok()
                        .and_then(|t| t.parse::<usize>().ok())
                        .ok_or_else(|| format!("bad shape dimension at byte {}", self.i))?;
                    dims.push(n);
                    self.skip_ws();
                    if self.eat(b',') {
                        continue;
                    }
                    self.expect(b')')?;
                    break;
                }
                Ok(PyValue::Tuple(dims))
            }
            _ => match self.word() {
                b"True" => Ok(PyValue::Bool(true)),
                b"False" => Ok(PyValue::Bool(false)),
                _ => Err(format!("unexpected value at byte {}", self.i)),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-made header for what [`header`] does not write: versions 2 and 3, and dicts
    /// spelt differently from numpy (double quotes, no trailing comma) or malformed ones.
    fn raw(version: u8, dict: &str) -> Vec<u8> {
        let mut v = NPY_MAGIC.to_vec();
        v.push(version);
        v.push(0);
        let pre = if version == 1 { 10 } else { 12 };
        let mut d = dict.as_bytes().to_vec();
        while !(pre + d.len() + 1).is_multiple_of(64) {
            d.push(b' ');
        }
        d.push(b'\n');
        if version == 1 {
            v.extend_from_slice(&(d.len() as u16).to_le_bytes());
        } else {
            v.extend_from_slice(&(d.len() as u32).to_le_bytes());
        }
        v.extend_from_slice(&d);
        v
    }

    #[test]
    fn parses_v1_v2_v3() {
        let dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }";
        let v1 = header("<f4", &[3, 4]);
        // The writer spells the dict exactly as numpy does.
        assert_eq!(v1, raw(1, dict));
        for b in [v1, raw(2, dict), raw(3, dict)] {
            let h = parse_header("w", &b).unwrap();
            assert_eq!(h.dtype, NpyDtype::F32);
            assert_eq!(h.shape, vec![3, 4]);
            assert_eq!(h.data_offset, b.len());
            assert_eq!(h.data_offset % 64, 0);
            assert_eq!(h.data_len(), Some(48));
        }
    }

    #[test]
    fn parses_scalars_and_one_tuples_and_dtypes() {
        let b = header("<U17", &[]);
        let h = parse_header("config", &b).unwrap();
        assert_eq!(h.dtype, NpyDtype::Unicode(17));
        assert!(h.shape.is_empty());
        assert_eq!(h.data_len(), Some(68));
        let b = header("|V2", &[5]);
        let h = parse_header("x", &b).unwrap();
        assert_eq!((h.dtype, h.shape.clone()), (NpyDtype::Raw2, vec![5]));
        let b = raw(1, "{'descr': '|u1', 'fortran_order': False, 'shape': (7,)}");
        assert_eq!(parse_header("x", &b).unwrap().dtype, NpyDtype::U8);
        let b = raw(
            1,
            "{\"descr\": \"<f2\", \"fortran_order\": False, \"shape\": (2,3,4)}",
        );
        let h = parse_header("x", &b).unwrap();
        assert_eq!((h.dtype, h.shape.clone()), (NpyDtype::F16, vec![2, 3, 4]));
    }

    #[test]
    fn rejects_fortran_order_bad_dtypes_and_garbage() {
        let b = raw(
            1,
            "{'descr': '<f4', 'fortran_order': True, 'shape': (3, 4), }",
        );
        let e = parse_header("layer_0/x", &b).unwrap_err().to_string();
        assert!(e.contains("layer_0/x") && e.contains("Fortran"), "{e}");
        let b = header("<f8", &[3]);
        assert!(parse_header("x", &b)
            .unwrap_err()
            .to_string()
            .contains("<f8"));
        let b = header(">f4", &[3]);
        assert!(parse_header("x", &b)
            .unwrap_err()
            .to_string()
            .contains("big-endian"));
        let b = raw(
            1,
            "{'descr': '<f4', 'fortran_order': False, 'shape': (3,x), }",
        );
        assert!(parse_header("x", &b).is_err());
        let b = raw(1, "{'descr': '<f4', 'shape': (3,), }");
        assert!(parse_header("x", &b)
            .unwrap_err()
            .to_string()
            .contains("fortran_order"));
        assert!(parse_header("x", b"NOTNPY....").is_err());
        let b = header("<f4", &[3]);
        assert!(parse_header("x", &b[..b.len() - 5])
            .unwrap_err()
            .to_string()
            .contains("truncated"));
        let b = raw(9, "{}");
        assert!(parse_header("x", &b)
            .unwrap_err()
            .to_string()
            .contains("version 9"));
    }

    #[test]
    fn rejects_overflowing_shapes() {
        let b = header("<f4", &[usize::MAX, 4]);
        assert!(parse_header("x", &b).is_err());
    }

    #[test]
    fn written_headers_are_aligned_and_read_back() {
        let cases: [(&str, &[usize], NpyDtype); 6] = [
            ("<f4", &[], NpyDtype::F32),
            ("|u1", &[7], NpyDtype::U8),
            ("<f2", &[2, 3, 4], NpyDtype::F16),
            ("<U5", &[], NpyDtype::Unicode(5)),
            ("|V2", &[0, 9], NpyDtype::Raw2),
            // A 117-byte dict: the newline is byte 127, no padding is needed.
            (
                "<f4",
                &[
                    10, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                ],
                NpyDtype::F32,
            ),
        ];
        for (descr, shape, dtype) in cases {
            let b = header(descr, shape);
            if shape.len() == 21 {
                assert_eq!(
                    (b.len(), b[b.len() - 2]),
                    (128, b'}'),
                    "no padding before the newline"
                );
            }
            assert_eq!(&b[..8], b"\x93NUMPY\x01\x00", "{descr} {shape:?}");
            assert_eq!(b.len() % NPY_ALIGN, 0, "{descr} {shape:?}");
            assert_eq!(header_len("x", &b).unwrap(), b.len());
            assert_eq!(b.last(), Some(&b'\n'));
            let h = parse_header("x", &b).unwrap();
            assert_eq!((h.dtype, h.shape.as_slice()), (dtype, shape));
            assert_eq!(h.data_offset, b.len());
        }
        let b = header("<f2", &[2, 3, 4]);
        let text = std::str::from_utf8(&b[10..]).unwrap();
        assert!(text.starts_with("{'descr': '<f2', 'fortran_order': False, 'shape': (2, 3, 4), }"));
        assert!(header("<f4", &[5]).windows(5).any(|w| w == b"(5,),"));
        assert!(header("<f4", &[]).windows(4).any(|w| w == b"(), "));
    }

    #[test]
    fn long_shapes_are_written_as_version_2() {
        let shape = vec![1usize; 30_000];
        let b = header("<f4", &shape);
        assert_eq!(b[6], 2);
        assert_eq!(b.len() % NPY_ALIGN, 0);
        let h = parse_header("x", &b).unwrap();
        assert_eq!(h.shape, shape);
        assert_eq!(h.data_offset, b.len());
        // The longest shape that still fits version 1.0 stays there (binary search on its rank).
        let (mut fits, mut too_long) = (1usize, 30_000usize);
        while too_long - fits > 1 {
            let mid = (fits + too_long) / 2;
            if header("<f4", &vec![1; mid])[6] == 1 {
                fits = mid;
            } else {
                too_long = mid;
            }
        }
        let shape = vec![1usize; fits];
        let b = header("<f4", &shape);
        assert_eq!(b[6], 1);
        assert_eq!(header("<f4", &vec![1; fits + 1])[6], 2);
        assert!(b.len() > 60_000 && b.len() - 10 <= usize::from(u16::MAX));
        assert_eq!(parse_header("x", &b).unwrap().shape, shape);
    }

    #[test]
    fn f32_2d_arrays_are_written_whole() {
        let mut out = Vec::new();
        write_f32_2d(&mut out, 2, 3, &[1.0, 2.0, 3.0, 4.0, 5.0, -6.5]).unwrap();
        let h = parse_header("logits", &out).unwrap();
        assert_eq!((h.dtype, h.shape.clone()), (NpyDtype::F32, vec![2, 3]));
        assert_eq!(h.data_offset % 64, 0);
        let body = &out[h.data_offset..];
        assert_eq!(Some(body.len()), h.data_len());
        let got: Vec<f32> = body
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(got, [1.0, 2.0, 3.0, 4.0, 5.0, -6.5]);
        let mut empty = Vec::new();
        write_f32_2d(&mut empty, 0, 7, &[]).unwrap();
        assert_eq!(parse_header("x", &empty).unwrap().shape, vec![0, 7]);
        assert_eq!(empty.len(), 128);
    }
}
