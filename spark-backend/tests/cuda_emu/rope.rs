//! rope.cu's `spark_rope` through the CPU emulation (the plan's one launch over a memory image,
//! blocks in order and shuffled) against `rope_head`, the CPU op's function: the same bits
//! (both run the same f32 operations through the host's libm; on a GPU powf, cosf and sinf and
//! fused multiply-adds differ in the last bits, which the graph tests' tolerances cover).

use spark_backend::params::RopeParams;
use spark_backend::rope::cuda_plan::RopePlan;
use spark_backend::rope::{rope_angles, rope_head, RopeCall};
use spark_backend::tensor::TensorView;
use std::path::PathBuf;
use std::sync::OnceLock;

fn emulator() -> Option<&'static PathBuf> {
    static EXE: OnceLock<Option<PathBuf>> = OnceLock::new();
    super::build_emulator(&EXE, "rope_emu.cpp", "spark_rope_emu")
}

/// ggml's f32 and i32 type ids.
const F32: u32 = llama_cpp_sys_2::GGML_TYPE_F32;
const I32: u32 = llama_cpp_sys_2::GGML_TYPE_I32;

fn check(h: usize, r: usize, n_head: usize, stride: usize, pos: &[i32]) {
    let Some(exe) = emulator() else { return };
    let t = pos.len();
    let x: Vec<f32> = (0..stride * t)
        .map(|i| ((i * 7919) % 2003) as f32 / 1001.0 - 1.0)
        .collect();
    let mut img = super::Image::new();
    let x_off = img.push(&super::as_bytes(&x));
    let pos_off = img.push(&pos.iter().flat_map(|p| p.to_le_bytes()).collect::<Vec<_>>());
    let n_out = h * n_head * t;
    let d_off = img.push(&vec![0xff; 4 * n_out]); // NaN until written
    let view = |off: usize, ty, ne: [usize; 4], nb: [usize; 4]| TensorView {
        ty,
        ne,
        nb,
        data: off as *mut u8,
    };
    let params = RopeParams {
        layer: 0,
        r: r as i32,
        freq_base: 10000.0,
        freq_scale: 1.0,
        scale: 0.0625,
        reserved: 0,
    };
    let call = RopeCall {
        x: view(
            x_off,
            F32,
            [h, n_head, t, 1],
            [4, 4 * h, 4 * stride, 4 * stride * t],
        ),
        pos: view(pos_off, I32, [t, 1, 1, 1], [4, 4 * t, 4 * t, 4 * t]),
        dst: view(
            d_off,
            F32,
            [h, n_head, t, 1],
            [4, 4 * h, 4 * h * n_head, 4 * n_out],
        ),
        params,
    };
    let plan = RopePlan::new(&call).expect("plan");
    assert_eq!(plan.grid as usize, n_head * t);

    let mut job = Vec::new();
    job.extend_from_slice(&(img.bytes.len() as u64).to_le_bytes());
    job.extend_from_slice(&img.bytes);
    job.extend_from_slice(&1u32.to_le_bytes());
    for v in [0, plan.grid, 1, 1, plan.block] {
        job.extend_from_slice(&v.to_le_bytes());
    }
    let size = std::mem::size_of_val(&plan.args);
    job.extend_from_slice(&(size as u32).to_le_bytes());
    // SAFETY: RopeArgs is a plain #[repr(C)] struct of integers and f32 with no padding (its
    // size is asserted in the crate), so all of its bytes are initialised.
    job.extend_from_slice(unsafe {
        std::slice::from_raw_parts(std::ptr::from_ref(&plan.args).cast::<u8>(), size)
    });
    let mem = super::run_job(exe, "rope", &job, 0);
    super::same_in_any_block_order(exe, "rope", &job, &mem);

    let gpu: Vec<f32> = (0..n_out)
        .map(|i| f32::from_le_bytes(mem[d_off + 4 * i..][..4].try_into().unwrap()))
        .collect();
    let mut cpu = vec![0f32; n_out];
    let mut angles = Vec::new();
    for (row, out) in cpu.chunks_mut(h).enumerate() {
        let (n, tk) = (row % n_head, row / n_head);
        rope_angles(pos[tk], &params, h, &mut angles);
        rope_head(&x[tk * stride + n * h..][..h], &angles, r, out);
    }
    let differ = gpu
        .iter()
        .zip(&cpu)
        .position(|(a, b)| a.to_bits() != b.to_bits());
    assert_eq!(
        differ,
        None,
        "H {h} r {r}: element differs: {:?}",
        differ.map(|i| (gpu[i], cpu[i]))
    );
    println!("cuda_emu rope: H {h} r {r} {n_head} heads x {t} tokens: the CPU op's bits");
}

#[test]
fn rope_q_and_k_of_gemma2_2b_shapes() {
    // Q and K as views of the stacked Q/K/V product (rows of (8 + 2 * 4) * 256 values)
    check(256, 128, 8, 4096, &[0, 1, 17, 4095]);
    check(256, 128, 4, 4096, &[3, 8191]);
}

#[test]
fn rope_uneven_parts_and_more_pairs_than_threads() {
    check(48, 40, 3, 3 * 48, &[0, 5, 600]);
    check(512, 64, 2, 2 * 512 + 16, &[9, 100]); // 256 pairs: two per thread
}
