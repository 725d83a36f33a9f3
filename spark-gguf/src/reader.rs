//! GGUF reader: memory-maps a file and validates its whole structure before handing it out.
//!
//! Every count and length read from the file is checked against the bytes that remain before
//! anything is allocated, so a corrupt or hostile file produces an error naming the byte offset,
//! never a huge allocation, a panic or an out-of-bounds read.

use std::collections::HashSet;
use std::fs::File;
use std::path::Path;

use crate::{keys, Array, GgmlType, GgufError, Value, ValueType};

/// The GGUF magic, "GGUF" read as bytes.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// The GGUF version this crate writes.
pub const GGUF_VERSION: u32 = 3;
/// Alignment of the data section and of every tensor when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Maximum number of tensor dimensions (`GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;

/// One tensor's entry in the tensor-info table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Element type.
    pub ty: GgmlType,
    /// Dimensions in ggml order (ne0 fastest), 0 to 4 of them.
    pub ne: Vec<u64>,
    /// Byte offset of the data relative to the start of the data section.
    pub offset: u64,
    /// Size of the data in bytes (without alignment padding).
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Number of elements (product of `ne`, 1 for no dimensions).
    pub fn n_elements(&self) -> u64 {
        self.ne.iter().product()
    }
}

enum Storage {
    Map(memmap2::Mmap),
    Bytes(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Map(m) => m,
            Storage::Bytes(b) => b,
        }
    }
}

/// An open, structurally valid GGUF file (version 2 or 3).
///
/// Structural checks done on open: magic, version, counts bounded by the file size, valid UTF-8
/// for keys and strings, known value types, no nested arrays, unique keys and tensor names,
/// `general.alignment` a power-of-two `u32`, at most 4 dimensions, known ggml types, row lengths
/// that are whole blocks, sizes that do not overflow, tensor data aligned, inside the file and not
/// overlapping. The stricter layout rules llama.cpp also enforces (offsets exactly the running sum,
/// name length) are reported by [`crate::validate::validate`].
pub struct GgufFile {
    storage: Storage,
    version: u32,
    alignment: u64,
    metadata: Vec<(String, Value)>,
    tensors: Vec<TensorInfo>,
    data_offset: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("alignment", &self.alignment)
            .field("n_kv", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .field("data_offset", &self.data_offset)
            .field("file_size", &self.storage.bytes().len())
            .finish()
    }
}

impl GgufFile {
    /// Memory-maps and parses `path`.
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let io = |op, source| GgufError::Io {
            path: path.to_path_buf(),
            op,
            source,
        };
        let file = File::open(path).map_err(|e| io("open", e))?;
        let len = file.metadata().map_err(|e| io("stat", e))?.len();
        let storage = if len == 0 {
            // Mapping an empty file fails on some systems; there is nothing to map anyway.
            Storage::Bytes(Vec::new())
        } else {
            // SAFETY: the map is read-only and private to this value. As with every memory map,
            // the file must not be truncated or modified by another process while it is open; GGUF
            // model files are written once (our writer renames a finished temporary file into
            // place) and then only read.
            let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| io("memory-map", e))?;
            Storage::Map(map)
        };
        Self::parse(storage)
    }

    /// Parses a GGUF image held in memory (tests, small tools).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, GgufError> {
        Self::parse(Storage::Bytes(bytes))
    }

    fn parse(storage: Storage) -> Result<Self, GgufError> {
        let parsed = parse_structure(storage.bytes())?;
        Ok(GgufFile {
            storage,
            version: parsed.version,
            alignment: parsed.alignment,
            metadata: parsed.metadata,
            tensors: parsed.tensors,
            data_offset: parsed.data_offset,
        })
    }

    /// GGUF version from the header (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Alignment of the data section and tensors (`general.alignment` or 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// All metadata pairs in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// The value of metadata key `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// All tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The bytes of tensor `t` (a zero-copy slice of the map). `t` must come from this file:
    /// a foreign info whose range does not fit the file yields an empty slice.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let bytes = self.storage.bytes();
        let start = self.data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.n_bytes));
        match (start, end) {
            (Some(s), Some(e)) if e <= bytes.len() as u64 => &bytes[s as usize..e as usize],
            _ => &[],
        }
    }

    /// Absolute byte offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Size of the whole file in bytes.
    pub fn file_size(&self) -> u64 {
        self.storage.bytes().len() as u64
    }
}

