//! Output files that appear only when complete.
//!
//! [`AtomicFile::create`] makes a new, uniquely named temporary file in the destination's own
//! directory (`.NAME.XXXXXX.tmp`, created with `O_CREAT | O_EXCL`, so a file or symlink already
//! at that name is never opened or followed, and concurrent writers never share one). Writes go
//! through a buffer into it. [`AtomicFile::commit`] flushes the buffer, fsyncs the file, renames
//! it over the destination ([`Existing::Replace`]) or to the destination only if nothing is
//! there ([`Existing::Refuse`], `renameat2(RENAME_NOREPLACE)` or `link` + `unlink`), and fsyncs
//! the directory so that the rename survives a crash. A rename replaces the directory entry:
//! a symlink at the destination is replaced by the file, its target is left alone.
//!
//! Readers of the destination therefore see the old file or the complete new one, never a
//! partial or mixed one, and two writers racing for one destination each produce a whole file
//! (the last rename wins). Dropping an [`AtomicFile`] without committing it, an error, or a
//! panic, removes the temporary file and leaves the destination as it was.
//!
//! ```no_run
//! use spark_gguf::atomic::{AtomicFile, Existing};
//! use std::io::Write;
//! let mut f = AtomicFile::create(std::path::Path::new("out.bin"), Existing::Replace)?;
//! f.write_all(b"complete contents")?;
//! f.commit()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::ffi::OsString;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::GgufError;

/// Bytes buffered before the temporary file is written.
const BUFFER_BYTES: usize = 1 << 20;
/// Random alphanumeric characters in a temporary file's name.
const RANDOM_CHARS: usize = 6;
/// Longest part of the destination's file name repeated in the temporary name, in bytes (keeps
/// the temporary name within the 255-byte limit of common filesystems).
const MAX_NAME_IN_TMP: usize = 128;

/// What happens when the destination already exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Existing {
    /// Replace it atomically on commit.
    Replace,
    /// Keep it: [`AtomicFile::create`] and [`AtomicFile::commit`] fail with
    /// [`GgufError::Exists`] if the destination exists (as any kind of directory entry, a
    /// dangling symlink included), and the existing entry is left untouched.
    Refuse,
}

/// A file being written; see the module documentation. Bytes are written through its
/// [`Write`] implementation.
pub struct AtomicFile {
    path: PathBuf,
    dir: PathBuf,
    existing: Existing,
    out: BufWriter<tempfile::NamedTempFile>,
}

impl std::fmt::Debug for AtomicFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AtomicFile")
            .field("path", &self.path)
            .field("tmp", &self.out.get_ref().path())
            .field("existing", &self.existing)
            .finish()
    }
}

impl AtomicFile {
    /// Creates the temporary file for destination `path`. With [`Existing::Refuse`], fails with
    /// [`GgufError::Exists`] if `path` exists already. Errors name `path`.
    pub fn create(path: &Path, existing: Existing) -> Result<Self, GgufError> {
        Self::create_with(path, existing, RANDOM_CHARS)
    }

