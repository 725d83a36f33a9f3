//! Random-weight models without a checkpoint (`--synthetic PRESET`), streamed and generated in
//! parallel. Every chunk of every tensor has its own PRNG stream keyed by (seed, tensor index,
//! chunk index) and chunk boundaries depend only on the tensor's shape, so the file is the same
//! for a seed whatever the thread count. The values are those of the file with K2 and V
//! separate (`ffn_up`, `ffn_down_t`; tensor indices of that layout): a `--pair-k2v` file holds
//! the same values, each `ffn_k2v` row made of its `ffn_up` and `ffn_down_t` rows.

use std::path::PathBuf;

use rayon::prelude::*;
use spark_gguf::schema::{Arch, FfnRowLayout, Layout, QkvLayout, GEMMA2_ARCH, SPARK_ARCH};
use spark_gguf::{GgmlType, TensorPlan};

use crate::config::ModelConfig;
use crate::convert::{check_output, create_writer, SparkOverrides};
use crate::emit::write_pipelined;
use crate::error::{Error, Result};
use crate::model::{self, OutType};
use crate::prng::Xoshiro256;
use crate::progress::Progress;
use crate::tokenizer::synthetic_vocab;

/// Names of the presets.
pub const PRESETS: &[&str] = &[
    "spark-gemma2-2b",
    "gemma2-2b",
    "spark-gemma2-9b",
    "gemma2-9b",
    "tiny",
    "tiny-dense",
];

/// Elements per generated chunk (a function of nothing but this constant and the row length).
const CHUNK_ELEMS: usize = 1 << 20;

/// Standard deviation of the norm weights around 1.
const NORM_STD: f32 = 0.1;

/// Options of `spark-convert --synthetic`.
#[derive(Clone, Debug)]
pub struct SyntheticOptions {
    /// Preset name (see [`PRESETS`]).
    pub preset: String,
    /// Output path.
    pub output: PathBuf,
    /// PRNG seed.
    pub seed: u64,
    /// Tensor storage (`auto` = f16).
    pub outtype: OutType,
    /// Spark parameter overrides.
    pub overrides: SparkOverrides,
    /// How Wq, Wk and Wv are written (Spark presets only).
    pub qkv: QkvLayout,
    /// How K2 and V are written (Spark presets only).
    pub ffn_rows: FfnRowLayout,
    /// `general.name` (default: the preset name).
    pub name: Option<String>,
    /// Also write a llama-gguf-hash manifest of the tensor data here, committed with the output.
    pub manifest: Option<PathBuf>,
    /// Replace an existing output (and manifest).
    pub force: bool,
    /// No progress bar or summary.
    pub quiet: bool,
}

fn gemma2_2b(d_ff: u32, spark: bool) -> ModelConfig {
    ModelConfig {
        vocab_size: 256_000,
        d_model: 2304,
        n_layers: 26,
        n_heads: 8,
        n_kv_heads: 4,
        head_dim: 256,
        d_ff,
        ffn_k: spark.then_some(1106),
        ffn_r: spark.then_some(1024),
        attn_k: spark.then_some(256),
        attn_r: spark.then_some(128),
        rms_norm_eps: 1e-6,
        rope_theta: 10000.0,
        query_pre_attn_scalar: Some(256.0),
        attn_logit_softcap: 50.0,
        final_logit_softcap: 30.0,
        sliding_window: 4096,
        max_position_embeddings: 8192,
        bos_id: 2,
        eos_id: 1,
        pad_id: 0,
        unk_id: 3,
        dtype: None,
        ignored_keys: Vec::new(),
    }
}

/// Gemma-2 9B's shapes (D 3584, 42 layers, 16 query and 8 KV heads of width 256, dense FFN width
/// 14336). The paper trained a 2B only; the Spark widths follow the 2B preset's proportions: F
/// 1.5x the dense width (13824 = 1.5 x 9216 there), k_f 8 % of F, r_f 1536 (the 2B's r_f / D =
/// 1024 / 2304, rounded to a multiple of 256 so that K1 and K2 rows fill whole k-quant blocks),
/// k_a and r_a as the 2B's (the same head width).
fn gemma2_9b(d_ff: u32, spark: bool) -> ModelConfig {
    ModelConfig {
        d_model: 3584,
        n_layers: 42,
        n_heads: 16,
        n_kv_heads: 8,
        ffn_k: spark.then_some(1720),
        ffn_r: spark.then_some(1536),
        ..gemma2_2b(d_ff, spark)
    }
}

