//! Reading `.npz` archives (numpy's zip of `.npy` members) without loading them whole.
//!
//! The archive is memory-mapped. A stored member's array bytes are borrowed in place from the
//! map (after the zip local header and the NPY header; they are not aligned, so readers decode
//! with `from_le_bytes`). A deflated member is stream-decoded into one buffer when asked for, so
//! peak memory stays near the largest member, never the whole checkpoint.

use std::io::{Cursor, Read};
use std::ops::Deref;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use zip::{CompressionMethod, ZipArchive};

use crate::error::{Error, Result};
use crate::npy::{self, NpyHeader, NPY_PREAMBLE_LEN};

/// One array in the archive.
#[derive(Clone, Debug)]
pub struct Member {
    /// Entry name as numpy wrote it, without the `.npy` suffix.
    pub name: String,
    /// The parsed NPY header.
    pub header: NpyHeader,
    index: usize,
    stored: bool,
    data_start: usize,
}

/// An opened `.npz` checkpoint.
pub struct Npz {
    path: PathBuf,
    map: Mmap,
    members: Vec<Member>,
}

/// The data bytes of one member: borrowed from the map, or decoded into memory.
pub enum ArrayBytes<'a> {
    /// A stored member, read in place.
    Mapped(&'a [u8]),
    /// A deflated member, decoded.
    Owned(Vec<u8>),
}

impl Deref for ArrayBytes<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            ArrayBytes::Mapped(s) => s,
            ArrayBytes::Owned(v) => v,
        }
    }
}

fn zip_error(path: &Path, e: zip::result::ZipError) -> Error {
    Error::archive(path, format!("not a readable .npz (zip) archive: {e}"))
}

impl Npz {
    /// Opens `path`, lists its members and parses every member's NPY header.
    pub fn open(path: &Path) -> Result<Npz> {
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the map is read-only and private to this process. Another process truncating
        // or rewriting the checkpoint while we convert it would change what we read (or raise
        // SIGBUS); that is the usual contract of converters that map their input, and the
        // bytes are only ever decoded, never trusted as Rust values.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        let mut members = Vec::new();
        {
            let mut archive =
                ZipArchive::new(Cursor::new(&map[..])).map_err(|e| zip_error(path, e))?;
            for index in 0..archive.len() {
                let (full_name, method, data_start, compressed, size) = {
                    let f = archive
                        .by_index_raw(index)
                        .map_err(|e| zip_error(path, e))?;
                    (
                        f.name().to_string(),
                        f.compression(),
                        f.data_start(),
                        f.compressed_size(),
                        f.size(),
                    )
                };
                let name = full_name
                    .strip_suffix(".npy")
                    .ok_or_else(|| Error::entry(&full_name, "is not a .npy member"))?
                    .to_string();
                let stored = match method {
                    CompressionMethod::Stored => true,
                    CompressionMethod::Deflated => false,
                    other => {
                        return Err(Error::entry(
                            &name,
                            format!("uses zip compression {other}; only stored or deflated members are supported"),
                        ))
                    }
                };
                let end = data_start.checked_add(compressed);
                if end.is_none_or(|e| e > map.len() as u64) {
                    return Err(Error::archive(
                        path,
                        format!("truncated: member '{name}' runs past the end of the file"),
                    ));
                }
                // A stored member's bytes are read in place, so both sizes must describe them.
                if stored && compressed != size {
                    return Err(Error::archive(
                        path,
                        format!("member '{name}' is stored, but its zip entry gives {compressed} stored bytes and a size of {size}"),
                    ));
                }
                let header = if stored {
                    let bytes = &map[data_start as usize..(data_start + compressed) as usize];
                    npy::parse_header(&name, bytes)?
                } else {
                    let mut f = archive.by_index(index).map_err(|e| zip_error(path, e))?;
                    read_deflated_header(&name, &mut f)?
                };
                let expected = header
                    .data_len()
                    .and_then(|n| (header.data_offset as u64).checked_add(n as u64));
                if expected != Some(size) {
                    return Err(Error::entry(
                        &name,
                        format!(
                            "holds {size} bytes but its header (shape {:?}, {}) needs {}",
                            header.shape,
                            header.dtype.describe(),
                            expected.map_or_else(|| "more than 2^64".into(), |e| e.to_string())
                        ),
                    ));
                }
                members.push(Member {
                    name,
                    header,
                    index,
                    stored,
                    data_start: data_start as usize,
                });
            }
        }
        Ok(Npz {
            path: path.to_path_buf(),
            map,
            members,
        })
    }

