//! `spark_gguf::atomic`: output files appear whole or not at all, concurrent writers do not
//! collide, symlinks are never followed, and nothing temporary is left behind.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};

use spark_gguf::atomic::{write_atomically, AtomicFile, Existing};
use spark_gguf::GgufError;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("spark-atomic-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn committed_file_appears_and_no_temporary_is_left() {
    let dir = scratch("commit");
    let path = dir.join("out.bin");
    write_atomically(&path, Existing::Replace, |w| w.write_all(b"abc")).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"abc");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn failed_write_keeps_the_old_file_and_removes_the_temporary() {
    let dir = scratch("fail");
    let path = dir.join("out.bin");
    std::fs::write(&path, b"old").unwrap();
    let err = write_atomically(&path, Existing::Replace, |w| {
        w.write_all(b"partial")?;
        Err(std::io::Error::other("boom"))
    })
    .unwrap_err();
    assert!(err.to_string().contains("boom"), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), b"old");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    {
        let mut f = AtomicFile::create(&path, Existing::Replace).unwrap();
        f.write_all(b"dropped").unwrap();
    }
    assert_eq!(std::fs::read(&path).unwrap(), b"old");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn errors_name_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.bin");
    let err = write_atomically(&path, Existing::Replace, |_| {
        Err(std::io::Error::other("boom"))
    })
    .unwrap_err()
    .to_string();
    assert_eq!(err, format!("{}: cannot write: boom", path.display()));
    let missing = dir.path().join("no/such/dir/out.bin");
    let err = AtomicFile::create(&missing, Existing::Replace)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(&format!("{}: cannot ", missing.display())),
        "{err}"
    );
}

/// Content `tag` writes: distinct per writer and per chunk, so a mix of two is detectable.
fn content(tag: u8, chunks: usize, chunk_bytes: usize) -> Vec<u8> {
    (0..chunks)
        .flat_map(|c| (0..chunk_bytes).map(move |i| tag ^ (c as u8) ^ (i as u8)))
        .collect()
}

