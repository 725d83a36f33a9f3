//! Output files that appear only when complete: written to a hidden temporary file in the same
//! directory and renamed into place on [`AtomicFile::commit`]; dropped uncommitted, the
//! temporary file is removed and an existing file at the path is left untouched.

use crate::error::{CliError, Result};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// A file being written; see the module documentation.
pub struct AtomicFile {
    path: PathBuf,
    tmp: PathBuf,
    writer: Option<BufWriter<std::fs::File>>,
}

impl AtomicFile {
    /// Creates the temporary file for `path`.
    pub fn create(path: &Path) -> Result<Self> {
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = path
            .file_name()
            .ok_or_else(|| CliError::new(format!("not a file path: {}", path.display())))?;
        let tmp = dir.join(format!(".{}.partial", name.to_string_lossy()));
        let file = std::fs::File::create(&tmp)
            .map_err(|e| CliError::new(format!("cannot write {}: {e}", path.display())))?;
        Ok(Self {
            path: path.to_path_buf(),
            tmp,
            writer: Some(BufWriter::new(file)),
        })
    }

    /// Appends `bytes`.
    pub fn write_all(&mut self, bytes: &[u8]) -> Result<()> {
        let result = match self.writer.as_mut() {
            Some(w) => w.write_all(bytes),
            None => Ok(()),
        };
        result.map_err(|e| self.error(e))
    }

    /// The buffered writer, for serializers that take `impl Write`.
    pub fn writer(&mut self) -> &mut BufWriter<std::fs::File> {
        self.writer
            .as_mut()
            .expect("the writer lives until commit consumes self")
    }

    /// Flushes, syncs and renames the file into place.
    pub fn commit(mut self) -> Result<()> {
        let writer = self.writer.take().expect("commit runs once");
        let result = writer
            .into_inner()
            .map_err(|e| e.into_error())
            .and_then(|f| f.sync_all())
            .and_then(|()| std::fs::rename(&self.tmp, &self.path));
        result.map_err(|e| self.error(e))
    }

    fn error(&self, e: std::io::Error) -> CliError {
        CliError::new(format!("cannot write {}: {e}", self.path.display()))
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        // After a successful commit the temporary name no longer exists; otherwise this
        // removes the incomplete output.
        let _ = std::fs::remove_file(&self.tmp);
    }
}

/// Writes `path` in one go through an [`AtomicFile`].
pub fn write_atomically(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<std::fs::File>) -> std::io::Result<()>,
) -> Result<()> {
    let mut file = AtomicFile::create(path)?;
    let result = write(file.writer());
    result.map_err(|e| CliError::new(format!("cannot write {}: {e}", path.display())))?;
    file.commit()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("spark-atomic-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn committed_file_appears_and_no_temporary_is_left() {
        let dir = scratch("commit");
        let path = dir.join("out.bin");
        write_atomically(&path, |w| w.write_all(b"abc")).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"abc");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn failed_write_keeps_the_old_file_and_removes_the_temporary() {
        let dir = scratch("fail");
        let path = dir.join("out.bin");
        std::fs::write(&path, b"old").unwrap();
        let err = write_atomically(&path, |w| {
            w.write_all(b"partial")?;
            Err(std::io::Error::other("boom"))
        })
        .unwrap_err();
        assert!(err.to_string().contains("boom"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        {
            let mut f = AtomicFile::create(&path).unwrap();
            f.write_all(b"dropped").unwrap();
        }
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
