//! Stages pristine llama-cpp-sys-2 sources with the project's new llama.cpp files
//! (`patches/llama.cpp/files/`, copied in at their relative paths) and the series of edits to
//! upstream files (`patches/llama.cpp/*.patch`, applied in order). `tools/llama-tree.sh` makes
//! the same tree for reading, editing and building without cargo, and computes the same tag.
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::{env, fs, io};

/// The published llama-cpp-sys-2 version the patch series is written against. Must equal the
/// version of `patches/llama-cpp-sys-2/Cargo.toml`.
const SYS_VERSION: &str = "0.1.161";

fn main() {
    if let Err(e) = run() {
        panic!("spark-llama-prep: {e}");
    }
}

fn run() -> Result<(), String> {
    let out = PathBuf::from(env::var("OUT_DIR").map_err(|e| e.to_string())?);
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").map_err(|e| e.to_string())?);
    let patch_dir = manifest.join("../llama.cpp");
    let patch_dir = patch_dir
        .canonicalize()
        .map_err(|e| format!("{}: {e}", patch_dir.display()))?;
    println!("cargo:rerun-if-changed={}", patch_dir.display());
    println!("cargo:rerun-if-changed=build.rs");

    let pristine = locate_pristine(&out)?;
    let patches = patch_list(&patch_dir)?;
    for p in &patches {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    let files_dir = patch_dir.join("files");
    let files = new_files(&files_dir)?;
    for (_, p) in &files {
        println!("cargo:rerun-if-changed={}", p.display());
    }

    // Apply the series to a scratch copy, then sync into the stable directory cmake builds from.
    let stage = out.join("stage");
    if stage.exists() {
        fs::remove_dir_all(&stage).map_err(|e| format!("{}: {e}", stage.display()))?;
    }
    sync_tree(&pristine, &stage).map_err(|e| format!("copy pristine sources: {e}"))?;
    for (rel, p) in &files {
        let d = stage.join("llama.cpp").join(rel);
        if d.exists() {
            return Err(format!(
                "patches/llama.cpp/files/{rel} is also an upstream file: change it with a patch"
            ));
        }
        if let Some(parent) = d.parent() {
            fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        fs::copy(p, &d).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    for p in &patches {
        let status = Command::new("git")
            // Keep git from discovering an enclosing repository (the project's own checkout).
            .env("GIT_CEILING_DIRECTORIES", &out)
            .current_dir(stage.join("llama.cpp"))
            .args(["apply", "--whitespace=nowarn"])
            .arg(p)
            .status()
            .map_err(|e| format!("run git apply: {e}"))?;
        if !status.success() {
            return Err(format!("patch does not apply: {}", p.display()));
        }
    }
    let dst = out.join("llama-cpp-sys-2");
    sync_tree(&stage, &dst).map_err(|e| format!("sync patched sources: {e}"))?;
    fs::remove_dir_all(&stage).map_err(|e| format!("{}: {e}", stage.display()))?;

    let tag = series_tag(&patches, &files, &out)?;
    let generated = format!(
        "/// Directory holding the patched copy of the llama-cpp-sys-2 {SYS_VERSION} crate.\n\
         pub const PATCHED_SYS_DIR: &str = {dir:?};\n\
         /// Names the patched sources: `spark-` and the git blob hash (12 digits) of the pinned\n\
         /// version, every patch and every new file. The ggml build reports it as `ggml_commit()`\n\
         /// (GGML_BUILD_COMMIT_OVERRIDE, patch 0005) and the plugin checks it when loaded.\n\
         pub const SERIES_TAG: &str = {tag:?};\n\
         /// Expands to the items of the upstream build script (its `fn main` included).\n\
         #[macro_export]\n\
         macro_rules! upstream_build_rs {{ () => {{ include!({bs:?}); }}; }}\n",
        dir = dst.to_str().ok_or("non-UTF-8 OUT_DIR")?,
        bs = dst.join("build.rs").to_str().ok_or("non-UTF-8 OUT_DIR")?,
    );
    fs::write(out.join("generated.rs"), generated).map_err(|e| e.to_string())
}

/// Finds the pristine crate with the ordinary cargo client, which downloads it into the cargo
/// cache when missing. Nothing here names a registry host.
fn locate_pristine(out: &Path) -> Result<PathBuf, String> {
    let probe = out.join("probe");
    fs::create_dir_all(probe.join("src")).map_err(|e| e.to_string())?;
    fs::write(probe.join("src/lib.rs"), "").map_err(|e| e.to_string())?;
    fs::write(
        probe.join("Cargo.toml"),
        format!(
            "[package]\nname = \"spark-llama-probe\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\
             [dependencies]\nllama-cpp-sys-2 = {{ version = \"={SYS_VERSION}\", default-features = false }}\n\
             [workspace]\n"
        ),
    )
    .map_err(|e| e.to_string())?;
    let mut cmd = Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(["metadata", "--format-version", "1", "--manifest-path"])
        .arg(probe.join("Cargo.toml"));
    if env::var("CARGO_NET_OFFLINE").is_ok_and(|v| v == "true") {
        cmd.arg("--offline");
    }
    let o = cmd
        .output()
        .map_err(|e| format!("run cargo metadata: {e}"))?;
    if !o.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    let text = String::from_utf8_lossy(&o.stdout);
    let manifest_path = json_string_values(&text, "manifest_path")
        .into_iter()
        .find(|p| {
            Path::new(p)
                .parent()
                .and_then(Path::file_name)
                .is_some_and(|d| d.to_str() == Some(&format!("llama-cpp-sys-2-{SYS_VERSION}")))
        })
        .ok_or_else(|| format!("llama-cpp-sys-2 {SYS_VERSION} not in cargo metadata"))?;
    Ok(Path::new(&manifest_path)
        .parent()
        .ok_or("manifest path without parent")?
        .to_path_buf())
}

/// Every string value of `"key": "..."` in a JSON text, unescaped. A JSON parser crate would
/// be a dependency of this build-time crate whose features other packages could change (and
/// with them this crate's hash, and a full llama.cpp rebuild); `cargo metadata`'s output needs
/// only this.
fn json_string_values(text: &str, key: &str) -> Vec<String> {
    let needle = format!("\"{key}\":\"");
    let mut values = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(&needle) {
        rest = &rest[i + needle.len()..];
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let mut end = rest.len();
        while let Some((j, c)) = chars.next() {
            match c {
                '"' => {
                    end = j + 1;
                    break;
                }
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, 't')) => value.push('\t'),
                    Some((_, e)) => value.push(e),
                    None => break,
                },
                c => value.push(c),
            }
        }
        values.push(value);
        rest = &rest[end..];
    }
    values
}

