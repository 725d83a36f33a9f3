//! Per-tensor checksums in the manifest format of llama.cpp's `llama-gguf-hash`.
//!
//! A GGUF carries no checksums of its own: bytes changed inside a tensor's data leave a file
//! that is structurally valid and loads. A manifest is a text file of lines
//!
//! ```text
//! xxh64     9a1b3c4d5e6f7081  model.gguf:token_embd.weight
//! sha1      …40 hex digits…  model.gguf:token_embd.weight
//! sha256    …64 hex digits…  model.gguf:token_embd.weight
//! …
//! xxh64     …  model.gguf
//! sha1      …  model.gguf
//! sha256    …  model.gguf
//! ```
//!
//! (`printf("%-8s  %s  %s\n", type, hash, name)`): for each tensor in file order its xxh64
//! (seed 0, printed big-endian), SHA-1 and SHA-256 of the tensor's data bytes (without alignment
//! padding), named `FILE:TENSOR`; then the same hashes of all tensors' data in order, named
//! `FILE`. [`ManifestBuilder`] writes exactly what `llama-gguf-hash --all FILE` prints, so
//! `llama-gguf-hash --check MANIFEST FILE` verifies it when run where FILE is the name written.
//! llama-gguf-hash also knows `uuid` lines (a UUIDv5 of the tensor data in llama.cpp's
//! namespace), which [`verify`] checks too.
//!
//! [`Manifest::parse`] is stricter than llama-gguf-hash, which skips lines it cannot read: every
//! non-empty line must be `TYPE HASH NAME` with a known type and a well-formed hash, or the
//! manifest is refused naming the line. [`verify`] recomputes every hash the manifest has for a
//! file and names the first tensor that does not match.

use std::collections::HashMap;
use std::path::Path;

use sha1::{Digest, Sha1};
use sha2::Sha256;
use xxhash_rust::xxh64::Xxh64;

use crate::{GgufError, GgufFile};

/// llama.cpp's UUIDv5 namespace (`uuid5(NAMESPACE_URL, 'en.wikipedia.org/wiki/Llama.cpp')`).
const UUID_NAMESPACE: [u8; 16] = [
    0xef, 0x00, 0x12, 0x06, 0xda, 0xdc, 0x5f, 0x6d, 0xa1, 0x5f, 0x33, 0x59, 0xe5, 0x77, 0xd4, 0xe5,
];

/// A hash type of the manifest format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HashKind {
    /// xxHash64, seed 0: 16 hex digits.
    Xxh64,
    /// SHA-1: 40 hex digits.
    Sha1,
    /// SHA-256: 64 hex digits.
    Sha256,
    /// UUIDv5 (SHA-1 of llama.cpp's namespace and the data): `8-4-4-4-12` hex digits.
    Uuid,
}

impl HashKind {
    /// The kinds `llama-gguf-hash --all` writes, in its order; what [`ManifestBuilder`] writes.
    pub const WRITTEN: [HashKind; 3] = [HashKind::Xxh64, HashKind::Sha1, HashKind::Sha256];

