//! Every CUDA kernel source compiles through NVRTC (no GPU needed) for the architectures the
//! project supports, with exactly the options and `-D` macros the launchers use at run time.
//! Needs libnvrtc: `bash tools/cuda-tools.sh`, `source target/cuda-tools/env.sh`,
//! `export LD_LIBRARY_PATH=$SPARK_NVRTC_LIB` (tests/run.sh does this). Fails, not skips,
//! without it.
#![cfg(feature = "cuda")]

use spark_backend::cuda::driver::{compile, nvrtc_version};
use spark_backend::cuda::options::Target;
use spark_backend::cuda::{CudaSource, HEADERS};
use spark_backend::registry::KERNEL_SOURCES;
use std::path::{Path, PathBuf};

/// sm_75 (Turing, the paper's T4), sm_80 (Ampere), sm_90 (Hopper: the lent H100/H200).
const ARCHS: [(i32, i32); 3] = [(7, 5), (8, 0), (9, 0)];

fn require_nvrtc() -> String {
    nvrtc_version().unwrap_or_else(|e| {
        panic!(
            "the cuda tests need NVRTC: {e}. Install it with `bash tools/cuda-tools.sh`, then \
             `source target/cuda-tools/env.sh && export LD_LIBRARY_PATH=$SPARK_NVRTC_LIB`"
        )
    })
}

fn kernels_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every file under `dir` (recursively).
fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.expect("dir entry").path();
        if p.is_dir() {
            walk(&p, out);
        } else {
            out.push(p);
        }
    }
}

/// The files under `src` ending in `ext` (the kernels live next to their op), sorted by name.
fn files(ext: &str) -> Vec<(String, String)> {
    let mut paths = Vec::new();
    walk(&kernels_dir(), &mut paths);
    let mut out: Vec<(String, String)> = paths
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&p).expect("kernel source");
            (name, text)
        })
        .collect();
    out.sort();
    out
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

#[test]
fn nvrtc_is_cuda_13() {
    let v = require_nvrtc();
    assert!(
        v.starts_with("13."),
        "NVRTC {v}: tools/cuda-tools.sh pins CUDA 13.0"
    );
}

#[test]
fn every_kernel_file_compiles_to_cubin_and_ptx_for_sm_75_80_90() {
    require_nvrtc();
    let sources = files("cu");
    assert!(
        !sources.is_empty(),
        "no .cu files in {}",
        kernels_dir().display()
    );
    for (name, text) in sources {
        let source = CudaSource {
            name: leak(name.clone()),
            text: leak(text),
        };
        for (major, minor) in ARCHS {
            for cubin in [true, false] {
                let target = Target {
                    major,
                    minor,
                    cubin,
                };
                let image = compile(&source, target)
                    .unwrap_or_else(|e| panic!("{name} for {}: {e}", target.arch()));
                assert!(!image.bytes.is_empty(), "{name} {}", target.arch());
                if cubin {
                    assert_eq!(
                        &image.bytes[..4],
                        b"\x7fELF",
                        "{name}: CUBIN is an ELF image"
                    );
                }
            }
        }
    }
}

#[test]
fn the_tables_embed_every_kernel_file_as_it_is_on_disk() {
    for (ext, table) in [("cu", KERNEL_SOURCES), ("cuh", HEADERS)] {
        let on_disk = files(ext);
        let names: Vec<&str> = on_disk.iter().map(|(n, _)| n.as_str()).collect();
        let mut listed: Vec<&str> = table.iter().map(|s| s.name).collect();
        listed.sort();
        assert_eq!(
            listed, names,
            "registry::KERNEL_SOURCES / cuda::HEADERS vs src/**/*.{ext}"
        );
        for (name, text) in &on_disk {
            let embedded = table.iter().find(|s| s.name == name).unwrap();
            assert_eq!(embedded.text, text, "{name}");
        }
    }
}

#[test]
fn the_ffn_module_defines_every_kernel_the_launchers_use() {
    require_nvrtc();
    let ffn = KERNEL_SOURCES.iter().find(|s| s.name == "ffn.cu").unwrap();
    let ptx = compile(
        ffn,
        Target {
            major: 9,
            minor: 0,
            cubin: false,
        },
    )
    .unwrap();
    let text = String::from_utf8_lossy(&ptx.bytes);
    for kernel in [
        "spark_ffn_threshold",
        "spark_ffn_up",
        "spark_ffn_compact",
        "spark_ffn_v_sparse",
        "spark_ffn_v_tiled",
        "spark_ffn_sum",
    ] {
        assert!(
            text.contains(&format!(".entry {kernel}(")),
            "{kernel} missing from the PTX"
        );
    }
    // No float atomics in the FFN path (determinism).
    assert!(!text.contains("atom.global.add.f32") && !text.contains("red.global.add.f32"));
}

#[test]
fn a_layout_that_disagrees_with_ggml_fails_to_compile() {
    require_nvrtc();
    // The static_asserts of common.cuh are live: the same header with a wrong block size.
    let broken = HEADERS[0].text.replace(
        "struct block_q8_0 { u16 d; s8 qs[32]; };",
        "struct block_q8_0 { u16 d; s8 qs[33]; };",
    );
    assert_ne!(
        broken, HEADERS[0].text,
        "the q8_0 struct moved: update this test"
    );
    let source = CudaSource {
        name: "broken.cu",
        text: leak(broken + "\nextern \"C\" __global__ void k() {}\n"),
    };
    let e = compile(
        &source,
        Target {
            major: 8,
            minor: 0,
            cubin: true,
        },
    )
    .expect_err("a wrong q8_0 layout must not compile");
    assert!(e.contains("q8_0 layout"), "{e}");
}
