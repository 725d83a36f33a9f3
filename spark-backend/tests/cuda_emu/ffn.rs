//! The CUDA FFN kernels (src/ffn/ffn.cu) run on the CPU through emu.h, over the launch
//! sequences the launchers enqueue, and compared with the CPU ops (`spark_backend::ffn::cpu_ops`) run
//! by ggml on the same host tensors.
//!
//! The plans come from the launchers' own validation (`spark_backend::ffn::cuda_plan::{fused, up,
//! down, sum}`, metadata only) on those tensors; their host addresses are translated into
//! offsets of a memory image holding copies of the tensors and the plan's scratch, and the
//! plans' own launch sequences (`launches`: kernel, grid, block, arguments in order) run over
//! it: the same launches the GPU launchers enqueue (src/ffn/cuda_launch.rs).
//!
//! Checked per case: the kept-neuron set of every token (the nonzero entries of u and the
//! kernels' kept counts) equals the CPU op's exactly, the thresholds bit for bit; u, the chunk
//! partials and the outputs agree to f32 rounding (see [`TOL`]); the decode path's u (select-up)
//! is the threshold + up kernels' bit for bit; and every launch sequence leaves the same memory
//! image, bit for bit, when its blocks run in a shuffled order (`super::same_in_any_block_order`).

use super::ffn_helpers::{op_params, Ggml, Rng, Weights, GEMMA3N_STD_MUL};
use llama_cpp_sys_2 as sys;
use spark_backend::ffn;
use spark_backend::ffn::cpu_ops::{spark_ffn_down, spark_ffn_fused, spark_ffn_sum, spark_ffn_up};
use spark_backend::ffn::cuda_plan::{self as check, Arg, FfnKernel, Launch, SPARSE_MAX_TOKENS};
use spark_backend::params::OpParams;
use spark_backend::rows::RowType;
use spark_backend::topk::Cutoff;
use std::path::PathBuf;
use std::sync::OnceLock;

/// Relative tolerance against the sum of the absolute products (the kernels' u against an f64
/// reference, their V sums against one from their own u; the CPU comparison adds u's
/// difference carried through and the CPU's activation quantization, see [`Case::u_ref`]).
/// An f32 sum of n products in any order is within n * 2^-24 of that magnitude at worst
/// (n <= 256 here: 1.5e-5) and about sqrt(n) * 2^-24 (1e-6) typically; the largest ratio seen
/// is 2.8e-7 (printed per case as err/tol), so 1e-5 leaves a 35x margin and still catches any
/// wrong, missing or doubled product.
const TOL: f64 = 1e-5;

fn emulator() -> Option<&'static PathBuf> {
    static EXE: OnceLock<Option<PathBuf>> = OnceLock::new();
    super::build_emulator(&EXE, "ffn_emu.cpp", "spark_ffn_emu")
}

/// A memory image: regions at 256-byte aligned offsets (offset 0 unused), with the host
/// range each copies (for translating the plans' addresses).
#[derive(Clone)]
struct Image {
    bytes: Vec<u8>,
    map: Vec<(u64, usize, usize)>, // (host address, length, offset)
}

impl Image {
    fn new() -> Self {
        Image {
            bytes: vec![0; 256],
            map: Vec::new(),
        }
    }
    fn push(&mut self, data: &[u8]) -> u64 {
        let off = self.bytes.len().div_ceil(256) * 256;
        self.bytes.resize(off, 0);
        self.bytes.extend_from_slice(data);
        off as u64
    }
    /// Copies tensor `t` (its bytes, or `fill` for outputs) and records its address.
    fn tensor(&mut self, t: *mut sys::ggml_tensor, fill: Option<u8>) {
        // SAFETY: a live contiguous tensor.
        let (p, n) = unsafe { ((*t).data as *const u8, sys::ggml_nbytes(t)) };
        let data = match fill {
            Some(b) => vec![b; n],
            // SAFETY: p holds n bytes.
            None => unsafe { std::slice::from_raw_parts(p, n) }.to_vec(),
        };
        let off = self.push(&data);
        self.map.push((p as u64, n, off as usize));
    }
    /// The image offset of host address `a` (inside a recorded tensor).
    fn tr(&self, a: u64) -> u64 {
        for &(h, n, off) in &self.map {
            if a >= h && a < h + n as u64 {
                return off as u64 + (a - h);
            }
        }
        panic!("address {a:#x} is in no tensor of the image");
    }
    fn scratch(&mut self, bytes: usize) -> u64 {
        self.push(&vec![0xa5; bytes.max(4)]) // garbage, as fresh device memory
    }
}

