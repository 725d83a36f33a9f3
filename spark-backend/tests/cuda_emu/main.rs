//! The CUDA attention kernels (src/attention/attn.cu) run on the CPU: g++ compiles the .cu
//! unchanged through a small CUDA emulation header (emu.h: one fiber per CUDA thread of a block,
//! barriers for `__syncthreads` and warp shuffles), and the launch sequence planned by
//! `spark_backend::attention::cuda_plan::AttnPlan` runs over a memory image holding the tensors and
//! the scratch. The kept positions of every query must equal the CPU kernel's exactly, and the
//! outputs must agree with the CPU kernel to f32 rounding; the two selection paths (one launch
//! for few queries, select then output for more) must leave the same bytes. This checks the kernels' logic
//! (indexing, GQA, streams, masks, thresholds, compaction, chunking) without a GPU; it says
//! nothing about speed, occupancy or races that only a real warp schedule would expose.
//!
//! The FFN kernels (src/ffn/ffn.cu) get the same treatment in `ffn.rs`, the rotary embedding
//! (src/rope/rope.cu) in `rope.rs` (modules below).
//!
//! Skipped (with a line on stderr) when there is no `g++`; it needs C++20's `<barrier>` (GCC 11+).

#![cfg(feature = "cuda")]

#[path = "../attention_helpers/mod.rs"]
mod attention_helpers;
mod ffn;
#[path = "../ffn_helpers/mod.rs"]
mod ffn_helpers;
mod rope;

use attention_helpers::{Case, MaskKind, Spec, Ty};
use spark_backend::attention::cuda_plan::{AttnKernel, AttnPlan};
use spark_backend::attention::AttnCall;
use spark_backend::tensor::TensorView;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// Builds an emulator from `cpp` (in tests/cuda_emu) into `exe` (in the target's temporary
/// directory), once per `cell`: g++ with C++20, the -D type macros NVRTC gets
/// (`options::type_macros`) and src/cuda on the include path. `None` when there is no g++ (a
/// failed compilation is a test failure: it may be the kernel's fault).
fn build_emulator(
    cell: &'static OnceLock<Option<PathBuf>>,
    cpp: &str,
    exe: &str,
) -> Option<&'static PathBuf> {
    cell.get_or_init(|| {
        let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let exe = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(exe);
        if let Err(e) = Command::new("g++").arg("--version").output() {
            eprintln!("cuda_emu {cpp}: skipped, no g++ ({e})");
            return None;
        }
        let out = Command::new("g++")
            .args(["-std=c++20", "-O1", "-pthread", "-Wno-unknown-pragmas"])
            .args(spark_backend::cuda::options::type_macros())
            .arg("-I")
            .arg(manifest.join("src/cuda"))
            .arg("-o")
            .arg(&exe)
            .arg(manifest.join("tests/cuda_emu").join(cpp))
            .output();
        match out {
            Ok(o) if o.status.success() => Some(exe),
            Ok(o) => panic!(
                "g++ could not build {cpp} (C++20 <barrier> needed):\n{}",
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => panic!("g++: {e}"),
        }
    })
    .as_ref()
}

/// The attention emulator.
fn emulator() -> Option<&'static PathBuf> {
    static EXE: OnceLock<Option<PathBuf>> = OnceLock::new();
    build_emulator(&EXE, "attn_emu.cpp", "spark_attn_emu")
}

/// A memory image: regions at 256-byte aligned offsets (offset 0 unused, so no address is 0).
pub(crate) struct Image {
    pub(crate) bytes: Vec<u8>,
}

impl Image {
    pub(crate) fn new() -> Self {
        Image {
            bytes: vec![0; 256],
        }
    }
    pub(crate) fn push(&mut self, data: &[u8]) -> usize {
        let off = self.bytes.len().div_ceil(256) * 256;
        self.bytes.resize(off, 0);
        self.bytes.extend_from_slice(data);
        off
    }
}

/// Runs emulator `exe` on a job (memory image + launches, written to a file), returns the
/// memory image after the launches. `name` keeps the files of different emulators apart.
/// A seed of a shuffled block order (emu.h `emu_block_order`).
const SHUFFLED: u64 = 0x5eed_b10c;

/// Runs `job` again with its blocks shuffled and asserts the memory image after it, scratch
/// included, equals `in_order` (the image with blocks in order) byte for byte: no kernel's
/// output may depend on the order its blocks run in.
fn same_in_any_block_order(exe: &PathBuf, name: &str, job: &[u8], in_order: &[u8]) {
    let shuffled = run_job(exe, name, job, SHUFFLED);
    assert_eq!(shuffled.len(), in_order.len());
    if let Some(i) = shuffled.iter().zip(in_order).position(|(a, b)| a != b) {
        panic!("{name}: byte {i} of the memory image differs when the blocks run in another order");
    }
}

