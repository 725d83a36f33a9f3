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
    for kernel in spark_backend::ffn::cuda_plan::FfnKernel::ALL.map(|k| k.name()) {
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

/// What ptxas -v says of one function: its register count and spilled bytes.
#[derive(Debug, Default)]
struct PtxasInfo {
    registers: u32,
    spill_stores: u32,
    spill_loads: u32,
}

/// The number before `what` in `line` ("0 bytes spill stores" -> 0 for "bytes spill stores").
fn number_before(line: &str, what: &str) -> Option<u32> {
    let head = &line[..line.find(what)?];
    head.split([' ', ','])
        .rev()
        .find(|w| !w.is_empty())?
        .parse()
        .ok()
}

/// Parses ptxas -v's report: "Function properties for F" followed by "N bytes stack frame, N
/// bytes spill stores, N bytes spill loads"; "Compiling entry function 'F'" followed by "Used N
/// registers". Device functions that were not inlined have properties too.
fn parse_ptxas_report(report: &str) -> std::collections::BTreeMap<String, PtxasInfo> {
    let mut out = std::collections::BTreeMap::<String, PtxasInfo>::new();
    let mut current: Option<String> = None;
    for line in report.lines() {
        if let Some(f) = line.split("Function properties for ").nth(1) {
            current = Some(f.trim().to_owned());
        } else if let Some(f) = line.split("Compiling entry function '").nth(1) {
            current = f.split('\'').next().map(str::to_owned);
        }
        let Some(f) = current.clone() else { continue };
        let info = out.entry(f).or_default();
        if let Some(n) = number_before(line, "bytes spill stores") {
            info.spill_stores = n;
        }
        if let Some(n) = number_before(line, "bytes spill loads") {
            info.spill_loads = n;
        }
        if let Some(n) = number_before(line, "registers") {
            info.registers = n;
        }
    }
    out
}

#[test]
fn the_ptxas_report_parser_reads_spills_and_registers() {
    let report = "ptxas info    : 0 bytes gmem\n\
        ptxas info    : Compiling entry function 'k_a' for 'sm_90'\n\
        ptxas info    : Function properties for k_a\n    \
        8 bytes stack frame, 12 bytes spill stores, 4 bytes spill loads\n\
        ptxas info    : Used 255 registers, used 1 barriers, 380 bytes cmem[0]\n\
        ptxas info    : Compiling entry function 'k_b' for 'sm_90'\n\
        ptxas info    : Function properties for k_b\n    \
        0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
        ptxas info    : Used 32 registers, used 0 barriers, 380 bytes cmem[0]\n";
    let got = parse_ptxas_report(report);
    let a = &got["k_a"];
    assert_eq!((a.registers, a.spill_stores, a.spill_loads), (255, 12, 4));
    let b = &got["k_b"];
    assert_eq!((b.registers, b.spill_stores, b.spill_loads), (32, 0, 0));
    assert_eq!(got.len(), 2, "{got:?}");
}

/// The `.entry` names of a PTX text.
fn ptx_entries(ptx: &str) -> Vec<String> {
    ptx.lines()
        .filter_map(|l| l.split(".entry ").nth(1))
        .map(|rest| rest.split(['(', ' ']).next().unwrap_or("").to_owned())
        .collect()
}

/// Every kernel of every .cu file, as NVRTC's PTX for compute_75/80/90 with the launchers'
/// options, assembled by ptxas for the same sm: no register spills (a spill turns register
/// traffic into local-memory traffic, which a bandwidth-bound kernel cannot afford). ptxas is
/// CUDA 13.0's from PyPI (`$SPARK_CUDA_TOOLKIT/bin/ptxas`, `source target/cuda-tools/env.sh`),
/// the assembler NVRTC and the driver run on the same PTX. Each kernel's registers are printed
/// (`--nocapture`).
#[test]
fn no_kernel_spills_registers_on_sm_75_80_90() {
    require_nvrtc();
    let toolkit = std::env::var("SPARK_CUDA_TOOLKIT").unwrap_or_else(|_| {
        panic!("SPARK_CUDA_TOOLKIT is not set: `source target/cuda-tools/env.sh` (tools/cuda-tools.sh)")
    });
    let ptxas = Path::new(&toolkit).join("bin").join("ptxas");
    for (name, text) in files("cu") {
        let source = CudaSource {
            name: leak(name.clone()),
            text: leak(text),
        };
        for (major, minor) in ARCHS {
            let target = Target {
                major,
                minor,
                cubin: false,
            };
            let image = compile(&source, target)
                .unwrap_or_else(|e| panic!("{name} for {}: {e}", target.arch()));
            let ptx = String::from_utf8_lossy(&image.bytes)
                .trim_end_matches('\0')
                .to_owned();
            let sm = format!("sm_{major}{minor}");
            let path = std::env::temp_dir().join(format!(
                "spark-ptxas-{}-{}-{sm}.ptx",
                std::process::id(),
                name.trim_end_matches(".cu")
            ));
            std::fs::write(&path, &ptx).expect("write the PTX");
            let run = std::process::Command::new(&ptxas)
                .args(["-v", &format!("-arch={sm}"), "-o", "/dev/null"])
                .arg(&path)
                .output();
            let _ = std::fs::remove_file(&path);
            let run = run.unwrap_or_else(|e| panic!("{}: {e}", ptxas.display()));
            let report = String::from_utf8_lossy(&run.stderr).into_owned()
                + &String::from_utf8_lossy(&run.stdout);
            assert!(run.status.success(), "ptxas {name} {sm}:\n{report}");
            let info = parse_ptxas_report(&report);
            let entries = ptx_entries(&ptx);
            assert!(!entries.is_empty(), "{name}: no .entry in the PTX");
            for entry in &entries {
                let k = info.get(entry).unwrap_or_else(|| {
                    panic!("{name} {sm}: ptxas said nothing of {entry}:\n{report}")
                });
                println!("{sm} {entry}: {} registers", k.registers);
                assert!(
                    k.registers > 0,
                    "{name} {sm} {entry}: no register count in\n{report}"
                );
            }
            for (f, k) in &info {
                assert_eq!(
                    (k.spill_stores, k.spill_loads),
                    (0, 0),
                    "{name} {sm}: {f} spills registers ({} bytes stored, {} loaded)",
                    k.spill_stores,
                    k.spill_loads
                );
            }
        }
    }
}

/// Programmatic dependent launch: on sm_90 every kernel of every file begins by waiting for the
/// grid before it (`griddepcontrol.wait`, then `griddepcontrol.launch_dependents`: common.cuh's
/// `spark_pdl_enter`, attn.cu's `spark_attn_pdl_enter`), since the launchers set the attribute
/// there; below sm_90, where the instruction does not exist, no kernel has it.
#[test]
fn on_sm_90_every_kernel_waits_for_the_grid_before_it() {
    require_nvrtc();
    for src in KERNEL_SOURCES {
        let ptx = |major, minor| {
            let image = compile(
                src,
                Target {
                    major,
                    minor,
                    cubin: false,
                },
            )
            .unwrap_or_else(|e| panic!("{}: {e}", src.name));
            String::from_utf8_lossy(&image.bytes).into_owned()
        };
        let sm90 = ptx(9, 0);
        let entries = ptx_entries(&sm90);
        assert!(!entries.is_empty(), "{}: no kernels", src.name);
        for name in &entries {
            // the entry's body: from its name to the next entry
            let at = sm90.find(&format!(".entry {name}(")).unwrap();
            let body = &sm90[at..];
            let body = &body[..body[1..].find(".entry ").map_or(body.len(), |n| n + 1)];
            let wait = body.find("griddepcontrol.wait");
            let first_load = body.find("ld.global");
            assert!(
                wait.is_some(),
                "{}: {name} does not wait for the grid before it",
                src.name
            );
            assert!(
                first_load.is_none_or(|l| wait.unwrap() < l),
                "{}: {name} reads global memory before griddepcontrol.wait",
                src.name
            );
            assert!(body.contains("griddepcontrol.launch_dependents"), "{name}");
        }
        assert!(!ptx(8, 0).contains("griddepcontrol"), "{}: sm_80", src.name);
    }
}
