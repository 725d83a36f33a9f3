//! llama-gguf-hash manifests: written by the writer with the file, recomputed from the file by
//! the reader, checked by `spark-gguf validate --manifest` (a corrupted copy, another file's
//! manifest, malformed lines). tests/python/convert/test_manifest.py checks the same files with
//! llama.cpp's own llama-gguf-hash.

mod gguf_helpers;

use std::path::{Path, PathBuf};

use gguf_helpers::*;
use spark_gguf::manifest::{manifest_of, verify, HashKind, Manifest};
use spark_gguf::schema::{Arch, GEMMA2_ARCH, SPARK_ARCH};
use spark_gguf::{GgmlType, GgufFile, GgufWriter};

fn validate_with(file: &Path, manifest: &Path) -> (i32, String, String) {
    run(&[
        "validate".as_ref(),
        "--manifest".as_ref(),
        manifest.as_os_str(),
        file.as_os_str(),
    ])
}

/// The tiny model of `arch` with random data, and its manifest written by the writer.
fn model_with_manifest(dir: &tempfile::TempDir, arch: Arch, seed: u64) -> (PathBuf, PathBuf) {
    let meta = tiny_metadata(arch);
    let plans = tiny_plans(&meta, GgmlType::F32);
    let path = in_dir(dir, &format!("{arch}-{seed}.gguf"));
    let manifest = in_dir(dir, &format!("{arch}-{seed}.gguf.manifest"));
    let mut rng = Rng(seed);
    let mut w = GgufWriter::create(&path, false, &meta, &plans, 32).unwrap();
    w.write_manifest(&manifest).unwrap();
    for p in &plans {
        let n = p.ty.tensor_bytes(&p.ne).unwrap() as usize;
        // in two chunks, as the converter streams
        let data = rng.bytes(n);
        w.write_tensor_chunk(&data[..n / 3]).unwrap();
        w.write_tensor_chunk(&data[n / 3..]).unwrap();
    }
    w.finish().unwrap();
    (path, manifest)
}

fn file_name(p: &Path) -> &str {
    p.file_name().unwrap().to_str().unwrap()
}

#[test]
fn the_written_manifest_is_the_files_and_validates() {
    let dir = tmpdir();
    let (path, manifest) = model_with_manifest(&dir, SPARK_ARCH, 1);
    let text = std::fs::read_to_string(&manifest).unwrap();
    let f = GgufFile::open(&path).unwrap();
    // recomputed from the file through the reader: the same text
    assert_eq!(text, manifest_of(&f, file_name(&path)).unwrap());
    let n = f.tensors().len();
    assert_eq!(text.lines().count(), 3 * n + 3);
    let first = &f.tensors()[0].name;
    assert!(
        text.starts_with("xxh64     ")
            && text
                .lines()
                .next()
                .unwrap()
                .ends_with(&format!("  {}:{first}", file_name(&path))),
        "{text}"
    );
    let m = Manifest::parse(&text, "m").unwrap();
    let v = verify(&f, &path, &m).unwrap();
    assert_eq!(
        (v.tensors, v.entries, v.kinds.clone()),
        (n, 3 * n + 3, HashKind::WRITTEN.to_vec())
    );

    let (code, out, err) = validate_with(&path, &manifest);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        format!(
            "{}: valid ({n} tensors, 29 keys); matches {} ({n} tensors, {} entries: xxh64, sha1, sha256)\n",
            path.display(),
            manifest.display(),
            3 * n + 3
        )
    );
}

