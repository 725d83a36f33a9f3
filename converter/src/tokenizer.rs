//! SentencePiece vocabularies: reading a `.model` file (a `ModelProto` protobuf) and building a
//! synthetic one for random-weight models.
//!
//! Only `ModelProto.pieces` (field 1) is needed: each `SentencePiece` has `piece` (1, string),
//! `score` (2, float) and `type` (3, enum, default NORMAL). Every other field is skipped by its
//! wire type. SentencePiece's piece types have the same numbers as llama.cpp's token types
//! (NORMAL 1, UNKNOWN 2, CONTROL 3, USER_DEFINED 4, UNUSED 5, BYTE 6), so they map one to one.

use spark_gguf::keys::token_type;

use crate::error::{Error, Result};

/// A SentencePiece vocabulary in id order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Vocab {
    /// Piece text per id.
    pub tokens: Vec<String>,
    /// Score per id.
    pub scores: Vec<f32>,
    /// Token type per id (`spark_gguf::keys::token_type`).
    pub types: Vec<i32>,
}

impl Vocab {
    /// Number of pieces.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether there are no pieces.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

fn malformed(what: &str) -> Error {
    Error::Tokenizer(format!("not a valid SentencePiece model: {what}"))
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }
    fn done(&self) -> bool {
        self.pos >= self.buf.len()
    }
    fn varint(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..70).step_by(7) {
            let b = *self
                .buf
                .get(self.pos)
                .ok_or_else(|| malformed("truncated varint"))?;
            self.pos += 1;
            if shift == 63 && b > 1 {
                return Err(malformed("varint overflows 64 bits"));
            }
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(malformed("varint too long"))
    }
    fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let end = end.ok_or_else(|| malformed("field runs past the end"))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn len_delimited(&mut self) -> Result<&'a [u8]> {
        let n = self.varint()?;
        let n = usize::try_from(n).map_err(|_| malformed("length too large"))?;
        self.bytes(n)
    }
    /// Reads a field key: (field number, wire type).
    fn key(&mut self) -> Result<(u64, u8)> {
        let k = self.varint()?;
        Ok((k >> 3, (k & 7) as u8))
    }
    fn skip(&mut self, wire: u8) -> Result<()> {
        match wire {
            0 => self.varint().map(drop),
            1 => self.bytes(8).map(drop),
            2 => self.len_delimited().map(drop),
            5 => self.bytes(4).map(drop),
            3 | 4 => Err(malformed("deprecated protobuf groups are not supported")),
            w => Err(malformed(&format!("unknown wire type {w}"))),
        }
    }
}

/// Parses a SentencePiece `.model` file's bytes.
pub fn parse_sentencepiece(buf: &[u8]) -> Result<Vocab> {
    let mut r = Reader::new(buf);
    let mut vocab = Vocab::default();
    while !r.done() {
        let (field, wire) = r.key()?;
        if field == 1 {
            if wire != 2 {
                return Err(malformed("pieces field has the wrong wire type"));
            }
            let (piece, score, ty) = parse_piece(r.len_delimited()?)?;
            vocab.tokens.push(piece);
            vocab.scores.push(score);
            vocab.types.push(ty);
        } else {
            r.skip(wire)?;
        }
    }
    if vocab.is_empty() {
        return Err(malformed("it has no pieces"));
    }
    Ok(vocab)
}