/// Runs the launches over the image; returns the image after them.
fn emulate(exe: &PathBuf, img: &Image, launches: &[Launch]) -> Vec<u8> {
    let mut job = Vec::new();
    job.extend_from_slice(&(img.bytes.len() as u64).to_le_bytes());
    job.extend_from_slice(&img.bytes);
    job.extend_from_slice(&(launches.len() as u32).to_le_bytes());
    for l in launches {
        let id = FfnKernel::ALL.iter().position(|&k| k == l.kernel).unwrap() as u32;
        for x in [id, l.grid.0, l.grid.1, l.grid.2, l.block] {
            job.extend_from_slice(&x.to_le_bytes());
        }
        job.extend_from_slice(&(l.args.len() as u32).to_le_bytes());
        for a in &l.args {
            let (kind, bits): (u32, u64) = match *a {
                Arg::Ptr(p) => (0, p),
                Arg::I32(i) => (1, i as u32 as u64),
                Arg::I64(i) => (2, i as u64),
                Arg::F64(f) => (3, f.to_bits()),
            };
            job.extend_from_slice(&kind.to_le_bytes());
            job.extend_from_slice(&bits.to_le_bytes());
        }
    }
    let mem = super::run_job(exe, "ffn", &job, 0);
    super::same_in_any_block_order(exe, "ffn", &job, &mem);
    mem
}