#[test]
fn a_corrupted_copy_names_the_first_tensor_that_differs() {
    let dir = tmpdir();
    let (path, manifest) = model_with_manifest(&dir, SPARK_ARCH, 2);
    let f = GgufFile::open(&path).unwrap();
    // 4 KiB of random bytes from the middle of the largest tensor on (it may run on into the
    // next tensors; the first one is named)
    let t = f
        .tensors()
        .iter()
        .max_by_key(|t| t.n_bytes)
        .unwrap()
        .clone();
    let start = (f.data_offset() + t.offset + t.n_bytes / 2) as usize;
    let mut bytes = std::fs::read(&path).unwrap();
    let end = (start + 4096).min(bytes.len());
    let noise = Rng(99).bytes(end - start);
    bytes[start..end].copy_from_slice(&noise);
    drop(f);
    // the copy keeps the file name, in its own directory, beside the manifest's copy
    let copy_dir = tmpdir();
    let copy = copy_dir.path().join(file_name(&path));
    std::fs::write(&copy, &bytes).unwrap();

    let (code, out, err) = validate_with(&copy, &manifest);
    assert_eq!(code, 1, "{out}");
    assert!(!out.contains("valid ("), "{out}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with(&format!(
            "spark-gguf: tensor '{}' of {} does not match {}: its xxh64 is ",
            t.name,
            copy.display(),
            manifest.display()
        )),
        "{err}"
    );
    // structurally the copy is still a valid GGUF: only the manifest tells
    let (code, _, _) = run(&["validate".as_ref(), copy.as_os_str()]);
    assert_eq!(code, 0);

    // one flipped bit in the first tensor: that tensor is named
    let mut bytes = std::fs::read(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();
    let t0 = &f.tensors()[0];
    bytes[(f.data_offset() + t0.offset) as usize] ^= 1;
    std::fs::write(&copy, &bytes).unwrap();
    let c = GgufFile::open(&copy).unwrap();
    let m = Manifest::read(&manifest).unwrap();
    let e = verify(&c, &copy, &m).unwrap_err().to_string();
    assert!(e.starts_with(&format!("tensor '{}' of ", t0.name)), "{e}");
}

#[test]
fn a_manifest_of_another_file_is_refused() {
    let dir = tmpdir();
    let (a, a_manifest) = model_with_manifest(&dir, SPARK_ARCH, 3);
    let (b, _) = model_with_manifest(&dir, GEMMA2_ARCH, 4);
    let (code, out, err) = validate_with(&b, &a_manifest);
    assert_eq!(code, 1, "{out}");
    assert_eq!(
        err,
        format!(
            "spark-gguf: {} has no entry for {} (it is about {}:token_embd.weight, line 1)\n",
            a_manifest.display(),
            file_name(&b),
            file_name(&a)
        )
    );

    // the other file under this one's name: its tensors differ (the gemma2 model has no
    // Spark tensors; the first one the manifest lists and the file lacks is named)
    let other_dir = tmpdir();
    let impostor = other_dir.path().join(file_name(&a));
    std::fs::copy(&b, &impostor).unwrap();
    let (code, _, err) = validate_with(&impostor, &a_manifest);
    assert_eq!(code, 1);
    assert!(
        err.contains("lists tensor 'blk.0.ffn_down_t.weight', which"),
        "{err}"
    );

    // a model with the same tensors but other data under this one's name
    let (c, _) = model_with_manifest(&dir, SPARK_ARCH, 5);
    std::fs::copy(&c, &impostor).unwrap();
    let (code, _, err) = validate_with(&impostor, &a_manifest);
    assert_eq!(code, 1);
    assert!(
        err.starts_with("spark-gguf: tensor 'token_embd.weight' of "),
        "{err}"
    );
}

#[test]
fn missing_and_extra_tensor_entries_are_named() {
    let dir = tmpdir();
    let (path, manifest) = model_with_manifest(&dir, SPARK_ARCH, 6);
    let text = std::fs::read_to_string(&manifest).unwrap();
    let f = GgufFile::open(&path).unwrap();
    let name = file_name(&path);
    let last = &f.tensors().last().unwrap().name;
    let without: String = text
        .lines()
        .filter(|l| !l.ends_with(&format!(":{last}")))
        .map(|l| format!("{l}\n"))
        .collect();
    let e = verify(&f, &path, &Manifest::parse(&without, "m").unwrap())
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        format!("m has no entry for tensor '{last}' of {}", path.display())
    );
    let extra = format!("{text}sha1      {}  {name}:ghost.weight\n", "0".repeat(40));
    let e = verify(&f, &path, &Manifest::parse(&extra, "m").unwrap())
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        format!(
            "m line {}: lists tensor 'ghost.weight', which {} does not have",
            text.lines().count() + 1,
            path.display()
        )
    );
    // only the whole-file lines (llama-gguf-hash --no-layer): checked as a whole
    let whole: String = text
        .lines()
        .filter(|l| l.ends_with(&format!("  {name}")))
        .map(|l| format!("{l}\n"))
        .collect();
    let v = verify(&f, &path, &Manifest::parse(&whole, "m").unwrap()).unwrap();
    assert_eq!((v.tensors, v.entries), (0, 3));
    // a whole-file hash that differs
    let wrong = whole.replacen(&whole[10..26], "0000000000000000", 1);
    let e = verify(&f, &path, &Manifest::parse(&wrong, "m").unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("the tensor data as a whole of ")
            && e.contains("line 1 says 0000000000000000"),
        "{e}"
    );
}