fn tiny(spark: bool) -> ModelConfig {
    ModelConfig {
        vocab_size: 512,
        d_model: 128,
        n_layers: 2,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 32,
        d_ff: 512,
        ffn_k: spark.then_some(41),
        ffn_r: spark.then_some(64),
        attn_k: spark.then_some(16),
        attn_r: spark.then_some(16),
        query_pre_attn_scalar: Some(32.0),
        sliding_window: 64,
        max_position_embeddings: 1024,
        ..gemma2_2b(512, spark)
    }
}

/// The architecture and config of preset `name`.
pub fn preset(name: &str) -> Result<(Arch, ModelConfig)> {
    Ok(match name {
        "spark-gemma2-2b" => (SPARK_ARCH, gemma2_2b(13824, true)),
        "gemma2-2b" => (GEMMA2_ARCH, gemma2_2b(9216, false)),
        "spark-gemma2-9b" => (SPARK_ARCH, gemma2_9b(21504, true)),
        "gemma2-9b" => (GEMMA2_ARCH, gemma2_9b(14336, false)),
        "tiny" => (SPARK_ARCH, tiny(true)),
        "tiny-dense" => (GEMMA2_ARCH, tiny(false)),
        _ => {
            return Err(Error::Usage(format!(
                "unknown preset '{name}' (known: {})",
                PRESETS.join(", ")
            )))
        }
    })
}

/// How one tensor's values are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// 1 + N(0, NORM_STD^2) (a norm weight as GGUF stores it).
    Norm,
    /// N(0, std^2).
    Normal(f32),
}

/// The init of tensor `name` with ggml dims `ne`: norms around 1; matrices N(0, 1/fan_in) with
/// fan_in the contracted dimension (ne0, except the neuron-major V, contracted over its rows).
pub fn init_for(name: &str, ne: &[u64]) -> Init {
    if ne.len() == 1 {
        return Init::Norm;
    }
    let fan_in = if name.ends_with("ffn_down_t.weight") {
        ne[1]
    } else {
        ne[0]
    };
    Init::Normal(1.0 / (fan_in as f32).sqrt())
}

/// Fills chunk `chunk` of tensor `tensor` (row length `cols`, starting at row `row0`).
pub fn fill_chunk(seed: u64, tensor: u64, chunk: u64, init: Init, out: &mut [f32]) {
    let mut rng = Xoshiro256::for_chunk(seed, tensor, chunk);
    match init {
        Init::Normal(std) => rng.fill_normal(out, std),
        Init::Norm => {
            rng.fill_normal(out, NORM_STD);
            for x in out.iter_mut() {
                *x += 1.0;
            }
        }
    }
}

/// Writes a random model of preset `o.preset`.
pub fn generate(o: &SyntheticOptions) -> Result<()> {
    generate_with_chat_template(o, None)
}