    /// The name in a manifest line.
    pub fn name(self) -> &'static str {
        match self {
            HashKind::Xxh64 => "xxh64",
            HashKind::Sha1 => "sha1",
            HashKind::Sha256 => "sha256",
            HashKind::Uuid => "uuid",
        }
    }

    fn from_name(s: &str) -> Option<Self> {
        [Self::Xxh64, Self::Sha1, Self::Sha256, Self::Uuid]
            .into_iter()
            .find(|k| k.name() == s)
    }

    /// Whether `s` is a hash of this kind as llama-gguf-hash prints it (lowercase hex).
    fn is_well_formed(self, s: &str) -> bool {
        let hex = |p: &str, n: usize| {
            p.len() == n
                && p.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        match self {
            HashKind::Xxh64 => hex(s, 16),
            HashKind::Sha1 => hex(s, 40),
            HashKind::Sha256 => hex(s, 64),
            HashKind::Uuid => {
                let parts: Vec<&str> = s.split('-').collect();
                parts.len() == 5 && parts.iter().zip([8, 4, 4, 4, 12]).all(|(p, n)| hex(p, n))
            }
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The running hashes of one byte stream, for the kinds asked for.
#[derive(Clone)]
struct Hasher {
    xxh64: Option<Xxh64>,
    sha1: Option<Sha1>,
    sha256: Option<Sha256>,
    uuid: Option<Sha1>,
}

impl std::fmt::Debug for Hasher {
    /// The kinds being computed (the running states have no useful text).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kinds = [
            (HashKind::Xxh64, self.xxh64.is_some()),
            (HashKind::Sha1, self.sha1.is_some()),
            (HashKind::Sha256, self.sha256.is_some()),
            (HashKind::Uuid, self.uuid.is_some()),
        ];
        f.debug_list()
            .entries(kinds.iter().filter(|(_, on)| *on).map(|(k, _)| k.name()))
            .finish()
    }
}

impl Hasher {
    fn new(kinds: impl IntoIterator<Item = HashKind>) -> Self {
        let mut h = Hasher {
            xxh64: None,
            sha1: None,
            sha256: None,
            uuid: None,
        };
        for k in kinds {
            match k {
                HashKind::Xxh64 => h.xxh64 = Some(Xxh64::new(0)),
                HashKind::Sha1 => h.sha1 = Some(Sha1::new()),
                HashKind::Sha256 => h.sha256 = Some(Sha256::new()),
                HashKind::Uuid => {
                    let mut s = Sha1::new();
                    s.update(UUID_NAMESPACE);
                    h.uuid = Some(s);
                }
            }
        }
        h
    }

    fn update(&mut self, data: &[u8]) {
        if let Some(h) = &mut self.xxh64 {
            h.update(data);
        }
        if let Some(h) = &mut self.sha1 {
            h.update(data);
        }
        if let Some(h) = &mut self.sha256 {
            h.update(data);
        }
        if let Some(h) = &mut self.uuid {
            h.update(data);
        }
    }

    /// The digests as llama-gguf-hash prints them, in [`HashKind`] order.
    fn finish(self) -> Vec<(HashKind, String)> {
        let mut out = Vec::new();
        if let Some(h) = self.xxh64 {
            out.push((HashKind::Xxh64, format!("{:016x}", h.digest())));
        }
        if let Some(h) = self.sha1 {
            out.push((HashKind::Sha1, hex(&h.finalize())));
        }
        if let Some(h) = self.sha256 {
            out.push((HashKind::Sha256, hex(&h.finalize())));
        }
        if let Some(h) = self.uuid {
            let d = h.finalize();
            let mut u = [0u8; 16];
            u.copy_from_slice(&d[..16]);
            u[6] = (u[6] & 0x0f) | 0x50; // version 5
            u[8] = (u[8] & 0x3f) | 0x80; // variant 0b10
            let h = hex(&u);
            let uuid = format!(
                "{}-{}-{}-{}-{}",
                &h[..8],
                &h[8..12],
                &h[12..16],
                &h[16..20],
                &h[20..]
            );
            out.push((HashKind::Uuid, uuid));
        }
        out
    }
}

/// Checks that `name` (a file label or a tensor name) can stand in a manifest line, whose
/// fields are separated by whitespace.
pub fn check_name(what: &str, name: &str) -> Result<(), GgufError> {
    if name.is_empty() || name.chars().any(char::is_whitespace) {
        return Err(GgufError::Manifest(format!(
            "{what} {name:?} cannot stand in a llama-gguf-hash manifest line (its fields are \
             separated by whitespace)"
        )));
    }
    Ok(())
}

fn line(kind: HashKind, hash: &str, subject: &str) -> String {
    format!("{:<8}  {hash}  {subject}\n", kind.name())
}

/// Builds a manifest from the tensor data streamed in file order: [`update`](Self::update) with
/// the current tensor's bytes, [`end_tensor`](Self::end_tensor) after each tensor,
/// [`finish`](Self::finish) for the text.
#[derive(Clone, Debug)]
pub struct ManifestBuilder {
    label: String,
    text: String,
    tensor: Hasher,
    model: Hasher,
}

impl ManifestBuilder {
    /// A manifest of the file named `label` (the name written in its lines, e.g. the file
    /// name: `llama-gguf-hash --check` finds entries by the path it is given).
    pub fn new(label: &str) -> Result<Self, GgufError> {
        check_name("the file name", label)?;
        Ok(ManifestBuilder {
            label: label.to_string(),
            text: String::new(),
            tensor: Hasher::new(HashKind::WRITTEN),
            model: Hasher::new(HashKind::WRITTEN),
        })
    }

    /// Adds the next bytes of the current tensor's data.
    pub fn update(&mut self, data: &[u8]) {
        self.tensor.update(data);
        self.model.update(data);
    }

    /// Ends the current tensor, named `name`, and starts the next.
    pub fn end_tensor(&mut self, name: &str) -> Result<(), GgufError> {
        check_name("tensor", name)?;
        let done = std::mem::replace(&mut self.tensor, Hasher::new(HashKind::WRITTEN));
        let subject = format!("{}:{name}", self.label);
        for (kind, hash) in done.finish() {
            self.text.push_str(&line(kind, &hash, &subject));
        }
        Ok(())
    }

    /// The manifest: the tensors' lines, then the whole model's.
    pub fn finish(self) -> String {
        let mut text = self.text;
        for (kind, hash) in self.model.finish() {
            text.push_str(&line(kind, &hash, &self.label));
        }
        text
    }
}

/// The manifest of `file`'s tensor data, its lines naming it `label`.
pub fn manifest_of(file: &GgufFile, label: &str) -> Result<String, GgufError> {
    let mut b = ManifestBuilder::new(label)?;
    for t in file.tensors() {
        b.update(file.tensor_data(t));
        b.end_tensor(&t.name)?;
    }
    Ok(b.finish())
}

/// One line of a manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The hash type.
    pub kind: HashKind,
    /// The hash as written.
    pub hash: String,
    /// What it is the hash of: `FILE` or `FILE:TENSOR`.
    pub subject: String,
    /// Line number (1-based).
    pub line: usize,
}