#[test]
fn malformed_manifests_are_named_with_the_line() {
    let dir = tmpdir();
    let (path, manifest) = model_with_manifest(&dir, SPARK_ARCH, 7);
    let mut text = std::fs::read_to_string(&manifest).unwrap();
    text.push_str("sha256    not-a-hash  x.gguf\n");
    let bad = in_dir(&dir, "bad.manifest");
    std::fs::write(&bad, &text).unwrap();
    let (code, out, err) = validate_with(&path, &bad);
    assert_eq!(code, 1, "{out}");
    assert_eq!(
        err,
        format!(
            "spark-gguf: {} line {}: 'not-a-hash' is not a sha256 hash as llama-gguf-hash prints it\n",
            bad.display(),
            text.lines().count()
        )
    );
    let (code, _, err) = validate_with(&path, &in_dir(&dir, "none.manifest"));
    assert_eq!(code, 1);
    assert!(err.contains("none.manifest: cannot read"), "{err}");
}

#[test]
fn the_manifest_is_committed_with_the_file_or_not_at_all() {
    let dir = tmpdir();
    let meta = tiny_metadata(SPARK_ARCH);
    let plans = tiny_plans(&meta, GgmlType::F32);
    let path = in_dir(&dir, "m.gguf");
    let manifest = in_dir(&dir, "m.gguf.manifest");
    let sizes: Vec<usize> = plans
        .iter()
        .map(|p| p.ty.tensor_bytes(&p.ne).unwrap() as usize)
        .collect();

    // an unfinished file: neither appears
    let mut w = GgufWriter::create(&path, false, &meta, &plans, 32).unwrap();
    w.write_manifest(&manifest).unwrap();
    w.write_tensor(&vec![0; sizes[0]]).unwrap();
    assert!(w
        .finish()
        .unwrap_err()
        .to_string()
        .contains("not written in full"));
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");

    // an existing manifest is refused unless the writer may overwrite, before anything is done
    std::fs::write(&manifest, b"old").unwrap();
    let mut w = GgufWriter::create(&path, false, &meta, &plans, 32).unwrap();
    let e = w.write_manifest(&manifest).unwrap_err().to_string();
    assert!(e.contains("output file exists"), "{e}");
    drop(w);
    assert!(!path.exists());
    let mut w = GgufWriter::create(&path, true, &meta, &plans, 32).unwrap();
    w.write_manifest(&manifest).unwrap();
    for &n in &sizes {
        w.write_tensor(&vec![1; n]).unwrap();
    }
    w.finish().unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(
        std::fs::read_to_string(&manifest).unwrap(),
        manifest_of(&f, "m.gguf").unwrap()
    );

    // the manifest must be asked for before any data, and cannot name spaces
    let mut w = GgufWriter::create(&path, true, &meta, &plans, 32).unwrap();
    w.write_tensor(&vec![0; sizes[0]]).unwrap();
    let e = w.write_manifest(&manifest).unwrap_err().to_string();
    assert!(e.contains("before any tensor data"), "{e}");
    let spaced = in_dir(&dir, "my model.gguf");
    let mut w = GgufWriter::create(&spaced, true, &meta, &plans, 32).unwrap();
    let e = w.write_manifest(&manifest).unwrap_err().to_string();
    assert!(e.contains("\"my model.gguf\""), "{e}");
}