#[test]
fn concurrent_writers_to_one_path_each_write_a_whole_file() {
    const CHUNKS: usize = 8;
    const CHUNK_BYTES: usize = 128 << 10;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.bin");
    let contents: Vec<Vec<u8>> = [0x11u8, 0xEE]
        .iter()
        .map(|&t| content(t, CHUNKS, CHUNK_BYTES))
        .collect();
    for round in 0..4 {
        let barrier = Arc::new(Barrier::new(2));
        let handles: Vec<_> = contents
            .iter()
            .cloned()
            .map(|bytes| {
                let (path, barrier) = (path.clone(), barrier.clone());
                std::thread::spawn(move || -> Result<(), GgufError> {
                    // Every barrier is passed whatever happens, so one writer's error cannot
                    // leave the other waiting.
                    let mut f = AtomicFile::create(&path, Existing::Replace);
                    // Both files are open before either writes; the chunks then alternate and
                    // reach the disk (flush) while the other writer's file is open too.
                    for chunk in bytes.chunks(CHUNK_BYTES) {
                        barrier.wait();
                        if let Ok(file) = &mut f {
                            if let Err(e) = file.write_all(chunk).and_then(|()| file.flush()) {
                                f = Err(file.error("write", e));
                            }
                        }
                    }
                    barrier.wait();
                    f?.commit()
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap().unwrap();
        }
        let got = std::fs::read(&path).unwrap();
        assert!(
            contents.contains(&got),
            "round {round}: the file is not one writer's whole content ({} bytes)",
            got.len()
        );
        assert_eq!(names(dir.path()), ["out.bin"], "round {round}");
    }
}

#[cfg(unix)]
#[test]
fn symlinks_in_the_directory_are_not_followed() {
    use std::os::unix::fs::symlink;
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("target");
    std::fs::write(&target, b"precious").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.bin");
    // Plausible temporary names (this module's pattern without the random part, the old CLI's
    // fixed name, common conventions) and the destination itself, all pointing at `target`.
    let decoys = [
        ".out.bin..tmp",
        ".out.bin.partial",
        ".out.bin.tmp",
        "out.bin.tmp",
        "out.bin.partial",
        "out.bin~",
        ".spark-gguf-.tmp",
    ];
    for d in decoys {
        symlink(&target, dir.path().join(d)).unwrap();
    }
    symlink(&target, &path).unwrap();

    // Refusing mode: the symlink at the destination counts as an existing file.
    let err = AtomicFile::create(&path, Existing::Refuse).unwrap_err();
    assert!(
        matches!(err, GgufError::Exists(ref p) if p == &path),
        "{err}"
    );

    for content in [b"first".as_slice(), b"second"] {
        write_atomically(&path, Existing::Replace, |w| w.write_all(content)).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"precious");
        let meta = path.symlink_metadata().unwrap();
        assert!(
            meta.file_type().is_file(),
            "the destination symlink is replaced"
        );
        assert_eq!(std::fs::read(&path).unwrap(), content);
    }
    for d in decoys {
        let p = dir.path().join(d);
        assert!(p.symlink_metadata().unwrap().is_symlink(), "{d}");
        assert_eq!(std::fs::read_link(&p).unwrap(), target, "{d}");
    }
    let mut want: Vec<String> = decoys.iter().map(|s| s.to_string()).collect();
    want.push("out.bin".into());
    want.sort();
    assert_eq!(names(dir.path()), want);
    assert_eq!(names(outside.path()), ["target"]);
}

#[test]
fn a_writer_dropped_without_commit_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.bin");
    for existing in [Existing::Replace, Existing::Refuse] {
        let mut f = AtomicFile::create(&path, existing).unwrap();
        f.write_all(&[7u8; 3 << 20]).unwrap();
        f.flush().unwrap();
        assert!(f.temp_path().exists());
        assert_eq!(f.path(), path);
        drop(f);
        assert!(!path.exists());
        assert!(names(dir.path()).is_empty(), "{:?}", names(dir.path()));
    }
    // A panic while writing is a drop too.
    let p = path.clone();
    let r = std::thread::spawn(move || {
        let mut f = AtomicFile::create(&p, Existing::Replace).unwrap();
        f.write_all(b"half").unwrap();
        panic!("writer panics");
    })
    .join();
    assert!(r.is_err());
    assert!(names(dir.path()).is_empty(), "{:?}", names(dir.path()));
}

#[test]
fn refusing_mode_keeps_an_existing_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.bin");
    std::fs::write(&path, b"old").unwrap();
    let err = AtomicFile::create(&path, Existing::Refuse).unwrap_err();
    assert!(
        matches!(err, GgufError::Exists(ref p) if p == &path),
        "{err}"
    );
    assert!(err.to_string().contains("out.bin"), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), b"old");
    assert_eq!(names(dir.path()), ["out.bin"]);

    // The file appears between create and commit: commit refuses, nothing is replaced.
    std::fs::remove_file(&path).unwrap();
    let mut f = AtomicFile::create(&path, Existing::Refuse).unwrap();
    f.write_all(b"new").unwrap();
    std::fs::write(&path, b"raced").unwrap();
    let err = f.commit().unwrap_err();
    assert!(
        matches!(err, GgufError::Exists(ref p) if p == &path),
        "{err}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), b"raced");
    assert_eq!(names(dir.path()), ["out.bin"]);

    // With nothing there it writes the file.
    std::fs::remove_file(&path).unwrap();
    write_atomically(&path, Existing::Refuse, |w| w.write_all(b"fresh")).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"fresh");
    assert_eq!(names(dir.path()), ["out.bin"]);
}

#[cfg(unix)]
#[test]
fn committed_files_get_the_usual_permissions() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.bin");
    write_atomically(&path, Existing::Replace, |w| w.write_all(b"x")).unwrap();
    let plain = dir.path().join("plain");
    std::fs::write(&plain, b"x").unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&path), mode(&plain));
}