    /// Every member, in archive order.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// The member called `name` (without `.npy`).
    pub fn member(&self, name: &str) -> Option<&Member> {
        self.members.iter().find(|m| m.name == name)
    }

    /// The array bytes of `member` (after its NPY header): in place if stored, decoded if
    /// deflated (the zip CRC is checked then).
    pub fn data(&self, member: &Member) -> Result<ArrayBytes<'_>> {
        let len = member.header.data_len().unwrap_or(usize::MAX);
        if member.stored {
            let start = member.data_start + member.header.data_offset;
            // Start reading the whole member ahead of the (possibly strided) accesses; this is
            // only a hint, so failure is ignored.
            let _ = self.map.advise_range(memmap2::Advice::WillNeed, start, len);
            return Ok(ArrayBytes::Mapped(&self.map[start..start + len]));
        }
        let mut archive =
            ZipArchive::new(Cursor::new(&self.map[..])).map_err(|e| zip_error(&self.path, e))?;
        let mut f = archive
            .by_index(member.index)
            .map_err(|e| zip_error(&self.path, e))?;
        let mut skip = vec![0u8; member.header.data_offset];
        f.read_exact(&mut skip)
            .map_err(|e| corrupt(&member.name, e))?;
        let mut data = Vec::new();
        data.try_reserve_exact(len)
            .map_err(|_| Error::entry(&member.name, format!("cannot allocate {len} bytes")))?;
        data.resize(len, 0);
        f.read_exact(&mut data)
            .map_err(|e| corrupt(&member.name, e))?;
        // Reading to the end makes the zip reader check the CRC.
        let mut rest = Vec::new();
        f.read_to_end(&mut rest)
            .map_err(|e| corrupt(&member.name, e))?;
        if !rest.is_empty() {
            return Err(Error::entry(
                &member.name,
                "has more data than its header says",
            ));
        }
        Ok(ArrayBytes::Owned(data))
    }
}

impl Npz {
    /// Drops the mapped pages of a stored `member` from this process once it has been used, so
    /// resident memory stays near one member rather than the whole checkpoint (the kernel's page
    /// cache keeps them if memory allows). Does nothing for deflated members.
    pub fn release(&self, member: &Member) {
        if !member.stored {
            return;
        }
        let len = member.header.data_offset + member.header.data_len().unwrap_or(0);
        // SAFETY: the map is a private, read-only mapping of a file that this process never
        // writes through it. MADV_DONTNEED on such a mapping only discards the resident pages;
        // the next access faults the same bytes back in from the file, so any slice still
        // borrowed from the range keeps reading identical values. Failure is harmless (the
        // pages simply stay resident), so the result is ignored.
        let _ = unsafe {
            self.map.unchecked_advise_range(
                memmap2::UncheckedAdvice::DontNeed,
                member.data_start,
                len,
            )
        };
    }
}

fn corrupt(name: &str, e: std::io::Error) -> Error {
    Error::entry(
        name,
        format!("cannot be decompressed (corrupt or truncated): {e}"),
    )
}