fn f32s(mem: &[u8], off: u64, n: usize) -> Vec<f32> {
    let o = off as usize;
    mem[o..o + 4 * n]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

fn u32s(mem: &[u8], off: u64, n: usize) -> Vec<u32> {
    let o = off as usize;
    mem[o..o + 4 * n]
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// How a case stores K2 and V (docs/SPEC.md section 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// Two tensors, K2 [D - r_f, F] and V^T [D, F].
    Separate,
    /// One `ffn_k2v` [D - r_f + D, F] whose row j is K2's row j then V's row j
    /// (`spark-convert --pair-k2v`); K2 and V are row views of it, at its row stride.
    Paired,
}

/// A random case: scores [F, T], h [D, T], K2 [D - r_f, F] and V^T [D, F] of type `ty`, stored
/// as `layout` says.
struct Case {
    ggml: Ggml,
    params: Box<OpParams>,
    s: *mut sys::ggml_tensor,
    h: *mut sys::ggml_tensor,
    k2: *mut sys::ggml_tensor,
    v: *mut sys::ggml_tensor,
    /// The tensors holding K2's and V's bytes: [k2, v], or the one `ffn_k2v` they view.
    stored: Vec<*mut sys::ggml_tensor>,
    k2w: Weights,
    vw: Weights,
    sv: Vec<f32>,
    hv: Vec<f32>,
    cutoff: Cutoff,
    d: usize,
    r: usize,
    f: usize,
    t: usize,
}

#[allow(clippy::too_many_arguments)]
fn case(
    seed: u64,
    (ty, layout): (RowType, Layout),
    d: usize,
    r: usize,
    f: usize,
    t: usize,
    cutoff: Cutoff,
) -> Case {
    let mut rng = Rng::new(seed);
    let mut sv = rng.normals(f * t, 1.0);
    if t >= 3 {
        // a non-finite score in token 1: left out of the statistics, never kept
        sv[f + 5] = f32::NEG_INFINITY;
    }
    let hv = rng.normals(d * t, 1.0);
    let k2w = Weights::random(&mut rng, ty, d - r, f, 0.3);
    let vw = Weights::random(&mut rng, ty, d, f, 0.3);
    let ggml = Ggml::new(16 << 20);
    let s = ggml.f32_tensor(f, t, &sv);
    let h = ggml.f32_tensor(d, t, &hv);
    let (k2, v, stored) = match layout {
        Layout::Separate => {
            let k2 = ggml.tensor(ty, d - r, f, &k2w.bytes);
            let v = ggml.tensor(ty, d, f, &vw.bytes);
            (k2, v, vec![k2, v])
        }
        Layout::Paired => {
            let (k2v, [k2, v]) = ggml.side_by_side(ty, (&k2w.bytes, d - r), (&vw.bytes, d), f);
            (k2, v, vec![k2v])
        }
    };
    Case {
        ggml,
        params: Box::new(op_params(0, cutoff)),
        s,
        h,
        k2,
        v,
        stored,
        k2w,
        vw,
        sv,
        hv,
        cutoff,
        d,
        r,
        f,
        t,
    }
}

impl Case {
    fn params(&self) -> *const std::ffi::c_void {
        (&*self.params as *const OpParams).cast()
    }
    fn run_cpu(&self, out: *mut sys::ggml_tensor) {
        let g = self.ggml.graph(out);
        self.ggml.compute(g, 1);
    }
    /// The CPU's thresholds per token (`ffn::token_thresholds`, None = dense) and activations
    /// a_jt (`ffn::activation`, 0 when dropped) of u [F, T].
    fn acts(&self) -> (Vec<Option<f32>>, Vec<f64>) {
        let mut th = Vec::new();
        ffn::token_thresholds(&self.sv, self.f, self.cutoff, &mut th);
        let mut a = vec![0f64; self.f * self.t];
        for (tt, &theta) in th.iter().enumerate() {
            for j in 0..self.f {
                let s = self.sv[tt * self.f + j];
                a[j * self.t + tt] = ffn::activation(s, theta).map_or(0.0, f64::from);
            }
        }
        (th, a)
    }

    /// Per (j, t) of u [F, T]: the f64 reference a_jt * (K2_j . h_t[r_f:]) of the kernel's
    /// computation (dequantized K2, f32 h), the tolerance of the kernel's u against it
    /// (TOL * |a| * sum_i |K2_ji h_ti|: f32 rounding) and against the CPU op's u: that plus the
    /// CPU's activation quantization. Like ggml's mat-mul, the CPU op quantizes h[r_f:] to q8_0
    /// / q8_K (per 32 / 256 values, step amax / 127) for a quantized K2, while the kernel reads h
    /// in f32, so their dots differ by up to sum_i |K2_ji| * step_i / 2 (bounded by a whole step).
    fn u_ref(&self) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let (d2, t) = (self.d - self.r, self.t);
        let blk = match self.k2w.ty {
            RowType::F32 | RowType::F16 | RowType::Bf16 => 0,
            RowType::Q8_0 | RowType::Q4_0 | RowType::Q4_1 | RowType::Q5_0 | RowType::Q5_1 => 32,
            _ => 256,
        };
        let (_, a) = self.acts();
        let n = self.f * t;
        let (mut val, mut tight, mut cpu) = (vec![0f64; n], vec![0f64; n], vec![0f64; n]);
        for tt in 0..t {
            let x = &self.hv[tt * self.d + self.r..(tt + 1) * self.d];
            let step: Vec<f64> = (0..d2)
                .map(|i| {
                    if blk == 0 {
                        return 0.0;
                    }
                    let b = &x[i / blk * blk..(i / blk + 1) * blk];
                    b.iter().fold(0f64, |m, v| m.max(f64::from(v.abs()))) / 127.0
                })
                .collect();
            for j in 0..self.f {
                let row = &self.k2w.values[j * d2..(j + 1) * d2];
                let (mut dot, mut abs, mut q) = (0f64, 0f64, 0f64);
                for ((w, hx), st) in row.iter().zip(x).zip(&step) {
                    dot += f64::from(*w) * f64::from(*hx);
                    abs += (f64::from(*w) * f64::from(*hx)).abs();
                    q += f64::from(w.abs()) * st;
                }
                let i = j * t + tt;
                val[i] = a[i] * dot;
                tight[i] = TOL * a[i].abs() * abs;
                cpu[i] = tight[i] + a[i].abs() * q;
            }
        }
        (val, tight, cpu)
    }

    /// The f64 reference sum_j u_jt V_jd over neurons [lo, hi) for the given u [F, T], [T, D],
    /// and its tolerance TOL * sum_j |u_jt V_jd|.
    fn v_ref(&self, u: &[f32], lo: usize, hi: usize) -> (Vec<f64>, Vec<f64>) {
        let (d, t) = (self.d, self.t);
        let (mut val, mut tol) = (vec![0f64; d * t], vec![0f64; d * t]);
        for j in lo..hi {
            let row = &self.vw.values[j * d..(j + 1) * d];
            for tt in 0..t {
                let uv = f64::from(u[j * t + tt]);
                for (c, vv) in row.iter().enumerate() {
                    val[tt * d + c] += uv * f64::from(*vv);
                    tol[tt * d + c] += TOL * (uv * f64::from(*vv)).abs();
                }
            }
        }
        (val, tol)
    }

    /// Per (t, d) of an output [T, D] summing neurons [lo, hi): TOL * sum_j |u_jt V_jd| (f32
    /// rounding of the sum) plus sum_j uerr_jt |V_jd| (u's own difference carried through).
    fn v_err(&self, u: &[f32], uerr: &[f64], lo: usize, hi: usize) -> Vec<f64> {
        let (d, t) = (self.d, self.t);
        let mut m = vec![0f64; d * t];
        for j in lo..hi {
            let row = &self.vw.values[j * d..(j + 1) * d];
            for tt in 0..t {
                let w = TOL * f64::from(u[j * t + tt]).abs() + uerr[j * t + tt];
                for (c, vv) in row.iter().enumerate() {
                    m[tt * d + c] += w * f64::from(*vv).abs();
                }
            }
        }
        m
    }
    /// The kept neurons per token: nonzero entries of u [F, T] (neuron-major).
    fn kept(&self, u: &[f32]) -> Vec<Vec<u32>> {
        (0..self.t)
            .map(|tt| {
                (0..self.f as u32)
                    .filter(|&j| u[j as usize * self.t + tt] != 0.0)
                    .collect()
            })
            .collect()
    }
}

