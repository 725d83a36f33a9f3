//! `spark-gguf`: inspect and validate GGUF files.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use spark_gguf::manifest::{verify, Manifest};
use spark_gguf::schema::Layout;
use spark_gguf::validate::{layout_of, validate};
use spark_gguf::GgufFile;

/// Inspect and validate GGUF files (llama.cpp's rules plus the Spark schema).
#[derive(Parser)]
#[command(name = "spark-gguf", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the header, every metadata key and every tensor.
    Inspect {
        /// The GGUF file.
        file: PathBuf,
        /// Array elements shown before abbreviating.
        #[arg(long, default_value_t = 8)]
        max_elems: usize,
    },
    /// Check the file; print each violation and exit non-zero if there is any. The line of a
    /// valid file names its tensor layout when it is not the default ("attn_qkv stacked",
    /// "ffn_k2v paired", SPEC section 3).
    Validate {
        /// The GGUF file.
        file: PathBuf,
        /// Also check the tensor data against this llama-gguf-hash manifest (the entries that
        /// name FILE's file name); the first tensor that does not match is named.
        #[arg(long, value_name = "MANIFEST")]
        manifest: Option<PathBuf>,
    },
}

fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

fn inspect(f: &GgufFile, max_elems: usize) {
    println!("version: {}", f.version());
    println!("alignment: {}", f.alignment());
    println!("data offset: {}", f.data_offset());
    println!("metadata ({} keys):", f.metadata().len());
    for (k, v) in f.metadata() {
        println!("  {k} [{}] = {}", v.type_name(), v.display(max_elems));
    }
    println!("tensors ({}):", f.tensors().len());
    let mut total_bytes = 0u64;
    let mut total_elems = 0u64;
    for t in f.tensors() {
        println!(
            "  {} {} {:?} {} bytes",
            t.name,
            t.ty.name(),
            t.ne,
            t.n_bytes
        );
        total_bytes = total_bytes.saturating_add(t.n_bytes);
        total_elems = total_elems.saturating_add(t.n_elements());
    }
    println!(
        "total: {} tensors, {} elements, {} bytes ({}), file {} bytes",
        f.tensors().len(),
        total_elems,
        total_bytes,
        human_bytes(total_bytes),
        f.file_size()
    );
}

/// Checks `f` (read from `path`) against the manifest at `manifest`; a summary for the
/// "valid" line.
fn check_manifest(
    f: &GgufFile,
    path: &std::path::Path,
    manifest: &std::path::Path,
) -> Result<String, spark_gguf::GgufError> {
    let m = Manifest::read(manifest)?;
    let v = verify(f, path, &m)?;
    let kinds: Vec<&str> = v.kinds.iter().map(|k| k.name()).collect();
    Ok(format!(
        "; matches {} ({} tensors, {} entries: {})",
        manifest.display(),
        v.tensors,
        v.entries,
        kinds.join(", ")
    ))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (Command::Inspect { file, .. } | Command::Validate { file, .. }) = &cli.command;
    let f = match GgufFile::open(file) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("spark-gguf: {}: {e}", file.display());
            return ExitCode::FAILURE;
        }
    };
    match cli.command {
        Command::Inspect { max_elems, .. } => {
            inspect(&f, max_elems);
            ExitCode::SUCCESS
        }
        Command::Validate { file, manifest } => {
            let violations = validate(&f);
            for v in &violations {
                println!("{}: {v}", file.display());
            }
            if !violations.is_empty() {
                eprintln!(
                    "spark-gguf: {}: {} violation(s)",
                    file.display(),
                    violations.len()
                );
            }
            let matched = match manifest.as_deref().map(|m| check_manifest(&f, &file, m)) {
                None => Some(String::new()),
                Some(Ok(summary)) => Some(summary),
                Some(Err(e)) => {
                    eprintln!("spark-gguf: {e}");
                    None
                }
            };
            match matched {
                Some(summary) if violations.is_empty() => {
                    // a layout other than the default (SPEC section 3) is said
                    let layout = layout_of(&f);
                    let layout = if layout == Layout::default() {
                        String::new()
                    } else {
                        format!(", {layout}")
                    };
                    println!(
                        "{}: valid ({} tensors, {} keys{layout}){summary}",
                        file.display(),
                        f.tensors().len(),
                        f.metadata().len()
                    );
                    ExitCode::SUCCESS
                }
                _ => ExitCode::FAILURE,
            }
        }
    }
}
