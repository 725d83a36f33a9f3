//! Streaming GGUF v3 writer.
//!
//! The header, metadata and tensor infos (with offsets computed from the plan) are written first;
//! tensor data then follows in plan order, whole or in chunks, so a model never needs to sit in
//! memory. Output goes through an [`crate::atomic::AtomicFile`]: a uniquely named
//! temporary file next to the destination which `finish` fsyncs and renames into place; an error
//! or a drop before `finish` leaves nothing behind. On request ([`GgufWriter::write_manifest`])
//! the tensor data is hashed as it is written and a `llama-gguf-hash` manifest is committed with
//! the file.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::atomic::{AtomicFile, Existing};
use crate::manifest::{check_name, ManifestBuilder};
use crate::reader::{DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUF_VERSION, MAX_DIMS};
use crate::{keys, Array, GgmlType, GgufError, Value};

/// Longest tensor name llama.cpp accepts, in bytes (`GGML_MAX_NAME` - 1).
pub const MAX_TENSOR_NAME_BYTES: usize = 63;

/// One tensor the writer will write: name, type and ggml dimensions (ne0 fastest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorPlan {
    /// Tensor name (at most 63 bytes).
    pub name: String,
    /// Element type of the data that will be written.
    pub ty: GgmlType,
    /// ggml dimensions, 1 to 4 of them; ne0 must be a multiple of the type's block size.
    pub ne: Vec<u64>,
}

/// A GGUF file being written. See the module documentation.
pub struct GgufWriter {
    path: PathBuf,
    existing: Existing,
    out: Option<AtomicFile>,
    manifest: Option<(ManifestBuilder, AtomicFile)>,
    alignment: u64,
    names: Vec<String>,
    sizes: Vec<u64>,
    current: usize,
    written_in_current: u64,
    bytes_written: u64,
    failed: bool,
}

impl std::fmt::Debug for GgufWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufWriter")
            .field("path", &self.path)
            .field("tensors", &self.names.len())
            .field("current", &self.current)
            .field("bytes_written", &self.bytes_written)
            .finish()
    }
}

/// Bytes of padding needed after `n` bytes to reach a multiple of `alignment`.
fn padding(n: u64, alignment: u64) -> u64 {
    n.next_multiple_of(alignment) - n
}