/// The threshold kernel's theta per token: bit-equal to the CPU's (`topk::threshold`, rounded
/// down to f32); -inf when dense.
fn check_theta(name: &str, c: &Case, mem: &[u8], off: u64) {
    let (th, _) = c.acts();
    for (tt, (g, want)) in f32s(mem, off, c.t).into_iter().zip(th).enumerate() {
        let want = want.unwrap_or(f32::NEG_INFINITY);
        assert_eq!(
            g.to_bits(),
            want.to_bits(),
            "{name}: theta of token {tt}: {g} vs CPU {want}"
        );
    }
}

/// Compares within `tol` (per element, see [`Case::u_err`], [`Case::v_err`]); returns the
/// worst |gpu - cpu| / tol.
fn close<C: Copy + Into<f64> + std::fmt::Display>(
    name: &str,
    what: &str,
    gpu: &[f32],
    cpu: &[C],
    tol: &[f64],
) -> f64 {
    assert_eq!(gpu.len(), cpu.len());
    let mut worst = 0f64;
    for (i, ((&g, &c), &m)) in gpu.iter().zip(cpu).zip(tol).enumerate() {
        let err = (f64::from(g) - c.into()).abs();
        assert!(
            err <= m,
            "{name}: {what}[{i}] = {g}, want {c} (tolerance {m:.3e})"
        );
        if m > 0.0 {
            worst = worst.max(err / m);
        }
    }
    worst
}

/// The worst |gpu - cpu| / (|cpu| + 1e-3 max |cpu|), for the report.
fn rel(gpu: &[f32], cpu: &[f32]) -> f64 {
    let top = cpu.iter().fold(0f64, |a, v| a.max(f64::from(v.abs())));
    gpu.iter()
        .zip(cpu)
        .map(|(&g, &c)| (f64::from(g) - f64::from(c)).abs() / (f64::from(c.abs()) + 1e-3 * top))
        .fold(0f64, f64::max)
}

/// u [F, T] as the threshold and up kernels compute it (`spark_ffn_up`'s launches) for `fp`'s
/// stage, emulated over `img` (already translated addresses).
fn staged_u(exe: &PathBuf, img: &Image, fp: &check::FusedPlan) -> Vec<f32> {
    let mut img = img.clone();
    let n = fp.stage.f * fp.stage.n_tokens;
    let out = img.push(&vec![0xff; 4 * n]);
    let up = check::UpPlan {
        stage: fp.stage,
        out,
    };
    let base = img.scratch(up.scratch().total);
    let mem = emulate(exe, &img, &up.launches(base).expect("up launches"));
    f32s(&mem, out, n)
}

