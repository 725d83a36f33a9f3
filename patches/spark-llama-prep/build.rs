//! Stages pristine llama-cpp-sys-2 sources with `patches/llama.cpp/*.patch` applied.
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

    // Apply the series to a scratch copy, then sync into the stable directory cmake builds from.
    let stage = out.join("stage");
    if stage.exists() {
        fs::remove_dir_all(&stage).map_err(|e| format!("{}: {e}", stage.display()))?;
    }
    sync_tree(&pristine, &stage).map_err(|e| format!("copy pristine sources: {e}"))?;
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

    let tag = series_tag(&patches, &out)?;
    let generated = format!(
        "/// Directory holding the patched copy of the llama-cpp-sys-2 {SYS_VERSION} crate.\n\
         pub const PATCHED_SYS_DIR: &str = {dir:?};\n\
         /// Names the patched sources: `spark-` and the git blob hash (12 digits) of the pinned\n\
         /// version and every patch. The ggml build reports it as `ggml_commit()`\n\
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

/// `spark-<hash>`: the first 12 digits of the git blob hash of the pinned crate version and
/// each patch's file name and bytes, in series order. Same series, same tag, on any machine.
fn series_tag(patches: &[PathBuf], out: &Path) -> Result<String, String> {
    let mut text = format!("llama-cpp-sys-2 {SYS_VERSION}\n").into_bytes();
    for p in patches {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        text.extend_from_slice(format!("{name}\n").as_bytes());
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