/// [`generate`], also writing `tokenizer.chat_template` when `chat_template` is given (it must
/// not be empty).
pub fn generate_with_chat_template(
    o: &SyntheticOptions,
    chat_template: Option<&str>,
) -> Result<()> {
    check_output(&o.output, o.manifest.as_deref(), o.force)?;
    let chat_template = chat_template
        .map(|t| crate::chat_template::check(t.to_string(), "--chat-template"))
        .transpose()?;
    let (arch, mut cfg) = preset(&o.preset)?;
    if arch == GEMMA2_ARCH && o.overrides.any() {
        return Err(Error::Usage(format!(
            "--ffn-k/--ffn-r/--attn-k/--attn-r do not apply to the dense preset '{}'",
            o.preset
        )));
    }
    if arch == GEMMA2_ARCH && o.qkv != QkvLayout::Split {
        return Err(Error::Usage(format!(
            "--stack-qkv does not apply to the dense preset '{}'",
            o.preset
        )));
    }
    if arch == GEMMA2_ARCH && o.ffn_rows != FfnRowLayout::Separate {
        return Err(Error::Usage(format!(
            "--pair-k2v does not apply to the dense preset '{}'",
            o.preset
        )));
    }
    o.overrides.apply(&mut cfg);
    let hp = model::hparams(arch, &cfg)?;
    let outtype = if o.outtype == OutType::Auto {
        OutType::F16
    } else {
        o.outtype
    };
    let tensors = synthetic_tensors(&hp, Layout::new(o.qkv, o.ffn_rows))?;
    let mut notes = Vec::new();
    let plans: Vec<TensorPlan> = tensors
        .iter()
        .map(|st| {
            let widths: Vec<u64> = st.parts.iter().map(|p| p.ne[0]).collect();
            let (ty, fallback) = model::tensor_type_parts(outtype, GgmlType::F32, &st.ne, &widths);
            if fallback {
                notes.push(model::fallback_note(&st.name, &widths));
            }
            TensorPlan {
                name: st.name.clone(),
                ty,
                ne: st.ne.clone(),
            }
        })
        .collect();
    let types: Vec<GgmlType> = plans.iter().map(|p| p.ty).collect();
    let name = o.name.clone().unwrap_or_else(|| o.preset.clone());
    let mut md = model::model_metadata(arch, &name, &cfg, &hp, &types)?;
    md.extend(model::vocab_metadata(
        &synthetic_vocab(cfg.vocab_size as usize)?,
        &cfg,
    )?);
    if let Some(t) = chat_template {
        crate::chat_template::set(&mut md, t);
    }
    let total: u64 = plans
        .iter()
        .map(|p| p.ty.tensor_bytes(&p.ne).unwrap_or(0))
        .sum();

    let progress = Progress::new(plans.len(), total, o.quiet);
    for n in &notes {
        progress.log(n);
    }
    let w = create_writer(&o.output, o.manifest.as_deref(), o.force, &md, &plans)?;
    let window = (rayon::current_num_threads() * 2).max(2);
    let file_bytes = write_pipelined(w, &progress, |sink| {
        for (st, plan) in tensors.iter().zip(&plans) {
            progress.start_tensor(&plan.name);
            let mut gens: Vec<PartGen> = st.parts.iter().map(|p| PartGen::new(p, o.seed)).collect();
            let rows = gens.first().map_or(0, |g| g.rows);
            let cols: usize = gens.iter().map(|g| g.cols).sum();
            // a few of the widest part's chunks per block of rows, drawn and encoded in parallel
            let step = gens.iter().map(|g| g.chunk_rows).max().unwrap_or(1) * window.min(8);
            for r0 in (0..rows).step_by(step) {
                let r1 = (r0 + step).min(rows);
                let block = match gens.as_mut_slice() {
                    [g] => g.rows(r0, r1),
                    parts => side_by_side(parts, r0, r1, cols),
                };
                sink.send_rows(plan.ty, &block, cols)?;
            }
        }
        Ok(())
    })?;
    progress.finish(&o.output, o.manifest.as_deref(), file_bytes);
    Ok(())
}

/// One tensor of a synthetic file: its name and dims, and the tensors of the separate-K2/V
/// layout whose values it holds (itself, or for `ffn_k2v` its `ffn_up` and `ffn_down_t`, whose
/// rows it holds side by side).
struct SyntheticTensor {
    name: String,
    ne: Vec<u64>,
    parts: Vec<SyntheticPart>,
}

/// A tensor of the separate-K2/V layout, as its values are drawn.
struct SyntheticPart {
    /// Its index in that layout's tensor list (the PRNG's tensor index).
    index: u64,
    ne: Vec<u64>,
    init: Init,
}

/// The tensors of a synthetic file of `hp` laid out as `layout`, in file order.
fn synthetic_tensors(
    hp: &spark_gguf::schema::Hparams,
    layout: Layout,
) -> Result<Vec<SyntheticTensor>> {
    let arch = hp.arch;
    let separate_layout = Layout {
        ffn_rows: FfnRowLayout::Separate,
        ..layout
    };
    let separate = hp.expected_tensors_in(arch.tensors_with(separate_layout));
    let part = |name: &str| -> Result<SyntheticPart> {
        let i = separate
            .iter()
            .position(|(n, _)| n == name)
            .ok_or_else(|| Error::Internal(format!("internal: no tensor '{name}' to draw from")))?;
        let ne = separate[i].1.clone();
        Ok(SyntheticPart {
            index: i as u64,
            init: init_for(name, &ne),
            ne,
        })
    };
    let specs = arch.tensors_with(layout);
    let globals = specs.iter().filter(|s| !s.per_layer()).map(|s| (s, 0u64));
    let layered =
        (0..hp.n_layers).flat_map(|l| specs.iter().filter(|s| s.per_layer()).map(move |s| (s, l)));
    globals
        .chain(layered)
        .zip(hp.expected_tensors_in(specs))
        .map(|((spec, l), (name, ne))| {
            let parts = match spec.kind.row_parts() {
                [] => vec![part(&name)?],
                kinds => kinds
                    .iter()
                    .map(|k| part(&k.name_for(l)))
                    .collect::<Result<Vec<_>>>()?,
            };
            Ok(SyntheticTensor { name, ne, parts })
        })
        .collect()
}