/// spark_ffn_fused (P chunks) + spark_ffn_sum, emulated vs CPU.
fn check_fused(name: &str, c: &Case, p: usize) {
    let Some(exe) = emulator() else { return };
    let (d, f, t) = (c.d, c.f, c.t);
    let partials = c.ggml.custom(
        &[d, t, p],
        &mut [c.s, c.h, c.k2, c.v],
        spark_ffn_fused,
        &*c.params,
    );
    let out = c
        .ggml
        .custom(&[d, t], &mut [partials], spark_ffn_sum, &*c.params);
    let u = c
        .ggml
        .custom(&[t, f], &mut [c.s, c.h, c.k2], spark_ffn_up, &*c.params);
    // SAFETY: live tensors of c's context; params is a spark_ffn_params.
    let (mut fp, mut sp) = unsafe {
        (
            check::fused(partials, c.params()).expect("fused plan"),
            check::sum(out).expect("sum plan"),
        )
    };
    let mut img = Image::new();
    for &x in [c.s, c.h].iter().chain(&c.stored) {
        img.tensor(x, None);
    }
    img.tensor(partials, Some(0xff)); // NaN until written
    img.tensor(out, Some(0xff));
    fp.stage.s = img.tr(fp.stage.s);
    fp.stage.h = img.tr(fp.stage.h);
    fp.stage.k2.ptr = img.tr(fp.stage.k2.ptr);
    fp.v.ptr = img.tr(fp.v.ptr);
    fp.out = img.tr(fp.out);
    sp.partials = img.tr(sp.partials);
    sp.out = img.tr(sp.out);
    assert_eq!(sp.partials, fp.out);
    let layout = fp.scratch();
    let base = img.scratch(layout.total);
    let at = |off: usize| base + off as u64;
    let mut launches = fp.launches(base).expect("fused launches");
    launches.extend(sp.launches().expect("sum launches"));
    let mem = emulate(exe, &img, &launches);

    c.run_cpu(out);
    c.run_cpu(u);
    let (cpu_u, cpu_part, cpu_out) = (c.ggml.read(u), c.ggml.read(partials), c.ggml.read(out));
    // u is [T, F] row-major = neuron-major [F][T], as the kernels' scratch.
    let gpu_u = f32s(&mem, at(layout.u), f * t);
    let want = c.kept(&cpu_u);
    assert_eq!(c.kept(&gpu_u), want, "{name}: kept neurons (u != 0)");
    // per token (tiled path) or per token and select-up block (decode path)
    let counts = u32s(&mem, at(layout.kept), layout.kept_len);
    let per_token = layout.kept_len / t;
    for (tt, w) in want.iter().enumerate() {
        let n: u32 = counts[tt * per_token..(tt + 1) * per_token].iter().sum();
        assert_eq!(n as usize, w.len(), "{name}: kept count of token {tt}");
    }
    if t <= SPARSE_MAX_TOKENS {
        // select-up computes each token's threshold per block: its u must be the staged
        // path's (threshold + up kernels) bit for bit
        let staged = staged_u(exe, &img, &fp);
        let same = gpu_u
            .iter()
            .zip(&staged)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{name}: select-up's u differs from threshold + up's");
    }
    check_theta(name, c, &mem, at(layout.theta));
    let (uval, utight, ucpu) = c.u_ref();
    let wu = [
        close(name, "u vs f64", &gpu_u, &uval, &utight),
        close(name, "u vs CPU", &gpu_u, &cpu_u, &ucpu),
    ];
    let gpu_part = f32s(&mem, fp.out, d * t * p);
    let (mut pref, mut ptol, mut pcpu) = (Vec::new(), Vec::new(), Vec::new());
    for ch in 0..p {
        let (lo, hi) = (ch * f / p, (ch + 1) * f / p);
        let (v, tl) = c.v_ref(&gpu_u, lo, hi);
        pref.extend(v);
        ptol.extend(tl);
        pcpu.extend(c.v_err(&cpu_u, &ucpu, lo, hi));
    }
    let wp = [
        close(name, "partials vs f64", &gpu_part, &pref, &ptol),
        close(name, "partials vs CPU", &gpu_part, &cpu_part, &pcpu),
    ];
    let gpu_out = f32s(&mem, sp.out, d * t);
    let (oref, otol) = c.v_ref(&gpu_u, 0, f);
    let wo = [
        close(name, "out vs f64", &gpu_out, &oref, &otol),
        close(
            name,
            "out vs CPU",
            &gpu_out,
            &cpu_out,
            &c.v_err(&cpu_u, &ucpu, 0, f),
        ),
    ];
    let (own_p, own) = fp.own_chunks();
    if own {
        // dst of one chunk: the op cut F into own_p chunks itself (scratch) and added them in
        // chunk order, bit for bit as spark_ffn_sum over those partials
        let inner = f32s(&mem, at(layout.partials), d * t * own_p);
        for (i, &g) in gpu_part.iter().enumerate() {
            let mut acc = inner[i];
            for ch in 1..own_p {
                acc += inner[ch * d * t + i];
            }
            assert_eq!(
                g.to_bits(),
                acc.to_bits(),
                "{name}: the op's own chunk sum [{i}]"
            );
        }
    }
    // spark_ffn_sum alone: the partials summed in chunk order, as the kernel must, bit for bit.
    for (i, &g) in gpu_out.iter().enumerate() {
        let mut acc = gpu_part[i];
        for ch in 1..p {
            acc += gpu_part[ch * d * t + i];
        }
        assert_eq!(g.to_bits(), acc.to_bits(), "{name}: sum of partials [{i}]");
    }
    let kept: usize = want.iter().map(Vec::len).sum();
    eprintln!(
        "cuda_emu ffn {name}: fused T={t} P={p}{} {} launches ({}), kept {kept}/{}; max err/tol (f64, CPU) u {:.1e} {:.1e} partials {:.1e} {:.1e} out {:.1e} {:.1e}; max rel err vs CPU u {:.1e} out {:.1e}",
        if own { format!(" (the op's own {own_p} chunks)") } else { String::new() },
        launches.len(),
        if t <= SPARSE_MAX_TOKENS { "select-up + gather" } else { "threshold + up + tiled" },
        f * t,
        wu[0],
        wu[1],
        wp[0],
        wp[1],
        wo[0],
        wo[1],
        rel(&gpu_u, &cpu_u),
        rel(&gpu_out, &cpu_out)
    );
}