fn read_deflated_header(name: &str, f: &mut impl Read) -> Result<NpyHeader> {
    let mut pre = [0u8; NPY_PREAMBLE_LEN];
    f.read_exact(&mut pre[..10]).map_err(|e| corrupt(name, e))?;
    if pre[6] != 1 {
        f.read_exact(&mut pre[10..12])
            .map_err(|e| corrupt(name, e))?;
    }
    let n = if pre[6] == 1 { 10 } else { 12 };
    let total = npy::header_len(name, &pre[..n])?;
    // The length field may claim up to 4 GiB: read what is really there rather than allocating
    // that much up front.
    let mut all = pre[..n].to_vec();
    f.take((total - n) as u64)
        .read_to_end(&mut all)
        .map_err(|e| corrupt(name, e))?;
    if all.len() < total {
        return Err(Error::entry(name, "truncated .npy header"));
    }
    npy::parse_header(name, &all)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use zip::write::SimpleFileOptions;

    fn npy_f32(shape: &[usize], values: &[f32]) -> Vec<u8> {
        let mut v = npy::header("<f4", shape);
        for x in values {
            v.extend_from_slice(&x.to_le_bytes());
        }
        v
    }

    fn write_zip(path: &Path, members: &[(&str, Vec<u8>, CompressionMethod)]) {
        let mut z = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
        for (name, data, method) in members {
            z.start_file(
                *name,
                SimpleFileOptions::default().compression_method(*method),
            )
            .unwrap();
            z.write_all(data).unwrap();
        }
        z.finish().unwrap();
    }

    #[test]
    fn reads_stored_and_deflated_members() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.npz");
        let a: Vec<f32> = (0..6).map(|x| x as f32 * 0.5).collect();
        let b: Vec<f32> = (0..1000).map(|x| (x as f32).sin()).collect();
        write_zip(
            &path,
            &[
                ("x/a.npy", npy_f32(&[2, 3], &a), CompressionMethod::Stored),
                ("y/b.npy", npy_f32(&[1000], &b), CompressionMethod::Deflated),
            ],
        );
        let npz = Npz::open(&path).unwrap();
        assert_eq!(npz.members().len(), 2);
        let ma = npz.member("x/a").unwrap();
        assert_eq!(ma.header.shape, vec![2, 3]);
        let da = npz.data(ma).unwrap();
        assert!(matches!(da, ArrayBytes::Mapped(_)));
        let got: Vec<f32> = da
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(got, a);
        let mb = npz.member("y/b").unwrap();
        let db = npz.data(mb).unwrap();
        assert!(matches!(db, ArrayBytes::Owned(_)));
        let got: Vec<f32> = db
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(got, b);
        npz.release(ma);
        assert_eq!(npz.data(ma).unwrap().len(), 24);
    }

    #[test]
    fn rejects_bad_archives_and_members() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.npz");
        std::fs::write(&path, b"plain text, not a zip").unwrap();
        let e = Npz::open(&path).err().unwrap().to_string();
        assert!(e.contains("a.npz") && e.contains("zip"), "{e}");

        let mut short = npy_f32(&[2, 3], &[1.0; 6]);
        short.truncate(short.len() - 4);
        write_zip(&path, &[("w.npy", short, CompressionMethod::Stored)]);
        let e = Npz::open(&path).err().unwrap().to_string();
        assert!(e.contains("'w'") && e.contains("needs"), "{e}");

        write_zip(
            &path,
            &[("w.txt", b"hello".to_vec(), CompressionMethod::Stored)],
        );
        assert!(Npz::open(&path)
            .err()
            .unwrap()
            .to_string()
            .contains("not a .npy member"));

        write_zip(
            &path,
            &[(
                "w.npy",
                npy_f32(&[64], &[2.0; 64]),
                CompressionMethod::Stored,
            )],
        );
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
        assert!(Npz::open(&path).is_err());
        assert!(Npz::open(&dir.path().join("missing.npz"))
            .err()
            .unwrap()
            .to_string()
            .contains("missing.npz"));
    }

    /// Byte offset of the first central directory record of `bytes`.
    fn central_directory(bytes: &[u8]) -> usize {
        bytes.windows(4).position(|w| w == b"PK\x01\x02").unwrap()
    }

    #[test]
    fn rejects_stored_members_whose_sizes_disagree() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.npz");
        write_zip(
            &path,
            &[(
                "w.npy",
                npy_f32(&[64], &[2.0; 64]),
                CompressionMethod::Stored,
            )],
        );
        let good = std::fs::read(&path).unwrap();
        assert!(Npz::open(&path).is_ok());
        // The central directory's compressed size (offset 20) 4 bytes short of the size.
        let mut bytes = good.clone();
        let cd = central_directory(&bytes);
        let c = u32::from_le_bytes(bytes[cd + 20..cd + 24].try_into().unwrap());
        bytes[cd + 20..cd + 24].copy_from_slice(&(c - 4).to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        let e = Npz::open(&path).err().unwrap().to_string();
        assert!(
            e.contains("a.npz") && e.contains("'w'") && e.contains("stored"),
            "{e}"
        );
    }

    #[test]
    fn rejects_sizes_beyond_64_bits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.npz");
        // 4 * (2^62 - 1) data bytes fit in a usize; with the header they do not fit in a u64.
        let header = npy::header("<f4", &[usize::MAX / 4]);
        write_zip(&path, &[("w.npy", header, CompressionMethod::Stored)]);
        let e = Npz::open(&path).err().unwrap().to_string();
        assert!(e.contains("'w'") && e.contains("more than 2^64"), "{e}");
    }

    #[test]
    fn deflated_headers_that_claim_more_than_they_hold_are_truncated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.npz");
        // A version 2.0 header whose length field claims 4 GiB.
        let mut member = b"\x93NUMPY\x02\x00\xff\xff\xff\xff".to_vec();
        member.extend_from_slice(&[b' '; 100]);
        write_zip(&path, &[("w.npy", member, CompressionMethod::Deflated)]);
        let e = Npz::open(&path).err().unwrap().to_string();
        assert!(e.contains("'w'") && e.contains("truncated"), "{e}");
    }
}