struct Parsed {
    version: u32,
    alignment: u64,
    metadata: Vec<(String, Value)>,
    tensors: Vec<TensorInfo>,
    data_offset: u64,
}

/// A bounds-checked little-endian cursor over the file image.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn offset(&self) -> u64 {
        self.pos as u64
    }

    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::format(
                self.offset(),
                format!(
                    "file ends while reading {}: {} bytes needed, {} left",
                    what(),
                    n,
                    self.remaining()
                ),
            ));
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let at = self.offset();
        let len = self.u64(&|| format!("the length of {}", what()))?;
        if len > self.remaining() {
            return Err(GgufError::format(
                at,
                format!(
                    "{} has length {len} but only {} bytes remain in the file",
                    what(),
                    self.remaining()
                ),
            ));
        }
        let start = self.offset();
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(GgufError::format(
                start + e.valid_up_to() as u64,
                format!("{} is not valid UTF-8", what()),
            )),
        }
    }

    /// Checks that `count` items of at least `min_size` bytes each can fit in the rest of the file.
    fn check_count(&self, at: u64, count: u64, min_size: u64, what: &str) -> Result<(), GgufError> {
        if count > self.remaining() / min_size {
            return Err(GgufError::format(
                at,
                format!(
                    "{what} is {count}, more than the remaining {} bytes can hold",
                    self.remaining()
                ),
            ));
        }
        Ok(())
    }
}

/// The whole structure of a GGUF file in `buf`, checked: the header, the metadata, the tensor
/// infos, and the tensors' data ranges (inside the file, not overlapping).
fn parse_structure(buf: &[u8]) -> Result<Parsed, GgufError> {
    let mut c = Cursor { buf, pos: 0 };
    let version = read_version(&mut c)?;
    let at = c.offset();
    let n_tensors = c.u64(&|| "the tensor count".into())?;
    let at_kv = c.offset();
    let n_kv = c.u64(&|| "the metadata count".into())?;
    // A key-value pair takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at least
    // 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset).
    c.check_count(at_kv, n_kv, 13, "the metadata key-value count")?;
    let metadata = read_metadata(&mut c, n_kv)?;
    let alignment = alignment_of(&metadata)?;
    c.check_count(at, n_tensors, 24, "the tensor count")?;
    let tensors = read_tensor_infos(&mut c, n_tensors, alignment)?;

    let header_end = c.offset();
    let data_offset = if tensors.is_empty() {
        header_end
    } else {
        header_end.next_multiple_of(alignment)
    };
    check_in_file(&tensors, data_offset, buf.len() as u64)?;
    check_no_overlap(&tensors, data_offset)?;
    Ok(Parsed {
        version,
        alignment,
        metadata,
        tensors,
        data_offset,
    })
}

/// The magic and the version (2 or 3).
fn read_version(c: &mut Cursor<'_>) -> Result<u32, GgufError> {
    let magic: [u8; 4] = c.array(&|| "the magic".into())?;
    if magic != GGUF_MAGIC {
        return Err(GgufError::format(
            0,
            format!("bad magic {magic:02x?} (expected \"GGUF\"): not a GGUF file"),
        ));
    }
    let version = c.u32(&|| "the version".into())?;
    match version {
        2 | 3 => Ok(version),
        1 => Err(GgufError::Version {
            version,
            reason:
                "GGUF v1 is no longer supported (llama.cpp refuses it too); reconvert the model",
        }),
        v if v & 0xFFFF == 0 => Err(GgufError::Version {
            version,
            reason: "looks byte-swapped: big-endian GGUF files are not supported",
        }),
        _ => Err(GgufError::Version {
            version,
            reason: "only versions 2 and 3 are supported",
        }),
    }
}