fn parse_piece(buf: &[u8]) -> Result<(String, f32, i32)> {
    let mut r = Reader::new(buf);
    let mut piece = None;
    let mut score = 0.0f32;
    let mut ty = token_type::NORMAL;
    while !r.done() {
        match r.key()? {
            (1, 2) => {
                let b = r.len_delimited()?;
                piece = Some(
                    String::from_utf8(b.to_vec()).map_err(|_| malformed("a piece is not UTF-8"))?,
                );
            }
            (2, 5) => {
                let b = r.bytes(4)?;
                score = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
            (3, 0) => {
                let v = r.varint()?;
                ty = match i32::try_from(v) {
                    Ok(t @ token_type::NORMAL..=token_type::BYTE) => t,
                    _ => {
                        return Err(malformed(&format!(
                            "piece type {v} is not one SentencePiece defines"
                        )))
                    }
                };
            }
            (1..=3, _) => return Err(malformed("a piece field has the wrong wire type")),
            (_, wire) => r.skip(wire)?,
        }
    }
    Ok((
        piece.ok_or_else(|| malformed("a piece has no text"))?,
        score,
        ty,
    ))
}

/// A SentencePiece-compatible vocabulary of `size` pieces for random-weight models: `<pad>`,
/// `<eos>`, `<bos>`, `<unk>` at ids 0..3 (Gemma's layout), the 256 byte pieces `<0x00>`..`<0xFF>`,
/// then printable ASCII characters, `▁`-prefixed letters, and two-letter pieces with and without
/// `▁`, until `size` unique pieces. Errors if `size` is below 260 or above what the scheme makes.
pub fn synthetic_vocab(size: usize) -> Result<Vocab> {
    let mut v = Vocab::default();
    let push = |v: &mut Vocab, t: String, ty: i32| {
        let score = if ty == token_type::NORMAL {
            -(v.tokens.len() as f32)
        } else {
            0.0
        };
        v.tokens.push(t);
        v.scores.push(score);
        v.types.push(ty);
    };
    for (t, ty) in [
        ("<pad>", token_type::CONTROL),
        ("<eos>", token_type::CONTROL),
        ("<bos>", token_type::CONTROL),
        ("<unk>", token_type::UNKNOWN),
    ] {
        push(&mut v, t.to_string(), ty);
    }
    if size < 260 {
        return Err(Error::Tokenizer(format!(
            "a synthetic vocabulary needs at least 260 tokens (4 specials + 256 bytes), asked for {size}"
        )));
    }
    for b in 0..=255u8 {
        push(&mut v, format!("<0x{b:02X}>"), token_type::BYTE);
    }
    let letters: Vec<char> = ('a'..='z').chain('A'..='Z').collect();
    let mut normal: Vec<String> = Vec::new();
    normal.push("\u{2581}".to_string());
    normal.extend((b'!'..=b'~').map(|c| (c as char).to_string()));
    normal.extend(letters.iter().map(|c| format!("\u{2581}{c}")));
    'outer: for a in &letters {
        for b in &letters {
            if normal.len() + 260 >= size {
                break 'outer;
            }
            normal.push(format!("\u{2581}{a}{b}"));
            normal.push(format!("{a}{b}"));
        }
    }
    'outer3: for a in &letters {
        for b in &letters {
            for c in &letters {
                if normal.len() + 260 >= size {
                    break 'outer3;
                }
                normal.push(format!("\u{2581}{a}{b}{c}"));
                normal.push(format!("{a}{b}{c}"));
            }
        }
    }
    if normal.len() + 260 < size {
        return Err(Error::Tokenizer(format!(
            "a synthetic vocabulary cannot have {size} tokens"
        )));
    }
    for t in normal.into_iter().take(size - 260) {
        push(&mut v, t, token_type::NORMAL);
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }

    fn field_bytes(field: u64, data: &[u8], out: &mut Vec<u8>) {
        varint(field << 3 | 2, out);
        varint(data.len() as u64, out);
        out.extend_from_slice(data);
    }

    fn piece(text: &str, score: f32, ty: Option<u64>) -> Vec<u8> {
        let mut p = Vec::new();
        field_bytes(1, text.as_bytes(), &mut p);
        varint(2 << 3 | 5, &mut p);
        p.extend_from_slice(&score.to_le_bytes());
        if let Some(t) = ty {
            varint(3 << 3, &mut p);
            varint(t, &mut p);
        }
        // An unknown varint field inside a piece.
        varint(9 << 3, &mut p);
        varint(300, &mut p);
        p
    }

    #[test]
    fn reads_pieces_and_skips_unknown_fields() {
        let mut m = Vec::new();
        field_bytes(1, &piece("<unk>", 0.0, Some(2)), &mut m);
        // trainer_spec (field 2) with nested junk, a fixed64 and a fixed32 field.
        field_bytes(2, &[8, 1, 0x12, 2, b'h', b'i'], &mut m);
        varint(7 << 3 | 1, &mut m);
        m.extend_from_slice(&[1; 8]);
        varint(8 << 3 | 5, &mut m);
        m.extend_from_slice(&[2; 4]);
        field_bytes(1, &piece("\u{2581}the", -1.5, None), &mut m);
        field_bytes(1, &piece("<0x0A>", 0.0, Some(6)), &mut m);
        let v = parse_sentencepiece(&m).unwrap();
        assert_eq!(v.tokens, vec!["<unk>", "\u{2581}the", "<0x0A>"]);
        assert_eq!(v.scores, vec![0.0, -1.5, 0.0]);
        assert_eq!(
            v.types,
            vec![token_type::UNKNOWN, token_type::NORMAL, token_type::BYTE]
        );
    }

    #[test]
    fn rejects_malformed_models() {
        let mut m = Vec::new();
        field_bytes(1, &piece("a", 0.0, Some(1)), &mut m);
        assert!(parse_sentencepiece(&m[..m.len() - 3]).is_err());
        assert!(parse_sentencepiece(&[]).is_err());
        let mut bad_type = Vec::new();
        field_bytes(1, &piece("a", 0.0, Some(9)), &mut bad_type);
        assert!(parse_sentencepiece(&bad_type)
            .unwrap_err()
            .to_string()
            .contains("type 9"));
        let mut wrong_wire = Vec::new();
        varint(1 << 3, &mut wrong_wire);
        varint(5, &mut wrong_wire);
        assert!(parse_sentencepiece(&wrong_wire).is_err());
        assert!(parse_sentencepiece(&[0x13, 0x00])
            .unwrap_err()
            .to_string()
            .contains("groups"));
        assert!(parse_sentencepiece(&[0xff; 12]).is_err());
    }

    #[test]
    fn synthetic_vocab_is_unique_and_laid_out_like_gemma() {
        for size in [260, 512, 256000] {
            let v = synthetic_vocab(size).unwrap();
            assert_eq!(v.len(), size);
            assert_eq!(&v.tokens[..4], &["<pad>", "<eos>", "<bos>", "<unk>"]);
            assert_eq!(
                &v.types[..4],
                &[
                    token_type::CONTROL,
                    token_type::CONTROL,
                    token_type::CONTROL,
                    token_type::UNKNOWN
                ]
            );
            assert_eq!(v.tokens[4], "<0x00>");
            assert_eq!(v.tokens[4 + 255], "<0xFF>");
            assert!(v.types[4..260].iter().all(|&t| t == token_type::BYTE));
            assert!(v.types[260..].iter().all(|&t| t == token_type::NORMAL));
            let set: std::collections::HashSet<_> = v.tokens.iter().collect();
            assert_eq!(set.len(), size);
        }
        assert!(synthetic_vocab(100).is_err());
    }
}
