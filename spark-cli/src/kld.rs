//! KL divergence between a base model's token distributions and another model's, as
//! llama-perplexity's `--kl-divergence-base` / `--kl-divergence` compute it.
//!
//! The base file (written by `spark perplexity --kl-divergence-base FILE` on the reference model,
//! read back by `--kl-divergence`) is little-endian:
//!
//! | bytes | content |
//! |---|---|
//! | 8 | magic `SPARKKLD` |
//! | 4 x u32 | format version (1), `n_ctx`, `n_vocab`, `n_chunk` |
//! | `n_chunk * n_ctx` x i32 | the tokens of every chunk, as tokenized (before BOS replacement) |
//! | f32 rows | per chunk, per scored position (`n_ctx/2 .. n_ctx-1`): log-softmax over `n_vocab` |
//!
//! Unlike llama-perplexity's file (log-probabilities packed into 16 bits) the rows are plain
//! f32, so the comparison carries no error of its own.

use crate::error::{CliError, Result};
use crate::mean_sd::mean_sd;
use spark_gguf::atomic::{AtomicFile, Existing};
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"SPARKKLD";
const VERSION: u32 = 1;
const HEADER_BYTES: u64 = 8 + 4 * 4;
/// Largest vocabulary and context a base file may declare (caps allocations on bad input).
const MAX_VOCAB: u32 = 1 << 22;
const MAX_CTX: u32 = 1 << 24;

/// Positions scored in a chunk of `n_ctx` tokens: `n_ctx/2 .. n_ctx-1`.
pub fn scored_per_chunk(n_ctx: usize) -> usize {
    n_ctx - 1 - n_ctx / 2
}

/// `log_softmax(logits)` in f64, stored as f32 in `out`.
pub fn log_softmax(logits: &[f32], out: &mut Vec<f32>) {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let log_z = logits
        .iter()
        .map(|&v| (v as f64 - max).exp())
        .sum::<f64>()
        .ln()
        + max;
    out.clear();
    out.extend(logits.iter().map(|&v| (v as f64 - log_z) as f32));
}

/// The shape of a base file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BaseShape {
    /// Chunk length in tokens.
    pub n_ctx: u32,
    /// Vocabulary size (length of each log-probability row).
    pub n_vocab: u32,
    /// Chunks stored.
    pub n_chunk: u32,
}

impl BaseShape {
    fn body_bytes(&self) -> Option<u64> {
        let tokens = u64::from(self.n_chunk).checked_mul(u64::from(self.n_ctx))?;
        let rows =
            u64::from(self.n_chunk).checked_mul(scored_per_chunk(self.n_ctx as usize) as u64)?;
        tokens
            .checked_mul(4)?
            .checked_add(rows.checked_mul(u64::from(self.n_vocab))?.checked_mul(4)?)
    }
}

/// Writes a base file row by row; the file appears only after [`BaseWriter::finish`].
pub struct BaseWriter {
    file: AtomicFile,
    shape: BaseShape,
    rows_written: u64,
}

impl BaseWriter {
    /// Starts a base file of `shape` holding `tokens` (`n_chunk * n_ctx` of them).
    pub fn create(path: &Path, shape: BaseShape, tokens: &[i32]) -> Result<Self> {
        if tokens.len() != shape.n_chunk as usize * shape.n_ctx as usize {
            return Err(CliError::new(format!(
                "kl-divergence base: {} tokens for {} chunks of {}",
                tokens.len(),
                shape.n_chunk,
                shape.n_ctx
            )));
        }
        let mut file = AtomicFile::create(path, Existing::Replace)?;
        let mut header = Vec::with_capacity(HEADER_BYTES as usize + tokens.len() * 4);
        header.extend_from_slice(MAGIC);
        for v in [VERSION, shape.n_ctx, shape.n_vocab, shape.n_chunk] {
            header.extend_from_slice(&v.to_le_bytes());
        }
        for t in tokens {
            header.extend_from_slice(&t.to_le_bytes());
        }
        if let Err(e) = file.write_all(&header) {
            return Err(file.error("write", e).into());
        }
        Ok(Self {
            file,
            shape,
            rows_written: 0,
        })
    }