/// `n_kv` key-value pairs: keys non-empty and unique.
fn read_metadata(c: &mut Cursor<'_>, n_kv: u64) -> Result<Vec<(String, Value)>, GgufError> {
    let mut metadata: Vec<(String, Value)> = Vec::with_capacity(capacity_hint(n_kv));
    let mut seen_keys: HashSet<String> = HashSet::new();
    for i in 0..n_kv {
        let key_at = c.offset();
        let key = c.string(&|| format!("metadata key #{i}"))?;
        if key.is_empty() {
            return Err(GgufError::format(
                key_at,
                format!("metadata key #{i} is empty"),
            ));
        }
        if !seen_keys.insert(key.clone()) {
            return Err(GgufError::format(
                key_at,
                format!("duplicate metadata key '{key}'"),
            ));
        }
        let value = read_value(c, &key)?;
        metadata.push((key, value));
    }
    Ok(metadata)
}

/// `general.alignment` (a u32 power of two), or the default.
fn alignment_of(metadata: &[(String, Value)]) -> Result<u64, GgufError> {
    match metadata.iter().find(|(k, _)| k == keys::GENERAL_ALIGNMENT) {
        None => Ok(DEFAULT_ALIGNMENT),
        Some((_, Value::U32(a))) if a.is_power_of_two() => Ok(u64::from(*a)),
        Some((_, Value::U32(a))) => Err(GgufError::metadata(
            keys::GENERAL_ALIGNMENT,
            format!("alignment {a} is not a power of two"),
        )),
        Some((_, v)) => Err(GgufError::metadata(
            keys::GENERAL_ALIGNMENT,
            format!("must have type u32 but has type {}", v.type_name()),
        )),
    }
}

/// `n_tensors` tensor infos: names unique, shapes within ggml's limits, types known, data
/// offsets aligned.
fn read_tensor_infos(
    c: &mut Cursor<'_>,
    n_tensors: u64,
    alignment: u64,
) -> Result<Vec<TensorInfo>, GgufError> {
    let mut tensors: Vec<TensorInfo> = Vec::with_capacity(capacity_hint(n_tensors));
    let mut seen_names: HashSet<String> = HashSet::new();
    for i in 0..n_tensors {
        let name_at = c.offset();
        let name = c.string(&|| format!("the name of tensor #{i}"))?;
        if !seen_names.insert(name.clone()) {
            return Err(GgufError::format(
                name_at,
                format!("duplicate tensor name '{name}'"),
            ));
        }
        let ne = read_shape(c, &name)?;
        let ty_at = c.offset();
        let ty_id = c.u32(&|| format!("the type of tensor '{name}'"))?;
        let ty = GgmlType::from_u32(ty_id).ok_or_else(|| {
            GgufError::format(
                ty_at,
                format!("tensor '{name}' has unknown ggml type id {ty_id}"),
            )
        })?;
        let n_bytes = ty
            .tensor_bytes(&ne)
            .map_err(|e| GgufError::format(ty_at, format!("tensor '{name}': {e}")))?;
        let off_at = c.offset();
        let offset = c.u64(&|| format!("the data offset of tensor '{name}'"))?;
        if offset % alignment != 0 {
            return Err(GgufError::format(
                off_at,
                format!("tensor '{name}' data offset {offset} is not a multiple of the alignment {alignment}"),
            ));
        }
        tensors.push(TensorInfo {
            name,
            ty,
            ne,
            offset,
            n_bytes,
        });
    }
    Ok(tensors)
}