impl GgufWriter {
    /// Starts writing `path`: checks the plan, computes tensor offsets and writes the header,
    /// metadata, tensor infos and the padding up to the data section.
    ///
    /// If `alignment` differs from 32 and `metadata` has no `general.alignment`, that key is
    /// appended (as a `u32`); if present it must be a `u32` equal to `alignment`. Refuses an
    /// existing `path` unless `overwrite`.
    pub fn create(
        path: &Path,
        overwrite: bool,
        metadata: &[(String, Value)],
        tensors: &[TensorPlan],
        alignment: u64,
    ) -> Result<Self, GgufError> {
        if alignment == 0 || !alignment.is_power_of_two() || alignment > u64::from(u32::MAX) {
            return Err(GgufError::Writer(format!(
                "alignment {alignment} is not a power of two that fits in u32"
            )));
        }
        let mut kvs: Vec<(&str, std::borrow::Cow<'_, Value>)> =
            Vec::with_capacity(metadata.len() + 1);
        let mut seen = HashSet::new();
        for (k, v) in metadata {
            if k.is_empty() {
                return Err(GgufError::Writer("a metadata key is empty".into()));
            }
            if !seen.insert(k.as_str()) {
                return Err(GgufError::metadata(k, "appears twice in the metadata"));
            }
            if k == keys::GENERAL_ALIGNMENT && v.as_u32().map(u64::from) != Some(alignment) {
                return Err(GgufError::metadata(
                    k,
                    format!(
                        "is {} ({}) but the writer aligns to {alignment}",
                        v.display(4),
                        v.type_name()
                    ),
                ));
            }
            kvs.push((k.as_str(), std::borrow::Cow::Borrowed(v)));
        }
        if alignment != DEFAULT_ALIGNMENT && !seen.contains(keys::GENERAL_ALIGNMENT) {
            kvs.push((
                keys::GENERAL_ALIGNMENT,
                std::borrow::Cow::Owned(Value::U32(alignment as u32)),
            ));
        }

        let mut names_seen = HashSet::new();
        let mut sizes = Vec::with_capacity(tensors.len());
        for t in tensors {
            if t.name.len() > MAX_TENSOR_NAME_BYTES {
                return Err(GgufError::tensor(
                    &t.name,
                    format!(
                        "name is {} bytes, at most {MAX_TENSOR_NAME_BYTES} are allowed",
                        t.name.len()
                    ),
                ));
            }
            if !names_seen.insert(t.name.as_str()) {
                return Err(GgufError::tensor(
                    &t.name,
                    "appears twice in the tensor plan",
                ));
            }
            if t.ne.is_empty() || t.ne.len() > MAX_DIMS {
                return Err(GgufError::tensor(
                    &t.name,
                    format!("has {} dimensions, 1 to {MAX_DIMS} are allowed", t.ne.len()),
                ));
            }
            if t.ne.iter().any(|&n| n > i64::MAX as u64) {
                return Err(GgufError::tensor(
                    &t.name,
                    format!("dimension too large in {:?}", t.ne),
                ));
            }
            let n =
                t.ty.tensor_bytes(&t.ne)
                    .map_err(|e| GgufError::tensor(&t.name, e.to_string()))?;
            sizes.push(n);
        }

        let mut header = Vec::new();
        header.extend_from_slice(&GGUF_MAGIC);
        header.extend_from_slice(&GGUF_VERSION.to_le_bytes());
        header.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        header.extend_from_slice(&(kvs.len() as u64).to_le_bytes());
        for (k, v) in &kvs {
            put_str(&mut header, k);
            put_value(&mut header, v);
        }
        let mut offset = 0u64;
        for (t, &n) in tensors.iter().zip(&sizes) {
            put_str(&mut header, &t.name);
            header.extend_from_slice(&(t.ne.len() as u32).to_le_bytes());
            for &d in &t.ne {
                header.extend_from_slice(&d.to_le_bytes());
            }
            header.extend_from_slice(&t.ty.id().to_le_bytes());
            header.extend_from_slice(&offset.to_le_bytes());
            offset = n
                .checked_add(padding(n, alignment))
                .and_then(|p| offset.checked_add(p))
                .ok_or_else(|| GgufError::tensor(&t.name, "data section size overflows u64"))?;
        }
        if !tensors.is_empty() {
            let pad = padding(header.len() as u64, alignment);
            header.resize(header.len() + pad as usize, 0);
        }

        let existing = if overwrite {
            Existing::Replace
        } else {
            Existing::Refuse
        };
        let mut out = AtomicFile::create(path, existing)?;
        if let Err(e) = out.write_all(&header) {
            return Err(out.error("write", e));
        }
        Ok(GgufWriter {
            path: path.to_path_buf(),
            existing,
            out: Some(out),
            manifest: None,
            alignment,
            names: tensors.iter().map(|t| t.name.clone()).collect(),
            sizes,
            current: 0,
            written_in_current: 0,
            bytes_written: header.len() as u64,
            failed: false,
        })
    }

    fn io_err(&mut self, op: &'static str, source: std::io::Error) -> GgufError {
        self.failed = true;
        GgufError::Io {
            path: self.path.clone(),
            op,
            source,
        }
    }

    fn ready(&self) -> Result<(), GgufError> {
        if self.failed {
            return Err(GgufError::Writer(format!(
                "{}: an earlier error left the output incomplete",
                self.path.display()
            )));
        }
        Ok(())
    }

    /// Writes the whole data of the next tensor in plan order; `bytes` must be exactly its size.
    pub fn write_tensor(&mut self, bytes: &[u8]) -> Result<(), GgufError> {
        self.ready()?;
        let Some(name) = self.names.get(self.current) else {
            return Err(GgufError::Writer(format!(
                "all {} planned tensors are already written",
                self.names.len()
            )));
        };
        if self.written_in_current != 0 {
            return Err(GgufError::tensor(
                name,
                format!(
                    "write_tensor after {} bytes were streamed in chunks",
                    self.written_in_current
                ),
            ));
        }
        if bytes.len() as u64 != self.sizes[self.current] {
            return Err(GgufError::tensor(
                name,
                format!(
                    "got {} bytes, the plan needs exactly {}",
                    bytes.len(),
                    self.sizes[self.current]
                ),
            ));
        }
        self.write_tensor_chunk(bytes)
    }

    /// Streams part of the current tensor's data. When the tensor's byte count is reached, its
    /// alignment padding is written and the next tensor becomes current. A chunk may not run past
    /// the current tensor. A zero-byte tensor is completed by an empty chunk.
    pub fn write_tensor_chunk(&mut self, bytes: &[u8]) -> Result<(), GgufError> {
        self.ready()?;
        let Some(name) = self.names.get(self.current) else {
            return Err(GgufError::Writer(format!(
                "all {} planned tensors are already written",
                self.names.len()
            )));
        };
        let size = self.sizes[self.current];
        let left = size - self.written_in_current;
        if bytes.len() as u64 > left {
            return Err(GgufError::tensor(
                name,
                format!(
                    "chunk of {} bytes runs past the tensor's end ({} of {size} bytes left)",
                    bytes.len(),
                    left
                ),
            ));
        }
        let out = self.out.as_mut().expect("output is present until finish");
        if let Err(e) = out.write_all(bytes) {
            return Err(self.io_err("write", e));
        }
        if let Some((m, _)) = &mut self.manifest {
            m.update(bytes);
        }
        self.written_in_current += bytes.len() as u64;
        self.bytes_written += bytes.len() as u64;
        if self.written_in_current == size {
            let pad = padding(size, self.alignment) as usize;
            let zeros = [0u8; 256];
            let mut left = pad;
            while left > 0 {
                let n = left.min(zeros.len());
                let out = self.out.as_mut().expect("output is present until finish");
                if let Err(e) = out.write_all(&zeros[..n]) {
                    return Err(self.io_err("write", e));
                }
                left -= n;
            }
            self.bytes_written += pad as u64;
            if let Some((m, _)) = &mut self.manifest {
                m.end_tensor(&self.names[self.current])?;
            }
            self.current += 1;
            self.written_in_current = 0;
        }
        Ok(())
    }

    /// Also writes a `llama-gguf-hash` manifest of the tensor data (see [`crate::manifest`]) to
    /// `path`, its lines naming the output by its file name. The data is hashed as it is
    /// written; [`finish`](Self::finish) commits the manifest with the output. `path` is refused
    /// if it exists unless the writer may overwrite, as the output is. Must be called before any
    /// tensor data is written; the output's file name and the tensor names must have no
    /// whitespace (the manifest's field separator).
    pub fn write_manifest(&mut self, path: &Path) -> Result<(), GgufError> {
        self.ready()?;
        if self.current != 0 || self.written_in_current != 0 || self.manifest.is_some() {
            return Err(GgufError::Writer(
                "write_manifest must come before any tensor data, and only once".into(),
            ));
        }
        let label = self
            .path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| {
                GgufError::Manifest(format!(
                    "{}: a manifest names the file by its file name, which must be UTF-8",
                    self.path.display()
                ))
            })?;
        let builder = ManifestBuilder::new(label)?;
        for name in &self.names {
            check_name("tensor", name)?;
        }
        if path == self.path {
            return Err(GgufError::Writer(format!(
                "{}: the manifest cannot be the output itself",
                path.display()
            )));
        }
        let file = AtomicFile::create(path, self.existing)?;
        self.manifest = Some((builder, file));
        Ok(())
    }