    /// Appends the log-probabilities of the next scored position.
    pub fn push(&mut self, log_probs: &[f32]) -> Result<()> {
        debug_assert_eq!(log_probs.len(), self.shape.n_vocab as usize);
        let mut bytes = Vec::with_capacity(log_probs.len() * 4);
        for v in log_probs {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        self.rows_written += 1;
        self.file
            .write_all(&bytes)
            .map_err(|e| self.file.error("write", e).into())
    }

    /// Checks that every row was written and renames the file into place.
    pub fn finish(self) -> Result<()> {
        let want = self.shape.n_chunk as u64 * scored_per_chunk(self.shape.n_ctx as usize) as u64;
        if self.rows_written != want {
            return Err(CliError::new(format!(
                "kl-divergence base: {} of {want} rows written",
                self.rows_written
            )));
        }
        Ok(self.file.commit()?)
    }
}

/// Reads a base file, checking its header and size before anything is allocated from them.
pub struct BaseReader {
    path: PathBuf,
    reader: BufReader<std::fs::File>,
    /// The shape the header declares.
    pub shape: BaseShape,
    /// The stored tokens (`n_chunk * n_ctx`).
    pub tokens: Vec<i32>,
    buf: Vec<u8>,
}

impl BaseReader {
    /// Opens `path` and reads its header and tokens.
    pub fn open(path: &Path) -> Result<Self> {
        let bad = |what: String| CliError::new(format!("{}: {what}", path.display()));
        let file = std::fs::File::open(path)
            .map_err(|e| CliError::new(format!("cannot read {}: {e}", path.display())))?;
        let len = file
            .metadata()
            .map_err(|e| bad(format!("cannot stat: {e}")))?
            .len();
        let mut reader = BufReader::new(file);
        let mut header = [0u8; HEADER_BYTES as usize];
        reader
            .read_exact(&mut header)
            .map_err(|_| bad("too short for a kl-divergence base header".into()))?;
        if &header[..8] != MAGIC {
            return Err(bad(
                "not a spark kl-divergence base file (bad magic; write one with \
                 `spark perplexity --kl-divergence-base FILE`)"
                    .into(),
            ));
        }
        let field =
            |i: usize| u32::from_le_bytes(header[8 + 4 * i..12 + 4 * i].try_into().unwrap());
        let (version, n_ctx, n_vocab, n_chunk) = (field(0), field(1), field(2), field(3));
        if version != VERSION {
            return Err(bad(format!("format version {version}, expected {VERSION}")));
        }
        if !(4..=MAX_CTX).contains(&n_ctx) {
            return Err(bad(format!("n_ctx {n_ctx} out of range 4..={MAX_CTX}")));
        }
        if !(1..=MAX_VOCAB).contains(&n_vocab) {
            return Err(bad(format!(
                "n_vocab {n_vocab} out of range 1..={MAX_VOCAB}"
            )));
        }
        if n_chunk == 0 {
            return Err(bad("n_chunk is 0".into()));
        }
        let shape = BaseShape {
            n_ctx,
            n_vocab,
            n_chunk,
        };
        let want = shape
            .body_bytes()
            .and_then(|b| b.checked_add(HEADER_BYTES))
            .ok_or_else(|| bad("declared size overflows".into()))?;
        if len != want {
            return Err(bad(format!(
                "{len} bytes, but its header ({n_chunk} chunks of {n_ctx}, vocabulary \
                 {n_vocab}) needs {want}"
            )));
        }
        let mut raw = vec![0u8; n_chunk as usize * n_ctx as usize * 4];
        reader
            .read_exact(&mut raw)
            .map_err(|e| bad(format!("reading tokens: {e}")))?;
        let tokens = raw
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        Ok(Self {
            path: path.to_path_buf(),
            reader,
            shape,
            tokens,
            buf: Vec::new(),
        })
    }

    /// Reads the next scored position's log-probabilities into `out`.
    pub fn next_row(&mut self, out: &mut Vec<f32>) -> Result<()> {
        self.buf.resize(self.shape.n_vocab as usize * 4, 0);
        self.reader.read_exact(&mut self.buf).map_err(|e| {
            CliError::new(format!(
                "{}: reading log-probabilities: {e}",
                self.path.display()
            ))
        })?;
        out.clear();
        out.extend(
            self.buf
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap())),
        );
        Ok(())
    }
}

/// Index of the largest value (the first on ties).
fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// Per-position KL divergences and top-1 agreement.
#[derive(Debug, Default, Clone)]
pub struct KldStats {
    kld: Vec<f64>,
    same_top1: u64,
}

impl KldStats {
    /// Adds one position: `KL(base || model) = sum_i p_base(i) (log p_base(i) - log p_model(i))`
    /// from the two log-softmax rows, and whether both put their maximum on the same token.
    pub fn add(&mut self, base: &[f32], model: &[f32]) {
        let kld: f64 = base
            .iter()
            .zip(model)
            .map(|(&b, &m)| {
                let (b, m) = (f64::from(b), f64::from(m));
                if b == f64::NEG_INFINITY {
                    0.0
                } else {
                    b.exp() * (b - m)
                }
            })
            .sum();
        self.kld.push(kld.max(0.0));
        if argmax(base) == argmax(model) {
            self.same_top1 += 1;
        }
    }

    /// Positions added.
    pub fn count(&self) -> usize {
        self.kld.len()
    }

    /// Mean KLD and its standard error.
    pub fn mean(&self) -> (f64, f64) {
        let (mean, sd) = mean_sd(&self.kld);
        (mean, sd / (self.kld.len().max(1) as f64).sqrt())
    }