/// Draws the rows of one [`SyntheticPart`], chunk by chunk (each chunk its own PRNG stream),
/// keeping the last chunk drawn for the next call.
struct PartGen {
    seed: u64,
    index: u64,
    init: Init,
    cols: usize,
    rows: usize,
    chunk_rows: usize,
    /// The last chunk drawn by [`PartGen::rows`]: (chunk index, values).
    carry: Option<(usize, Vec<f32>)>,
}

impl PartGen {
    fn new(p: &SyntheticPart, seed: u64) -> Self {
        let cols = p.ne[0] as usize;
        PartGen {
            seed,
            index: p.index,
            init: p.init,
            cols,
            rows: p.ne[1..].iter().map(|&n| n as usize).product(),
            chunk_rows: (CHUNK_ELEMS / cols).max(1),
            carry: None,
        }
    }

    #[cfg(test)]
    fn n_chunks(&self) -> usize {
        self.rows.div_ceil(self.chunk_rows)
    }

    /// Chunk `c`'s values (its rows, all columns).
    fn chunk(&self, c: usize) -> Vec<f32> {
        let r0 = c * self.chunk_rows;
        let r1 = (r0 + self.chunk_rows).min(self.rows);
        let mut buf = vec![0f32; (r1 - r0) * self.cols];
        fill_chunk(self.seed, self.index, c as u64, self.init, &mut buf);
        buf
    }

    /// Rows `r0..r1` (`r0 < r1`), drawn in parallel; call with increasing row ranges.
    fn rows(&mut self, r0: usize, r1: usize) -> Vec<f32> {
        let (c0, c1) = (r0 / self.chunk_rows, (r1 - 1) / self.chunk_rows);
        let carried = self.carry.take().filter(|(c, _)| *c == c0);
        let first_new = c0 + usize::from(carried.is_some());
        let fresh: Vec<Vec<f32>> = (first_new..=c1)
            .into_par_iter()
            .map(|c| self.chunk(c))
            .collect();
        let mut chunks: Vec<(usize, Vec<f32>)> = carried
            .into_iter()
            .chain((first_new..=c1).zip(fresh))
            .collect();
        let mut out = Vec::with_capacity((r1 - r0) * self.cols);
        for (c, values) in &chunks {
            let start = c * self.chunk_rows;
            let (a, b) = (
                r0.max(start) - start,
                r1.min(start + self.chunk_rows) - start,
            );
            out.extend_from_slice(&values[a * self.cols..b * self.cols]);
        }
        self.carry = chunks.pop();
        out
    }
}