    /// Bytes written to the output so far (header, data and padding).
    pub fn bytes_written(&self) -> u64 {
        self.bytes_written
    }

    /// Name of the tensor the next bytes belong to, `None` once all are written.
    pub fn current_tensor(&self) -> Option<&str> {
        self.names.get(self.current).map(String::as_str)
    }

    /// Checks that every tensor was written in full, then commits the output (see
    /// [`AtomicFile::commit`]): flushes, fsyncs and renames the temporary file to the destination
    /// path (refusing an existing one unless `overwrite` was given) and fsyncs the directory.
    /// With [`write_manifest`](Self::write_manifest), the manifest is written and fsynced first
    /// and renamed into place right after the output.
    pub fn finish(mut self) -> Result<(), GgufError> {
        self.ready()?;
        if let Some(name) = self.names.get(self.current) {
            return Err(GgufError::tensor(
                name,
                format!(
                    "not written in full ({} of {} bytes); {} of {} tensors are complete",
                    self.written_in_current,
                    self.sizes[self.current],
                    self.current,
                    self.names.len()
                ),
            ));
        }
        let out = self.out.take().expect("output is present until finish");
        let Some((builder, mut manifest)) = self.manifest.take() else {
            return out.commit();
        };
        // The manifest is complete on disk before the output is renamed into place, and renamed
        // right after it: an error up to the output's commit leaves both destinations as they
        // were.
        let text = builder.finish();
        if let Err(e) = manifest.write_all(text.as_bytes()) {
            return Err(manifest.error("write", e));
        }
        manifest.sync()?;
        out.commit()?;
        let manifest_path = manifest.path().to_path_buf();
        manifest.commit().map_err(|e| {
            // The new output is in place: an older manifest at the path would not match it.
            // (With Existing::Refuse there was none; one that appeared since is not ours.)
            if self.existing == Existing::Replace {
                let _ = std::fs::remove_file(&manifest_path);
            }
            GgufError::Manifest(format!(
                "{} is written, but its manifest is not: {e}",
                self.path.display()
            ))
        })
    }
}

fn put_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

/// Appends the encoding of `v` (type id, then payload) to `buf`.
pub(crate) fn put_value(buf: &mut Vec<u8>, v: &Value) {
    buf.extend_from_slice(&v.value_type().id().to_le_bytes());
    match v {
        Value::U8(x) => buf.push(*x),
        Value::I8(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => buf.push(u8::from(*x)),
        Value::String(s) => put_str(buf, s),
        Value::U64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::Array(a) => {
            buf.extend_from_slice(&a.elem_type().id().to_le_bytes());
            buf.extend_from_slice(&(a.len() as u64).to_le_bytes());
            macro_rules! each {
                ($v:expr) => {
                    for x in $v {
                        buf.extend_from_slice(&x.to_le_bytes());
                    }
                };
            }
            match a {
                Array::U8(v) => buf.extend_from_slice(v),
                Array::I8(v) => each!(v),
                Array::U16(v) => each!(v),
                Array::I16(v) => each!(v),
                Array::U32(v) => each!(v),
                Array::I32(v) => each!(v),
                Array::F32(v) => each!(v),
                Array::Bool(v) => buf.extend(v.iter().map(|&b| u8::from(b))),
                Array::String(v) => {
                    for s in v {
                        put_str(buf, s);
                    }
                }
                Array::U64(v) => each!(v),
                Array::I64(v) => each!(v),
                Array::F64(v) => each!(v),
            }
        }
    }
}