/// A parsed manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// Where it was read from (for messages).
    pub source: String,
    /// Its entries in file order.
    pub entries: Vec<Entry>,
}

impl Manifest {
    /// Reads and parses the manifest at `path`.
    pub fn read(path: &Path) -> Result<Self, GgufError> {
        let text = std::fs::read_to_string(path).map_err(|source| GgufError::Io {
            path: path.to_path_buf(),
            op: "read",
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses manifest `text` (from `source`, named in errors): every non-empty line is
    /// `TYPE HASH NAME` separated by whitespace, with a known type and a hash of its form, and
    /// no type names the same subject twice.
    pub fn parse(text: &str, source: &str) -> Result<Self, GgufError> {
        let err = |n: usize, m: String| GgufError::Manifest(format!("{source} line {n}: {m}"));
        let mut entries = Vec::new();
        let mut seen: HashMap<(HashKind, &str), usize> = HashMap::new();
        for (i, l) in text.lines().enumerate() {
            let n = i + 1;
            let fields: Vec<&str> = l.split_whitespace().collect();
            let [kind, hash, subject] = fields[..] else {
                if fields.is_empty() {
                    continue;
                }
                return Err(err(
                    n,
                    format!(
                        "expected 'TYPE  HASH  NAME' (3 fields), found {} in {l:?}",
                        fields.len()
                    ),
                ));
            };
            let kind = HashKind::from_name(kind).ok_or_else(|| {
                err(
                    n,
                    format!("unknown hash type '{kind}' (expected xxh64, sha1, sha256 or uuid)"),
                )
            })?;
            if !kind.is_well_formed(hash) {
                return Err(err(
                    n,
                    format!(
                        "'{hash}' is not a {} hash as llama-gguf-hash prints it",
                        kind.name()
                    ),
                ));
            }
            if let Some(first) = seen.insert((kind, subject), n) {
                return Err(err(
                    n,
                    format!(
                        "a second {} entry for '{subject}' (the first is on line {first})",
                        kind.name()
                    ),
                ));
            }
            entries.push(Entry {
                kind,
                hash: hash.to_string(),
                subject: subject.to_string(),
                line: n,
            });
        }
        if entries.is_empty() {
            return Err(GgufError::Manifest(format!("{source}: no entries")));
        }
        Ok(Manifest {
            source: source.to_string(),
            entries,
        })
    }
}

/// What [`verify`] checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// Tensors with an entry, all matching.
    pub tensors: usize,
    /// Entries checked (tensor and whole-file ones).
    pub entries: usize,
    /// The hash types checked.
    pub kinds: Vec<HashKind>,
}

/// Splits `subject` into the tensor it names (`None` for the whole file) when it is about a
/// file whose name is `file_name`: `DIR/NAME` or `DIR/NAME:TENSOR`, any directory part.
fn subject_tensor<'a>(subject: &'a str, file_name: &str) -> Option<Option<&'a str>> {
    let names_file = |label: &str| Path::new(label).file_name() == Some(file_name.as_ref());
    if names_file(subject) {
        return Some(None);
    }
    subject
        .match_indices(':')
        .find(|(i, _)| names_file(&subject[..*i]))
        .map(|(i, _)| Some(&subject[i + 1..]))
}