/// Rows `r0..r1` of a tensor made of `parts` side by side (each row: every part's row in
/// turn, `cols` values in all).
fn side_by_side(parts: &mut [PartGen], r0: usize, r1: usize, cols: usize) -> Vec<f32> {
    let mut block = vec![0f32; (r1 - r0) * cols];
    let mut offset = 0;
    for g in parts {
        let part = g.rows(r0, r1);
        for (row, prow) in block.chunks_exact_mut(cols).zip(part.chunks_exact(g.cols)) {
            row[offset..offset + g.cols].copy_from_slice(prow);
        }
        offset += g.cols;
    }
    block
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_valid() {
        for p in PRESETS {
            let (arch, cfg) = preset(p).unwrap();
            let hp = model::hparams(arch, &cfg).unwrap();
            assert_eq!(hp.arch, arch);
        }
        let (_, c) = preset("spark-gemma2-2b").unwrap();
        assert_eq!(
            (c.d_ff, c.ffn_k, c.ffn_r, c.attn_k, c.attn_r),
            (13824, Some(1106), Some(1024), Some(256), Some(128))
        );
        assert_eq!(preset("gemma2-2b").unwrap().1.d_ff, 9216);
        let (_, c) = preset("spark-gemma2-9b").unwrap();
        assert_eq!(
            (c.d_model, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim),
            (3584, 42, 16, 8, 256)
        );
        assert_eq!(
            (c.d_ff, c.ffn_k, c.ffn_r, c.attn_k, c.attn_r),
            (21504, Some(1720), Some(1536), Some(256), Some(128))
        );
        let (_, c) = preset("gemma2-9b").unwrap();
        assert_eq!(
            (c.d_model, c.n_layers, c.d_ff, c.ffn_k),
            (3584, 42, 14336, None)
        );
        assert!(preset("huge").is_err());
    }

    #[test]
    fn chunks_are_deterministic_and_independent_of_order() {
        let mut a = vec![0f32; 1000];
        let mut b = vec![0f32; 1000];
        fill_chunk(5, 2, 1, Init::Normal(0.1), &mut a);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        pool.install(|| fill_chunk(5, 2, 1, Init::Normal(0.1), &mut b));
        assert_eq!(a, b);
        fill_chunk(5, 2, 2, Init::Normal(0.1), &mut b);
        assert_ne!(a, b);
        fill_chunk(5, 2, 1, Init::Norm, &mut b);
        assert!(b.iter().all(|&x| (x - 1.0).abs() < 1.0));
    }

    #[test]
    fn the_manifest_is_the_written_files() {
        let dir = tempfile::tempdir().unwrap();
        let output = dir.path().join("t.gguf");
        let manifest = crate::convert::default_manifest_path(&output);
        assert_eq!(manifest, dir.path().join("t.gguf.manifest"));
        let o = SyntheticOptions {
            preset: "tiny".into(),
            output: output.clone(),
            seed: 3,
            outtype: OutType::Q8_0,
            overrides: SparkOverrides::default(),
            qkv: QkvLayout::Split,
            ffn_rows: FfnRowLayout::Separate,
            name: None,
            manifest: Some(manifest.clone()),
            force: false,
            quiet: true,
        };
        generate(&o).unwrap();
        let f = spark_gguf::GgufFile::open(&output).unwrap();
        assert_eq!(
            std::fs::read_to_string(&manifest).unwrap(),
            spark_gguf::manifest::manifest_of(&f, "t.gguf").unwrap()
        );
        // both exist now: refused without force, before any work
        std::fs::remove_file(&output).unwrap();
        let e = generate(&o).unwrap_err().to_string();
        assert!(e.contains("t.gguf.manifest: output file exists"), "{e}");
        assert!(!output.exists());
        let e = generate(&SyntheticOptions {
            manifest: Some(output.clone()),
            ..o.clone()
        })
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("the manifest cannot be the output itself"),
            "{e}"
        );
    }

    #[test]
    fn rows_drawn_in_any_blocks_are_the_chunks_drawn_whole() {
        // rows of 4096 values: chunks of 256 rows, the last of 1000 rows short
        let part = SyntheticPart {
            index: 3,
            ne: vec![4096, 1000],
            init: Init::Normal(0.5),
        };
        let whole: Vec<f32> = {
            let g = PartGen::new(&part, 9);
            assert_eq!((g.chunk_rows, g.n_chunks()), (256, 4));
            (0..g.n_chunks()).flat_map(|c| g.chunk(c)).collect()
        };
        assert_eq!(whole.len(), 4096 * 1000);
        for step in [1, 100, 256, 300, 1000] {
            let mut g = PartGen::new(&part, 9);
            let mut drawn = Vec::new();
            for r0 in (0..1000).step_by(step) {
                drawn.extend(g.rows(r0, (r0 + step).min(1000)));
            }
            assert!(drawn == whole, "blocks of {step} rows");
        }
    }

    #[test]
    fn paired_tensors_draw_the_separate_tensors_values() {
        let (arch, cfg) = preset("tiny").unwrap();
        let hp = model::hparams(arch, &cfg).unwrap();
        for qkv in [QkvLayout::Split, QkvLayout::Stacked] {
            let separate =
                synthetic_tensors(&hp, Layout::new(qkv, FfnRowLayout::Separate)).unwrap();
            let paired = synthetic_tensors(&hp, Layout::new(qkv, FfnRowLayout::Paired)).unwrap();
            // the separate layout draws tensor i from stream i
            for (i, t) in separate.iter().enumerate() {
                assert_eq!(t.parts.len(), 1);
                assert_eq!(t.parts[0].index, i as u64);
            }
            let index = |name: &str| separate.iter().position(|t| t.name == name).unwrap() as u64;
            for t in &paired {
                let want: Vec<u64> = if t.name.contains("ffn_k2v") {
                    let l = &t.name["blk.".len()..t.name.find(".ffn").unwrap()];
                    vec![
                        index(&format!("blk.{l}.ffn_up.weight")),
                        index(&format!("blk.{l}.ffn_down_t.weight")),
                    ]
                } else {
                    vec![index(&t.name)]
                };
                let got: Vec<u64> = t.parts.iter().map(|p| p.index).collect();
                assert_eq!(got, want, "{}", t.name);
            }
        }
    }

    #[test]
    fn fan_in_follows_the_contracted_dimension() {
        assert_eq!(
            init_for("blk.0.attn_q.weight", &[64, 128]),
            Init::Normal(0.125)
        );
        assert_eq!(
            init_for("blk.0.ffn_down_t.weight", &[128, 64]),
            Init::Normal(0.125)
        );
        assert_eq!(init_for("output_norm.weight", &[64]), Init::Norm);
    }
}