/// Runs one job file through the emulator `exe`, its blocks in the order `order` seeds (emu.h's
/// `emu_block_order`: 0 in order, else a shuffle); returns the memory image after the launches.
fn run_job(exe: &PathBuf, name: &str, job: &[u8], order: u64) -> Vec<u8> {
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let tag = format!("{}_{:?}", std::process::id(), std::thread::current().id())
        .replace(|c: char| !c.is_ascii_alphanumeric(), "_");
    let job_path = tmp.join(format!("{name}_job_{tag}"));
    let out_path = tmp.join(format!("{name}_out_{tag}"));
    std::fs::write(&job_path, job).unwrap();
    let st = Command::new(exe)
        .arg(&job_path)
        .arg(&out_path)
        .arg(order.to_string())
        .status()
        .unwrap();
    assert!(st.success(), "emulator failed: {st}");
    let mem = std::fs::read(&out_path).unwrap();
    let _ = std::fs::remove_file(&job_path);
    let _ = std::fs::remove_file(&out_path);
    mem
}

fn as_bytes(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A view of `host` with the address replaced by `addr` (an offset into the image).
fn at(host: &TensorView, addr: usize) -> TensorView {
    TensorView {
        data: addr as *mut u8,
        ..*host
    }
}

/// What the emulated kernels produced.
struct GpuRun {
    /// The memory image after the launches (tensors and scratch).
    mem: Vec<u8>,
    out: Vec<f32>,
    /// Per slab query of the last slab: kept positions.
    kept: Vec<Vec<u32>>,
    plan: AttnPlan,
}

/// Runs `case`'s launches emulated; `fused_max_queries` overrides the plan's choice of the
/// one-launch selection ([`AttnPlan::fused_max_queries`]) when given.
fn run_emulated(exe: &PathBuf, case: &mut Case, fused_max_queries: Option<usize>) -> GpuRun {
    let (q, k, v, m) = (
        case.q_view(),
        case.k_view(),
        case.v_view(),
        case.mask_view(),
    );
    let mut host_out = vec![0f32; case.out_len()];
    let d = case.dst_view(&mut host_out);
    let mut img = Image::new();
    let q_off = img.push(&as_bytes(&case.q));
    let k_off = img.push(&case.k);
    let v_off = img.push(&case.v);
    let m_off = img.push(&case.mask);
    let d_off = img.push(&vec![0xff; case.out_len() * 4]); // NaN until written
    let params = case.spec.params();
    let call = AttnCall {
        q: at(&q, q_off),
        k: at(&k, k_off),
        v: at(&v, v_off),
        mask: at(&m, m_off),
        dst: at(&d, d_off),
    };
    let mut plan = AttnPlan::new(&call, &params).expect("plan");
    if let Some(f) = fused_max_queries {
        plan.fused_max_queries = f;
    }
    let s_off = img.push(&vec![0xa5; plan.scratch_bytes()]); // garbage, as fresh device memory
    let launches = plan.launches(s_off as u64).expect("launches");

    let mut job = Vec::new();
    job.extend_from_slice(&(img.bytes.len() as u64).to_le_bytes());
    job.extend_from_slice(&img.bytes);
    job.extend_from_slice(&(launches.len() as u32).to_le_bytes());
    for l in &launches {
        let id = AttnKernel::ALL.iter().position(|&x| x == l.kernel).unwrap() as u32;
        for x in [id, l.grid.0, l.grid.1, l.grid.2, l.block] {
            job.extend_from_slice(&x.to_le_bytes());
        }
        let size = std::mem::size_of_val(&l.args);
        job.extend_from_slice(&(size as u32).to_le_bytes());
        // SAFETY: AttnArgs is a plain #[repr(C)] struct of integers and one f32 with no padding
        // (its size is asserted in the crate), so all of its bytes are initialised.
        let raw =
            unsafe { std::slice::from_raw_parts(std::ptr::from_ref(&l.args).cast::<u8>(), size) };
        job.extend_from_slice(raw);
    }
    let mem = run_job(exe, "attn", &job, 0);
    same_in_any_block_order(exe, "attn", &job, &mem);

    let f32_at = |o: usize| f32::from_le_bytes(mem[o..o + 4].try_into().unwrap());
    let i32_at = |o: usize| i32::from_le_bytes(mem[o..o + 4].try_into().unwrap());
    let out = (0..case.out_len()).map(|i| f32_at(d_off + 4 * i)).collect();
    let last = plan.slabs.last().copied().unwrap();
    let qs = last.ns * last.nt * case.spec.n_head;
    let n_kv = case.spec.n_kv;
    let kept = (0..qs)
        .map(|qi| {
            let c = i32_at(s_off + plan.scratch.count + 4 * qi);
            assert!(c >= 0 && c as usize <= n_kv, "count {c}");
            (0..c as usize)
                .map(|i| i32_at(s_off + plan.scratch.list + 4 * (qi * n_kv + i)) as u32)
                .collect()
        })
        .collect();
    GpuRun {
        mem,
        out,
        kept,
        plan,
    }
}

/// The CPU kernel's output and kept positions [(s, t, n)] -> positions.
fn run_cpu(case: &mut Case) -> (Vec<f32>, Vec<Vec<u32>>) {
    let mut out = vec![0f32; case.out_len()];
    let sp = case.spec;
    let op = case
        .sparse_attention(&mut out, &sp.params())
        .expect("cpu layout");
    let mut kept = vec![Vec::new(); sp.n_stream * sp.n_tokens * sp.n_head];
    // SAFETY: the views cover the case's host buffers and `out`; one thread runs everything.
    unsafe {
        op.run_observed(0, 1, &mut |sel| {
            kept[(sel.stream * sp.n_tokens + sel.token) * sp.n_head + sel.head] =
                sel.positions.to_vec();
        })
    };
    (out, kept)
}

/// Runs `case` emulated and on the CPU and compares; returns the (K, V) half2 fast-path flags
/// the plan chose (None when skipped).
fn check(name: &str, mut case: Case) -> Option<(i32, i32)> {
    let exe = emulator()?;
    let gpu = run_emulated(exe, &mut case, None);
    // The other selection path (one launch per slab, or select then output) writes the same
    // bytes, scratch included: a token's output does not depend on the path its batch takes.
    let fused = gpu
        .plan
        .launches(0)
        .unwrap()
        .iter()
        .any(|l| l.kernel == AttnKernel::SelectOutput);
    let other = run_emulated(exe, &mut case, Some(if fused { 0 } else { usize::MAX }));
    if let Some(i) = other.mem.iter().zip(&gpu.mem).position(|(a, b)| a != b) {
        panic!("{name}: byte {i} of the memory image differs between the fused and the separate selection");
    }
    let (cpu_out, cpu_kept) = run_cpu(&mut case);
    let sp = case.spec;
    // Kept positions of the last slab's queries, exactly.
    let last = *gpu.plan.slabs.last().unwrap();
    let mut qi = 0;
    for s in last.s0..last.s0 + last.ns {
        for t in last.t0..last.t0 + last.nt {
            for n in 0..sp.n_head {
                let want = &cpu_kept[(s * sp.n_tokens + t) * sp.n_head + n];
                assert_eq!(
                    &gpu.kept[qi], want,
                    "{name}: kept positions of (s {s}, t {t}, head {n})"
                );
                qi += 1;
            }
        }
    }
    // Outputs to f32 rounding.
    let mut worst = 0f64;
    for (i, (&g, &c)) in gpu.out.iter().zip(&cpu_out).enumerate() {
        let err = (f64::from(g) - f64::from(c)).abs();
        let tol = 2e-5 * (1.0 + f64::from(c).abs());
        assert!(
            err <= tol,
            "{name}: dst[{i}] (dim {}, head {}, row {}) = {g}, CPU {c}",
            i % sp.h,
            (i / sp.h) % sp.n_head,
            i / (sp.h * sp.n_head)
        );
        worst = worst.max(err);
    }
    let kept: usize = cpu_kept.iter().map(Vec::len).sum();
    eprintln!(
        "cuda_emu {name}: {} launches, {} slab(s), {} positions kept over {} queries, max |gpu - cpu| {worst:.2e}",
        gpu.plan.launches(0).unwrap().len(),
        gpu.plan.slabs.len(),
        kept,
        cpu_kept.len()
    );
    let a = gpu.plan.args(&last, 0).unwrap();
    Some((a.k_vec, a.v_vec))
}

/// The shape of the brief: 4 query heads over 2 KV heads, head dim 8, 37 positions, 3 tokens,
/// a sliding window, f16 caches (half2 paths).
#[test]
fn sliding_window_gqa_small() {
    let mut s = Spec::new(8, 4, 4, 2, 3, 37);
    s.mask = MaskKind::Sliding(20);
    s.k_keep = 4;
    s.q_scale = 3.0;
    if let Some(paths) = check("sliding", Case::build(s)) {
        assert_eq!(
            paths,
            (1, 2),
            "f16 caches take the half2 (K) and 16-byte (V) paths"
        );
    }
}

/// f32 K (scalar K path), transposed f16 V (scalar V path), f16 mask with holes, two streams.
#[test]
fn strided_caches_two_streams_holes() {
    let mut s = Spec::new(8, 2, 4, 2, 3, 37);
    s.k_ty = Ty::F32;
    s.v_transposed = true;
    s.mask_ty = Ty::F16;
    s.mask = MaskKind::Holes(0.7);
    s.n_stream = 2;
    s.k_keep = 3;
    s.softcap = 0.0;
    s.seed = 7;
    if let Some(paths) = check("strided", Case::build(s)) {
        assert_eq!(
            paths,
            (0, 0),
            "f32 K and transposed V take the scalar paths"
        );
    }
}

/// Wider heads (several lane passes over r and H - r), 4 query heads per KV head, 5 tokens.
#[test]
fn wide_heads_group_of_four() {
    let mut s = Spec::new(160, 96, 8, 2, 5, 150);
    s.mask = MaskKind::Holes(0.8);
    s.k_keep = 16;
    s.q_scale = 2.0;
    s.seed = 3;
    if let Some(paths) = check("wide", Case::build(s)) {
        assert_eq!(paths, (1, 2));
    }
}

/// f16 V rows of 12 elements (24 bytes: 4-byte but not 16-byte aligned): the half2 V path.
#[test]
fn half2_v_rows() {
    let mut s = Spec::new(12, 4, 4, 2, 3, 37);
    s.k_keep = 4;
    s.seed = 17;
    if let Some(paths) = check("half2-v", Case::build(s)) {
        assert_eq!(paths, (1, 1));
    }
}

/// No sparsification (k >= |C|) with more than 64 kept positions per output chunk (48 chunks)
/// and more positions than select threads; one token.
#[test]
fn keep_all_long_rows() {
    let mut s = Spec::new(8, 4, 2, 1, 1, 3400);
    s.mask = MaskKind::Full;
    s.k_keep = 5000;
    s.seed = 11;
    check("keep-all", Case::build(s));
}

/// Wide heads keeping every position: 27 per output chunk, more than four times the 16-byte V
/// path's 6 groups of 20 threads, so every group sums several rows (4 loads in flight).
#[test]
fn keep_all_wide_heads_fill_every_v_group() {
    let mut s = Spec::new(160, 96, 2, 1, 1, 1300);
    s.mask = MaskKind::Full;
    s.k_keep = 5000;
    s.seed = 19;
    if let Some(paths) = check("keep-all-wide", Case::build(s)) {
        assert_eq!(paths, (1, 2));
    }
}

/// Group size 1 with 9 tokens (two token blocks, the second partial) and group size 16 (two
/// head blocks per KV head).
#[test]
fn odd_blockings() {
    let mut s = Spec::new(8, 4, 3, 3, 9, 40);
    s.k_keep = 5;
    s.seed = 5;
    check("g1", Case::build(s));
    let mut s = Spec::new(8, 4, 16, 1, 2, 30);
    s.k_keep = 6;
    s.seed = 6;
    check("g16", Case::build(s));
}

/// Zero first-part queries: every score equal, std 0, nothing above theta: the tie rule keeps
/// every valid position.
#[test]
fn ties_keep_every_maximum() {
    let mut s = Spec::new(8, 4, 4, 2, 2, 33);
    s.q_scale = 0.0;
    s.k_keep = 3;
    check("ties", Case::build(s));
}

/// A query whose mask row has no valid position gets a zero row (and keeps nothing).
#[test]
fn empty_mask_row_gives_zeros() {
    let mut s = Spec::new(8, 4, 4, 2, 3, 37);
    s.k_keep = 4;
    s.seed = 9;
    let mut case = Case::build(s);
    for j in 0..s.n_kv {
        let o = j * case.mask_nb[0] + case.mask_nb[1]; // token 1
        case.mask[o..o + 4].copy_from_slice(&f32::NEG_INFINITY.to_le_bytes());
    }
    check("empty-row", case);
}

/// A row longer than the selection's registers hold (128 threads x 32 positions): every pass
/// reads the row again, and the compaction's rounds come in two groups.
#[test]
fn long_rows_read_per_pass() {
    let mut s = Spec::new(8, 4, 2, 1, 1, 4500);
    s.mask = MaskKind::Holes(0.9);
    s.k_keep = 40;
    s.seed = 13;
    check("long-row", Case::build(s));
}