/// `spark-<hash>`: the first 12 digits of the git blob hash of the pinned crate version, each
/// patch's file name and bytes in series order, then each new file's relative path (as
/// `files/<path>`) and bytes in path order. Same sources, same tag, on any machine;
/// `tools/llama-tree.sh --tag` computes it the same way.
fn series_tag(
    patches: &[PathBuf],
    files: &[(String, PathBuf)],
    out: &Path,
) -> Result<String, String> {
    let mut text = format!("llama-cpp-sys-2 {SYS_VERSION}\n").into_bytes();
    for p in patches {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        text.extend_from_slice(format!("{name}\n").as_bytes());
        text.extend(fs::read(p).map_err(|e| format!("{}: {e}", p.display()))?);
    }
    for (rel, p) in files {
        text.extend_from_slice(format!("files/{rel}\n").as_bytes());
        text.extend(fs::read(p).map_err(|e| format!("{}: {e}", p.display()))?);
    }
    let input = out.join("series.txt");
    fs::write(&input, &text).map_err(|e| format!("{}: {e}", input.display()))?;
    let o = Command::new("git")
        .env("GIT_CEILING_DIRECTORIES", out)
        .current_dir(out)
        .args(["hash-object", "--no-filters"])
        .arg(&input)
        .output()
        .map_err(|e| format!("run git hash-object: {e}"))?;
    let hash = String::from_utf8_lossy(&o.stdout).trim().to_string();
    if !o.status.success() || hash.len() < 12 {
        return Err(format!(
            "git hash-object failed: {}",
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    Ok(format!("spark-{}", &hash[..12]))
}

fn patch_list(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut list: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "patch"))
        .collect();
    list.sort();
    Ok(list)
}

/// Every file under `dir` (the project's new llama.cpp sources) as (path relative to `dir` with
/// `/` separators, full path), sorted by the relative path's bytes (as `LC_ALL=C sort`).
fn new_files(dir: &Path) -> Result<Vec<(String, PathBuf)>, String> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<(String, PathBuf)>) -> Result<(), String> {
        for entry in fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))? {
            let p = entry.map_err(|e| e.to_string())?.path();
            if p.is_dir() {
                walk(base, &p, out)?;
            } else {
                let rel = p
                    .strip_prefix(base)
                    .map_err(|e| e.to_string())?
                    .components()
                    .map(|c| c.as_os_str().to_str().ok_or("non-UTF-8 file name"))
                    .collect::<Result<Vec<_>, _>>()?
                    .join("/");
                out.push((rel, p));
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    if dir.is_dir() {
        walk(dir, dir, &mut out)?;
    }
    out.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    Ok(out)
}

/// Mirrors `src` into `dst`, writing only files whose bytes differ (unchanged files keep their
/// mtime, so cmake's incremental build stays incremental) and deleting what `src` lacks.
fn sync_tree(src: &Path, dst: &Path) -> io::Result<()> {
    fs::create_dir_all(dst)?;
    let mut seen = HashSet::new();
    for entry in fs::read_dir(src)? {
        let entry = entry?;
        let name = entry.file_name();
        let (s, d) = (entry.path(), dst.join(&name));
        seen.insert(name);
        if entry.file_type()?.is_dir() {
            sync_tree(&s, &d)?;
        } else {
            let bytes = fs::read(&s)?;
            if fs::read(&d).ok().as_deref() != Some(&bytes[..]) {
                fs::write(&d, &bytes)?;
            }
        }
    }
    for entry in fs::read_dir(dst)? {
        let entry = entry?;
        if !seen.contains(&entry.file_name()) {
            let p = entry.path();
            if entry.file_type()?.is_dir() {
                fs::remove_dir_all(p)?;
            } else {
                fs::remove_file(p)?;
            }
        }
    }
    Ok(())
}