/// spark_ffn_up + spark_ffn_down, emulated vs CPU.
fn check_up_down(name: &str, c: &Case) {
    let Some(exe) = emulator() else { return };
    let (d, f, t) = (c.d, c.f, c.t);
    let u = c
        .ggml
        .custom(&[t, f], &mut [c.s, c.h, c.k2], spark_ffn_up, &*c.params);
    let out = c
        .ggml
        .custom(&[d, t], &mut [u, c.v], spark_ffn_down, &*c.params);
    // SAFETY: live tensors of c's context; params is a spark_ffn_params.
    let (mut up, mut dp) = unsafe {
        (
            check::up(u, c.params()).expect("up plan"),
            check::down(out).expect("down plan"),
        )
    };
    let mut img = Image::new();
    for &x in [c.s, c.h].iter().chain(&c.stored) {
        img.tensor(x, None);
    }
    img.tensor(u, Some(0xff));
    img.tensor(out, Some(0xff));
    up.stage.s = img.tr(up.stage.s);
    up.stage.h = img.tr(up.stage.h);
    up.stage.k2.ptr = img.tr(up.stage.k2.ptr);
    up.out = img.tr(up.out);
    dp.u = img.tr(dp.u);
    dp.v.ptr = img.tr(dp.v.ptr);
    dp.out = img.tr(dp.out);
    assert_eq!(dp.u, up.out);
    let layout = up.scratch();
    let base = img.scratch(layout.total);
    let (theta, kept) = (base + layout.theta as u64, base + layout.kept as u64);
    // The up launches, then the down launches on their output (the graph's order).
    let mut launches = up.launches(base).expect("up launches");
    launches.extend(dp.launches().expect("down launches"));
    let mem = emulate(exe, &img, &launches);

    c.run_cpu(out);
    let (cpu_u, cpu_out) = (c.ggml.read(u), c.ggml.read(out));
    let gpu_u = f32s(&mem, up.out, f * t);
    let want = c.kept(&cpu_u);
    assert_eq!(c.kept(&gpu_u), want, "{name}: kept neurons (u != 0)");
    let counts = u32s(&mem, kept, t);
    for (tt, w) in want.iter().enumerate() {
        assert_eq!(
            counts[tt] as usize,
            w.len(),
            "{name}: kept count of token {tt}"
        );
    }
    check_theta(name, c, &mem, theta);
    let (uval, utight, ucpu) = c.u_ref();
    let wu = [
        close(name, "u vs f64", &gpu_u, &uval, &utight),
        close(name, "u vs CPU", &gpu_u, &cpu_u, &ucpu),
    ];
    let gpu_out = f32s(&mem, dp.out, d * t);
    let (oref, otol) = c.v_ref(&gpu_u, 0, f);
    let wo = [
        close(name, "out vs f64", &gpu_out, &oref, &otol),
        close(
            name,
            "out vs CPU",
            &gpu_out,
            &cpu_out,
            &c.v_err(&cpu_u, &ucpu, 0, f),
        ),
    ];
    let n: usize = want.iter().map(Vec::len).sum();
    eprintln!(
        "cuda_emu ffn {name}: up + down T={t}, kept {n}/{}; max err/tol (f64, CPU) u {:.1e} {:.1e} out {:.1e} {:.1e}; max rel err vs CPU u {:.1e} out {:.1e}",
        f * t,
        wu[0],
        wu[1],
        wo[0],
        wo[1],
        rel(&gpu_u, &cpu_u),
        rel(&gpu_out, &cpu_out)
    );
}