/// Checks `file` (read from `path`) against `manifest`: the entries whose name is `path`'s file
/// name (with any directory part, as llama-gguf-hash writes the path it was given), each tensor
/// one and then the whole-file ones. Fails naming the first tensor that does not match, a
/// tensor the manifest lists and the file lacks or the other way round, or a manifest with no
/// entry for the file.
pub fn verify(file: &GgufFile, path: &Path, manifest: &Manifest) -> Result<Verified, GgufError> {
    let src = &manifest.source;
    let shown = path.display();
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut whole: Vec<&Entry> = Vec::new();
    let mut per_tensor: HashMap<&str, Vec<&Entry>> = HashMap::new();
    for e in &manifest.entries {
        let (list, what) = match subject_tensor(&e.subject, &file_name) {
            Some(None) => (&mut whole, format!("{file_name} as a whole")),
            Some(Some(t)) => (per_tensor.entry(t).or_default(), format!("tensor '{t}'")),
            None => continue,
        };
        // the same file name under two folders
        if let Some(first) = list.iter().find(|f| f.kind == e.kind) {
            return Err(GgufError::Manifest(format!(
                "{src} line {}: a second {} entry for {what} (the first is on line {})",
                e.line,
                e.kind.name(),
                first.line
            )));
        }
        list.push(e);
    }
    if whole.is_empty() && per_tensor.is_empty() {
        let other = &manifest.entries[0].subject;
        return Err(GgufError::Manifest(format!(
            "{src} has no entry for {file_name} (it is about {other}, line {})",
            manifest.entries[0].line
        )));
    }
    if let Some((name, es)) = per_tensor
        .iter()
        .filter(|(name, _)| file.tensor(name).is_none())
        .min_by_key(|(_, es)| es[0].line)
    {
        return Err(GgufError::Manifest(format!(
            "{src} line {}: lists tensor '{name}', which {shown} does not have",
            es[0].line
        )));
    }
    if !per_tensor.is_empty() {
        if let Some(t) = file
            .tensors()
            .iter()
            .find(|t| !per_tensor.contains_key(t.name.as_str()))
        {
            return Err(GgufError::Manifest(format!(
                "{src} has no entry for tensor '{}' of {shown}",
                t.name
            )));
        }
    }
    let mismatch = |what: String, e: &Entry, got: &str| {
        GgufError::Manifest(format!(
            "{what} of {shown} does not match {src}: its {} is {got}, line {} says {}",
            e.kind.name(),
            e.line,
            e.hash
        ))
    };
    let mut model = Hasher::new(whole.iter().map(|e| e.kind));
    let mut kinds: Vec<HashKind> = whole.iter().map(|e| e.kind).collect();
    for t in file.tensors() {
        let data = file.tensor_data(t);
        model.update(data);
        let Some(es) = per_tensor.get(t.name.as_str()) else {
            continue;
        };
        let mut h = Hasher::new(es.iter().map(|e| e.kind));
        h.update(data);
        for (kind, got) in h.finish() {
            let e = es.iter().find(|e| e.kind == kind).expect("hashed kinds");
            if got != e.hash {
                return Err(mismatch(format!("tensor '{}'", t.name), e, &got));
            }
            kinds.push(kind);
        }
    }
    for (kind, got) in model.finish() {
        let e = whole.iter().find(|e| e.kind == kind).expect("hashed kinds");
        if got != e.hash {
            return Err(mismatch("the tensor data as a whole".into(), e, &got));
        }
    }
    kinds.sort_unstable();
    kinds.dedup();
    Ok(Verified {
        tensors: per_tensor.len(),
        entries: whole.len() + per_tensor.values().map(Vec::len).sum::<usize>(),
        kinds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_match_their_published_test_vectors() {
        let digests = |data: &[u8]| {
            let mut h = Hasher::new([
                HashKind::Xxh64,
                HashKind::Sha1,
                HashKind::Sha256,
                HashKind::Uuid,
            ]);
            h.update(data);
            h.finish()
        };
        let empty = digests(b"");
        // xxHash's XXH64("", 0), FIPS 180's SHA-1 and SHA-256 of the empty message.
        assert_eq!(empty[0], (HashKind::Xxh64, "ef46db3751d8e999".into()));
        assert_eq!(
            empty[1],
            (
                HashKind::Sha1,
                "da39a3ee5e6b4b0d3255bfef95601890afd80709".into()
            )
        );
        assert_eq!(
            empty[2].1,
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        let abc = digests(b"abc");
        assert_eq!(abc[0].1, "44bc2cf5ad770999");
        assert_eq!(abc[1].1, "a9993e364706816aba3e25717850c26c9cd0d89d");
        assert_eq!(
            abc[2].1,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        // Python: uuid.uuid5(uuid.UUID('ef001206-dadc-5f6d-a15f-3359e577d4e5'), 'abc')
        assert_eq!(abc[3].1, "9f2200fc-45e8-5a39-9535-c3ea5c0e0cef");
    }

    #[test]
    fn lines_have_llama_gguf_hash_columns() {
        assert_eq!(
            line(HashKind::Xxh64, "0123", "m.gguf:a"),
            "xxh64     0123  m.gguf:a\n"
        );
        assert_eq!(
            line(HashKind::Sha256, "ab", "m.gguf"),
            "sha256    ab  m.gguf\n"
        );
    }

    #[test]
    fn builder_lists_tensors_then_the_whole_file() {
        let mut b = ManifestBuilder::new("m.gguf").unwrap();
        b.update(b"a");
        b.update(b"bc");
        b.end_tensor("t0").unwrap();
        b.end_tensor("t1").unwrap();
        let text = b.finish();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 9);
        assert_eq!(lines[0], "xxh64     44bc2cf5ad770999  m.gguf:t0");
        assert_eq!(lines[3], "xxh64     ef46db3751d8e999  m.gguf:t1");
        // the whole file is the tensors' data in order: "abc" again
        assert_eq!(lines[6], "xxh64     44bc2cf5ad770999  m.gguf");
        assert!(lines[8].starts_with("sha256    ba7816bf") && lines[8].ends_with("  m.gguf"));
        let m = Manifest::parse(&text, "m").unwrap();
        assert_eq!(m.entries.len(), 9);
        assert_eq!((m.entries[4].kind, m.entries[4].line), (HashKind::Sha1, 5));
        assert!(ManifestBuilder::new("my model.gguf")
            .unwrap_err()
            .to_string()
            .contains("\"my model.gguf\""));
        let mut b = ManifestBuilder::new("m.gguf").unwrap();
        assert!(b.end_tensor("a\tb").is_err());
    }

    #[test]
    fn malformed_lines_are_named() {
        let err = |text: &str| Manifest::parse(text, "x.manifest").unwrap_err().to_string();
        let ok = "xxh64     ef46db3751d8e999  m.gguf:t\n";
        assert_eq!(
            err(&format!("{ok}md5  abc  m.gguf\n")),
            "x.manifest line 2: unknown hash type 'md5' (expected xxh64, sha1, sha256 or uuid)"
        );
        assert!(err(&format!("\n{ok}xxh64  m.gguf\n")).starts_with("x.manifest line 3: expected"));
        assert!(err("xxh64  EF46DB3751D8E999  m.gguf").contains("not a xxh64 hash"));
        assert!(err("xxh64  ef46db3751d8e99  m.gguf").contains("line 1"));
        assert!(err("sha1  ef46db3751d8e999  m.gguf").contains("not a sha1 hash"));
        assert!(err("uuid  ef46db37-51d8-e999-0000-00000000000  m.gguf").contains("uuid"));
        assert!(err(&format!("{ok}{ok}")).contains("line 2: a second xxh64 entry"));
        assert_eq!(err("\n  \n"), "x.manifest: no entries");
        assert!(err(&format!("{ok}xxh64  ef46db3751d8e999  m.gguf  -  Ok")).contains("found 5"));
    }

    #[test]
    fn subjects_name_the_file_with_any_directory() {
        assert_eq!(subject_tensor("m.gguf", "m.gguf"), Some(None));
        assert_eq!(subject_tensor("/a/b/m.gguf", "m.gguf"), Some(None));
        assert_eq!(
            subject_tensor("./m.gguf:blk.0.x", "m.gguf"),
            Some(Some("blk.0.x"))
        );
        assert_eq!(
            subject_tensor("a:b.gguf:t:u", "a:b.gguf"),
            Some(Some("t:u"))
        );
        assert_eq!(subject_tensor("other.gguf:t", "m.gguf"), None);
        assert_eq!(subject_tensor("m.gguf.bak", "m.gguf"), None);
    }

    #[test]
    fn one_file_name_under_two_folders_is_ambiguous() {
        let f = GgufFile::from_bytes(
            [
                &b"GGUF"[..],
                &3u32.to_le_bytes(),
                &0u64.to_le_bytes(),
                &0u64.to_le_bytes(),
            ]
            .concat(),
        )
        .unwrap();
        let empty = "ef46db3751d8e999";
        let text = format!("xxh64  {empty}  a/m.gguf\nxxh64  {empty}  b/m.gguf\n");
        let m = Manifest::parse(&text, "x").unwrap();
        let e = verify(&f, Path::new("m.gguf"), &m).unwrap_err().to_string();
        assert_eq!(
            e,
            "x line 2: a second xxh64 entry for m.gguf as a whole (the first is on line 1)"
        );
        let m = Manifest::parse(&format!("xxh64  {empty}  a/m.gguf\n"), "x").unwrap();
        let v = verify(&f, Path::new("/elsewhere/m.gguf"), &m).unwrap();
        assert_eq!((v.tensors, v.entries), (0, 1));
    }
}