/// Tensor `name`'s dimension count and dimensions: at most [`MAX_DIMS`], each and their product
/// at most `i64::MAX`.
fn read_shape(c: &mut Cursor<'_>, name: &str) -> Result<Vec<u64>, GgufError> {
    let dims_at = c.offset();
    let n_dims = c.u32(&|| format!("the dimension count of tensor '{name}'"))?;
    if n_dims as usize > MAX_DIMS {
        return Err(GgufError::format(
            dims_at,
            format!("tensor '{name}' has {n_dims} dimensions, at most {MAX_DIMS} are allowed"),
        ));
    }
    let mut ne = Vec::with_capacity(n_dims as usize);
    for d in 0..n_dims {
        let ne_at = c.offset();
        let n = c.u64(&|| format!("dimension {d} of tensor '{name}'"))?;
        if n > i64::MAX as u64 {
            return Err(GgufError::format(
                ne_at,
                format!("tensor '{name}' dimension {d} is {n}, larger than i64::MAX"),
            ));
        }
        ne.push(n);
    }
    let n_elems = ne.iter().try_fold(1u64, |acc, &n| acc.checked_mul(n));
    if n_elems.is_none_or(|n| n > i64::MAX as u64) {
        return Err(GgufError::format(
            dims_at,
            format!("tensor '{name}' shape {ne:?} has more than i64::MAX elements"),
        ));
    }
    Ok(ne)
}

/// Every tensor's data lies inside the `file_len`-byte file.
fn check_in_file(tensors: &[TensorInfo], data_offset: u64, file_len: u64) -> Result<(), GgufError> {
    for t in tensors {
        let end = data_offset
            .checked_add(t.offset)
            .and_then(|s| s.checked_add(t.n_bytes));
        match end {
            Some(e) if e <= file_len => {}
            _ => {
                return Err(GgufError::format(
                    data_offset.saturating_add(t.offset),
                    format!(
                        "tensor '{}' data ({} bytes at data offset {}) extends beyond the end of the {file_len}-byte file",
                        t.name, t.n_bytes, t.offset
                    ),
                ))
            }
        }
    }
    Ok(())
}

/// No two tensors' data overlap: sorts the non-empty ranges by offset and compares neighbours.
fn check_no_overlap(tensors: &[TensorInfo], data_offset: u64) -> Result<(), GgufError> {
    let mut ranges: Vec<(u64, u64, &str)> = tensors
        .iter()
        .filter(|t| t.n_bytes > 0)
        .map(|t| (t.offset, t.offset + t.n_bytes, t.name.as_str()))
        .collect();
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(GgufError::format(
                data_offset + w[1].0,
                format!(
                    "tensor '{}' data (data offset {}) overlaps tensor '{}' (data offsets {}..{})",
                    w[1].2, w[1].0, w[0].2, w[0].0, w[0].1
                ),
            ));
        }
    }
    Ok(())
}

/// Pre-allocation for `n` parsed items: bounded so that a count that the file size allows but
/// whose in-memory form is larger than on disk never reserves more than a little up front.
fn capacity_hint(n: u64) -> usize {
    n.min(4096) as usize
}

fn read_value(c: &mut Cursor<'_>, key: &str) -> Result<Value, GgufError> {
    let ty_at = c.offset();
    let ty_id = c.u32(&|| format!("the type of key '{key}'"))?;
    let ty = ValueType::from_u32(ty_id).ok_or_else(|| {
        GgufError::format(
            ty_at,
            format!("key '{key}' has unknown value type id {ty_id}"),
        )
    })?;
    if ty == ValueType::Array {
        let et_at = c.offset();
        let et_id = c.u32(&|| format!("the element type of key '{key}'"))?;
        let et = ValueType::from_u32(et_id).ok_or_else(|| {
            GgufError::format(
                et_at,
                format!("array key '{key}' has unknown element type id {et_id}"),
            )
        })?;
        if et == ValueType::Array {
            return Err(GgufError::format(
                et_at,
                format!("key '{key}' is a nested array, which is not supported"),
            ));
        }
        let n_at = c.offset();
        let n = c.u64(&|| format!("the element count of key '{key}'"))?;
        let min = et.fixed_size().unwrap_or(8);
        c.check_count(
            n_at,
            n,
            min,
            &format!("the element count of array key '{key}'"),
        )?;
        return Ok(Value::Array(read_array(c, key, et, n as usize)?));
    }
    read_scalar(c, key, ty)
}