    /// The `q`-quantile (0..=1) of the per-position KLDs, nearest rank.
    pub fn quantile(&self, q: f64) -> f64 {
        if self.kld.is_empty() {
            return 0.0;
        }
        let mut sorted = self.kld.clone();
        sorted.sort_by(f64::total_cmp);
        let i = ((sorted.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize;
        sorted[i]
    }

    /// Fraction of positions whose most likely token is the same, and its standard error.
    pub fn same_top1(&self) -> (f64, f64) {
        let n = self.kld.len() as f64;
        if n == 0.0 {
            return (0.0, 0.0);
        }
        let p = self.same_top1 as f64 / n;
        (p, (p * (1.0 - p) / n).sqrt())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("spark-kld-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("base.kld")
    }

    #[test]
    fn log_softmax_normalises() {
        let mut out = Vec::new();
        log_softmax(&[1.0, 2.0, 3.0, -50.0], &mut out);
        let total: f64 = out.iter().map(|&v| f64::from(v).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert!((out[2] - out[1] - 1.0).abs() < 1e-6);
    }

    #[test]
    fn kld_matches_a_hand_computed_value_and_is_zero_on_itself() {
        let (mut p, mut q) = (Vec::new(), Vec::new());
        log_softmax(&[0.0, 0.0], &mut p); // (1/2, 1/2)
        log_softmax(&[0.0, (3.0f32).ln()], &mut q); // (1/4, 3/4)
        let mut s = KldStats::default();
        s.add(&p, &q);
        s.add(&p, &p);
        let want = 0.5 * (0.5f64 / 0.25).ln() + 0.5 * (0.5f64 / 0.75).ln();
        assert!((s.quantile(1.0) - want).abs() < 1e-6, "{}", s.quantile(1.0));
        assert_eq!(s.quantile(0.0), 0.0);
        assert!((s.mean().0 - want / 2.0).abs() < 1e-6);
        assert_eq!(s.count(), 2);
        // argmax of (1/2, 1/2) is token 0, of (1/4, 3/4) token 1: one of two agree.
        assert_eq!(s.same_top1().0, 0.5);
    }

    #[test]
    fn base_file_round_trips() {
        let path = scratch("roundtrip");
        let shape = BaseShape {
            n_ctx: 6,
            n_vocab: 3,
            n_chunk: 2,
        };
        let tokens: Vec<i32> = (0..12).collect();
        let mut w = BaseWriter::create(&path, shape, &tokens).unwrap();
        let rows = 2 * scored_per_chunk(6);
        for r in 0..rows {
            w.push(&[r as f32, -1.0, -2.5]).unwrap();
        }
        w.finish().unwrap();
        let mut r = BaseReader::open(&path).unwrap();
        assert_eq!(r.shape, shape);
        assert_eq!(r.tokens, tokens);
        let mut row = Vec::new();
        for i in 0..rows {
            r.next_row(&mut row).unwrap();
            assert_eq!(row, vec![i as f32, -1.0, -2.5]);
        }
        assert!(r.next_row(&mut row).is_err());
    }

    /// One chunk of 4 tokens over a vocabulary of 2: one scored row.
    const SMALL: BaseShape = BaseShape {
        n_ctx: 4,
        n_vocab: 2,
        n_chunk: 1,
    };

    #[test]
    fn unfinished_base_file_leaves_nothing() {
        let path = scratch("unfinished");
        let mut w = BaseWriter::create(&path, SMALL, &[1, 2, 3, 4]).unwrap();
        w.push(&[0.0, 0.0]).unwrap();
        drop(w);
        assert!(!path.exists());
        let w = BaseWriter::create(&path, SMALL, &[1, 2, 3, 4]).unwrap();
        assert!(w.finish().unwrap_err().to_string().contains("0 of 1 rows"));
        assert!(!path.exists());
        assert_eq!(
            std::fs::read_dir(path.parent().unwrap()).unwrap().count(),
            0
        );
    }

    #[test]
    fn bad_base_files_are_rejected_with_the_reason() {
        let path = scratch("bad");
        let mut w = BaseWriter::create(&path, SMALL, &[1, 2, 3, 4]).unwrap();
        w.push(&[0.0, 0.0]).unwrap();
        w.finish().unwrap();
        let good = std::fs::read(&path).unwrap();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (good[..good.len() - 1].to_vec(), "needs"),
            ([good.clone(), vec![0]].concat(), "needs"),
            (b"GGUF".to_vec(), "too short"),
            ([b"NOTSPARK".as_slice(), &good[8..]].concat(), "bad magic"),
            (
                {
                    let mut g = good.clone();
                    g[8] = 9;
                    g
                },
                "version 9",
            ),
            (
                {
                    let mut g = good.clone();
                    g[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
                    g
                },
                "n_vocab",
            ),
            (
                {
                    let mut g = good.clone();
                    g[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
                    g
                },
                "needs",
            ),
        ];
        for (bytes, want) in cases {
            std::fs::write(&path, &bytes).unwrap();
            let err = BaseReader::open(&path)
                .err()
                .expect("must fail")
                .to_string();
            assert!(
                err.contains(want) && err.contains("base.kld"),
                "{want}: {err}"
            );
        }
    }
}