/// Shapes per type: D and D - r_f whole blocks of the type.
fn shape(ty: RowType) -> (usize, usize) {
    match ty {
        RowType::F32 | RowType::F16 => (96, 40),
        RowType::Q8_0 | RowType::Q4_0 => (96, 32),
        _ => (512, 256),
    }
}

/// All runs of one weight type and layout: fused T = 1 (P = 16), 3 (P = 7), 9 (P = 7, tiled),
/// T = 2 and 9 with P = 1 (the op adds its own 16 chunks: CUDA's tiling) and up + down T = 5,
/// at k = 16 of F = 200 (8 %); fused T = 3 and up + down T = 5 dense (k >= F);
/// Gemma 3n's cutoff (std multiplier Q(0.95), ~5 % kept) with r_f = 0 (K2 spans all of h):
/// fused T = 1 and 9, up + down T = 5.
fn all_paths(ty: RowType, layout: Layout) {
    let (d, r) = shape(ty);
    let f = 200;
    let tag = format!("{ty:?} {layout:?}");
    let case = |seed, r, t, cutoff| case(seed, (ty, layout), d, r, f, t, cutoff);
    let top = Cutoff::TopK(16);
    for (t, p, seed) in [(1, 16, 1), (3, 7, 2), (9, 7, 3), (2, 1, 10), (9, 1, 11)] {
        check_fused(&format!("{tag} k=16"), &case(seed, r, t, top), p);
    }
    check_up_down(&format!("{tag} k=16"), &case(4, r, 5, top));
    let dense = |k| Cutoff::TopK(k);
    check_fused(&format!("{tag} dense"), &case(5, r, 3, dense(500)), 7);
    check_up_down(&format!("{tag} dense"), &case(6, r, 5, dense(200)));
    let std_mul = Cutoff::StdMul(f64::from(GEMMA3N_STD_MUL));
    let name = format!("{tag} std-mul r_f=0");
    for (t, p, seed) in [(1, 16, 7), (9, 7, 8)] {
        check_fused(&name, &case(seed, 0, t, std_mul), p);
    }
    check_up_down(&name, &case(9, 0, 5, std_mul));
}

#[test]
fn ffn_f32() {
    all_paths(RowType::F32, Layout::Separate);
}

#[test]
fn ffn_f16() {
    all_paths(RowType::F16, Layout::Separate);
}

#[test]
fn ffn_q8_0() {
    all_paths(RowType::Q8_0, Layout::Separate);
}

#[test]
fn ffn_q4_0() {
    all_paths(RowType::Q4_0, Layout::Separate);
}

#[test]
fn ffn_q4_k() {
    all_paths(RowType::Q4K, Layout::Separate);
}

#[test]
fn ffn_q6_k() {
    all_paths(RowType::Q6K, Layout::Separate);
}

// K2 and V side by side (a `--pair-k2v` file): the kernels read both through the row stride of
// `ffn_k2v`, V's rows starting after K2's part of each row.

#[test]
fn ffn_paired_f16() {
    all_paths(RowType::F16, Layout::Paired);
}

#[test]
fn ffn_paired_q8_0() {
    all_paths(RowType::Q8_0, Layout::Paired);
}

#[test]
fn ffn_paired_q4_k() {
    all_paths(RowType::Q4K, Layout::Paired);
}