fn read_scalar(c: &mut Cursor<'_>, key: &str, ty: ValueType) -> Result<Value, GgufError> {
    let w = || format!("the value of key '{key}'");
    Ok(match ty {
        ValueType::U8 => Value::U8(c.array::<1>(&w)?[0]),
        ValueType::I8 => Value::I8(i8::from_le_bytes(c.array(&w)?)),
        ValueType::U16 => Value::U16(u16::from_le_bytes(c.array(&w)?)),
        ValueType::I16 => Value::I16(i16::from_le_bytes(c.array(&w)?)),
        ValueType::U32 => Value::U32(u32::from_le_bytes(c.array(&w)?)),
        ValueType::I32 => Value::I32(i32::from_le_bytes(c.array(&w)?)),
        ValueType::F32 => Value::F32(f32::from_le_bytes(c.array(&w)?)),
        ValueType::U64 => Value::U64(u64::from_le_bytes(c.array(&w)?)),
        ValueType::I64 => Value::I64(i64::from_le_bytes(c.array(&w)?)),
        ValueType::F64 => Value::F64(f64::from_le_bytes(c.array(&w)?)),
        ValueType::Bool => Value::Bool(read_bool(c, key)?),
        ValueType::String => Value::String(c.string(&w)?),
        ValueType::Array => unreachable!("arrays are handled by read_value"),
    })
}

fn read_bool(c: &mut Cursor<'_>, key: &str) -> Result<bool, GgufError> {
    let at = c.offset();
    match c.array::<1>(&|| format!("a bool of key '{key}'"))?[0] {
        0 => Ok(false),
        1 => Ok(true),
        b => Err(GgufError::format(
            at,
            format!("key '{key}' has bool byte {b}, expected 0 or 1"),
        )),
    }
}

fn read_array(c: &mut Cursor<'_>, key: &str, et: ValueType, n: usize) -> Result<Array, GgufError> {
    let w = || format!("the elements of array key '{key}'");
    macro_rules! fixed {
        ($variant:ident, $t:ty) => {{
            const S: usize = std::mem::size_of::<$t>();
            let bytes = c.take((n * S) as u64, &w)?;
            Array::$variant(
                bytes
                    .chunks_exact(S)
                    .map(|b| <$t>::from_le_bytes(b.try_into().expect("chunk of size S")))
                    .collect(),
            )
        }};
    }
    Ok(match et {
        ValueType::U8 => Array::U8(c.take(n as u64, &w)?.to_vec()),
        ValueType::I8 => fixed!(I8, i8),
        ValueType::U16 => fixed!(U16, u16),
        ValueType::I16 => fixed!(I16, i16),
        ValueType::U32 => fixed!(U32, u32),
        ValueType::I32 => fixed!(I32, i32),
        ValueType::F32 => fixed!(F32, f32),
        ValueType::U64 => fixed!(U64, u64),
        ValueType::I64 => fixed!(I64, i64),
        ValueType::F64 => fixed!(F64, f64),
        ValueType::Bool => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(read_bool(c, key)?);
            }
            Array::Bool(v)
        }
        ValueType::String => {
            let mut v = Vec::with_capacity(capacity_hint(n as u64));
            for i in 0..n {
                v.push(c.string(&|| format!("element {i} of array key '{key}'"))?);
            }
            Array::String(v)
        }
        ValueType::Array => unreachable!("nested arrays are rejected by read_value"),
    })
}