    /// [`AtomicFile::create`] with `random_chars` random characters in the temporary name (0
    /// gives a predictable name, for tests of name collisions).
    fn create_with(
        path: &Path,
        existing: Existing,
        random_chars: usize,
    ) -> Result<Self, GgufError> {
        let io = |op, source| GgufError::Io {
            path: path.to_path_buf(),
            op,
            source,
        };
        let name = path.file_name().ok_or_else(|| {
            io(
                "write",
                io::Error::new(io::ErrorKind::InvalidInput, "not a file path"),
            )
        })?;
        if existing == Existing::Refuse && path.symlink_metadata().is_ok() {
            return Err(GgufError::Exists(path.to_path_buf()));
        }
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let mut prefix = OsString::from(".");
        prefix.push(truncate_name(&name.to_string_lossy(), MAX_NAME_IN_TMP));
        prefix.push(".");
        let mut builder = tempfile::Builder::new();
        builder
            .prefix(&prefix)
            .suffix(".tmp")
            .rand_bytes(random_chars);
        // A temporary file is private (0600) by default; the finished file should get the
        // permissions any newly created file gets (0666 less the umask).
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            builder.permissions(std::fs::Permissions::from_mode(0o666));
        }
        let tmp = builder
            .tempfile_in(&dir)
            .map_err(|e| io("create a temporary file beside it", e))?;
        Ok(AtomicFile {
            path: path.to_path_buf(),
            dir,
            existing,
            out: BufWriter::with_capacity(BUFFER_BYTES, tmp),
        })
    }

    /// The destination path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The temporary file's path (it exists until commit or drop).
    pub fn temp_path(&self) -> &Path {
        self.out.get_ref().path()
    }

    /// An I/O error on this file, naming the destination path.
    pub fn error(&self, op: &'static str, source: io::Error) -> GgufError {
        GgufError::Io {
            path: self.path.clone(),
            op,
            source,
        }
    }

    /// Flushes the buffer and fsyncs the temporary file, so that a later [`commit`](Self::commit)
    /// only renames (used to make a second file durable before the first is committed).
    pub fn sync(&mut self) -> Result<(), GgufError> {
        let io = |op, source| GgufError::Io {
            path: self.path.clone(),
            op,
            source,
        };
        self.out.flush().map_err(|e| io("write", e))?;
        self.out
            .get_ref()
            .as_file()
            .sync_all()
            .map_err(|e| io("sync", e))
    }

    /// Flushes and fsyncs the temporary file, renames it to the destination (see [`Existing`])
    /// and fsyncs the directory. On error the temporary file is removed and the destination
    /// is left as it was.
    pub fn commit(self) -> Result<(), GgufError> {
        let AtomicFile {
            path,
            dir,
            existing,
            out,
        } = self;
        let io = |op, source| GgufError::Io {
            path: path.clone(),
            op,
            source,
        };
        let tmp = out.into_inner().map_err(|e| io("write", e.into_error()))?;
        tmp.as_file().sync_all().map_err(|e| io("sync", e))?;
        match existing {
            Existing::Replace => {
                tmp.persist(&path)
                    .map_err(|e| io("rename the temporary file to", e.error))?;
            }
            Existing::Refuse => {
                tmp.persist_noclobber(&path).map_err(|e| {
                    if e.error.kind() == io::ErrorKind::AlreadyExists {
                        GgufError::Exists(path.clone())
                    } else {
                        io("rename the temporary file to", e.error)
                    }
                })?;
            }
        }
        // Make the rename durable. The complete file is in place whatever happens here, and
        // some filesystems refuse to fsync directories, so a failure is not an error.
        if let Ok(d) = std::fs::File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.out.write(buf)
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.out.write_all(buf)
    }

    /// Flushes the buffer to the temporary file (the destination appears only on commit).
    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// Writes `path` in one go: `write` fills an [`AtomicFile`], which is committed if it returns
/// `Ok`. An error from `write` is returned naming `path`, and leaves the destination as it was.
pub fn write_atomically(
    path: &Path,
    existing: Existing,
    write: impl FnOnce(&mut AtomicFile) -> io::Result<()>,
) -> Result<(), GgufError> {
    let mut file = AtomicFile::create(path, existing)?;
    if let Err(e) = write(&mut file) {
        return Err(file.error("write", e));
    }
    file.commit()
}

/// At most `max` bytes of `s`, cut at a character boundary.
fn truncate_name(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn a_symlink_at_the_temporary_name_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, b"precious").unwrap();
        let path = dir.path().join("out.bin");
        // With no random characters the temporary name is predictable: `.out.bin..tmp`.
        let tmp_name = dir.path().join(".out.bin..tmp");
        std::os::unix::fs::symlink(&target, &tmp_name).unwrap();
        let err = AtomicFile::create_with(&path, Existing::Replace, 0).unwrap_err();
        assert!(err.to_string().contains("out.bin"), "{err}");
        assert_eq!(std::fs::read(&target).unwrap(), b"precious");
        assert!(tmp_name.symlink_metadata().unwrap().is_symlink());
        assert!(!path.exists());
        // Without the symlink the same name works, and it is the name used.
        std::fs::remove_file(&tmp_name).unwrap();
        let mut f = AtomicFile::create_with(&path, Existing::Replace, 0).unwrap();
        assert_eq!(f.temp_path(), tmp_name);
        f.write_all(b"new").unwrap();
        f.commit().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        assert!(!tmp_name.exists());
    }

    #[test]
    fn a_missing_directory_is_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("no-such-dir").join("out.gguf");
        let err = AtomicFile::create(&path, Existing::Replace).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("out.gguf") && text.contains("cannot create a temporary file beside it"),
            "{text}"
        );
        assert!(text.contains("No such file or directory"), "{text}");
    }

    #[test]
    fn long_names_are_cut_in_the_temporary_name() {
        let dir = tempfile::tempdir().unwrap();
        // 250 bytes: a legal name, but `.NAME.XXXXXX.tmp` with all of it would be too long.
        let name = "é".repeat(125);
        let path = dir.path().join(&name);
        let mut f = AtomicFile::create(&path, Existing::Replace).unwrap();
        let tmp = f.temp_path().file_name().unwrap().len();
        assert!(tmp <= 1 + MAX_NAME_IN_TMP + 1 + RANDOM_CHARS + 4, "{tmp}");
        f.write_all(b"x").unwrap();
        f.commit().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"x");
        assert_eq!(truncate_name("aé", 2), "a");
    }
}
