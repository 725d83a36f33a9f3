//! The checkpoint layout (SPEC section 5): which `.npz` entry feeds each GGUF tensor, the
//! entry's expected numpy shape, and the strided view that turns it into the tensor's rows.
//!
//! GGUF tensor names, their order and their ggml shapes come from `spark_gguf::schema`; this
//! module only says where each one's data lives in a Gemma Flax-style checkpoint.

use std::collections::BTreeSet;

use spark_gguf::schema::{Hparams, Layout, TensorKind};

use crate::error::{Error, Result};
use crate::layout::View;

/// Name of the config entry.
pub const CONFIG_ENTRY: &str = "config";
/// Name of the optional tokenizer entry.
pub const TOKENIZER_ENTRY: &str = "tokenizer";
/// Name of the optional chat template entry (0-d unicode or 1-d uint8 UTF-8 text, like
/// `config`); written as `tokenizer.chat_template`.
pub const CHAT_TEMPLATE_ENTRY: &str = "chat_template";
/// Embedding entry.
pub const EMBEDDING_ENTRY: &str = "transformer/embedder/input_embedding";
/// Final norm entry.
pub const FINAL_NORM_ENTRY: &str = "transformer/final_norm/scale";

/// Entry name of `what` in layer `l`.
pub fn layer_entry(l: u64, what: &str) -> String {
    format!("transformer/layer_{l}/{what}")
}

/// Per-layer entry suffixes.
pub mod entry {
    /// Pre-attention norm scale `[D]`.
    pub const PRE_ATTENTION_NORM: &str = "pre_attention_norm/scale";
    /// Query projection [N, D, H].
    pub const Q_EINSUM: &str = "attn/q_einsum/w";
    /// Key/value projections [2, KV, D, H].
    pub const KV_EINSUM: &str = "attn/kv_einsum/w";
    /// Output projection [N, H, D].
    pub const ATTN_VEC_EINSUM: &str = "attn/attn_vec_einsum/w";
    /// Post-attention norm scale `[D]`.
    pub const POST_ATTENTION_NORM: &str = "post_attention_norm/scale";
    /// Pre-FFN norm scale `[D]`.
    pub const PRE_FFW_NORM: &str = "pre_ffw_norm/scale";
    /// Fused Spark K [D, F].
    pub const SPARK_IN: &str = "mlp/spark_in";
    /// Spark K1 [r_f, F].
    pub const SPARK_K1: &str = "mlp/spark_k1";
    /// Spark K2 [D - r_f, F].
    pub const SPARK_K2: &str = "mlp/spark_k2";
    /// Dense gate and up [2, D, F] or [2, F, D].
    pub const GATING_EINSUM: &str = "mlp/gating_einsum";
    /// V (Spark) or down projection (dense) [F, D].
    pub const LINEAR: &str = "mlp/linear";
    /// Post-FFN norm scale `[D]`.
    pub const POST_FFW_NORM: &str = "post_ffw_norm/scale";
}

/// Where one GGUF tensor's data comes from: its parts, joined as `join` says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSource {
    /// GGUF tensor name.
    pub name: String,
    /// ggml dims (ne0 first), from the schema.
    pub ne: Vec<u64>,
    /// The parts (one for every tensor but Spark's stacked `attn_qkv`, Q's, K's and V's rows,
    /// and paired `ffn_k2v`, K2's and V's rows side by side).
    pub parts: Vec<SourcePart>,
    /// How the parts make the tensor's rows.
    pub join: Join,
}

/// How a tensor's parts make its rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Join {
    /// The tensor's rows are the first part's rows, then the second's, ... (`attn_qkv`; a
    /// one-part tensor).
    Rows,
    /// Row j of the tensor is row j of every part, side by side (`ffn_k2v`:
    /// [`TensorKind::row_parts`]).
    Columns,
}

impl TensorSource {
    /// The widths of a row's parts: each part's row width for [`Join::Columns`], else the one
    /// row width (what the tensor's type must make whole blocks).
    pub fn row_part_widths(&self) -> Vec<u64> {
        match self.join {
            Join::Columns => self.parts.iter().map(|p| p.view.cols() as u64).collect(),
            Join::Rows => vec![self.ne[0]],
        }
    }
}

/// Some rows of a tensor (consecutive rows, or a part of every row), read from one checkpoint
/// entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourcePart {
    /// Checkpoint entry.
    pub entry: String,
    /// Output rows from the entry.
    pub view: View,
}

impl SourcePart {
    fn new((entry, view): (String, View)) -> Self {
        SourcePart { entry, view }
    }
}

/// How a dense checkpoint stores `gating_einsum`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GatingLayout {
    /// [2, D, F] (`x @ w[i]`).
    DF,
    /// [2, F, D] (`w[i] @ x`).
    FD,
}

/// The checkpoint's entries and shapes, as the mapping needs them.
pub trait Shapes {
    /// Numpy shape of `entry`, `None` if absent.
    fn shape(&self, entry: &str) -> Option<Vec<usize>>;
}

fn need(shapes: &dyn Shapes, entry: &str, expected: &[usize]) -> Result<()> {
    match shapes.shape(entry) {
        None => Err(Error::entry(
            entry,
            format!("is missing (expected shape {expected:?})"),
        )),
        Some(s) if s != expected => Err(Error::entry(
            entry,
            format!("has shape {s:?} but the config calls for {expected:?}"),
        )),
        Some(_) => Ok(()),
    }
}

fn norm_view(d: usize) -> View {
    View {
        add_one: true,
        ..View::contiguous(0, 1, d)
    }
}

/// Maps every tensor of `hp.arch` laid out as `layout` (Wq, Wk, Wv stacked or not; K2 and V
/// paired or not) to its checkpoint entries, checking each entry's shape. Returns the sources in
/// schema order and the set of entries used. `gating` is the dense FFN layout (ignored for
/// Spark).
pub fn plan_sources(
    shapes: &dyn Shapes,
    hp: &Hparams,
    gating: GatingLayout,
    layout: Layout,
) -> Result<(Vec<TensorSource>, BTreeSet<String>)> {
    let z = Sizes::of(hp);
    let spark = hp.arch.is_spark();
    let specs = hp.arch.tensors_with(layout);
    let expected = hp.expected_tensors_in(specs);
    let mut used = BTreeSet::new();
    let mut out = Vec::with_capacity(expected.len());
    check_embedding(shapes, z)?;
    let globals = specs.iter().filter(|s| !s.per_layer()).map(|s| (s, 0u64));
    let layered =
        (0..hp.n_layers).flat_map(|l| specs.iter().filter(|s| s.per_layer()).map(move |s| (s, l)));
    for ((spec, l), (name, ne)) in globals.chain(layered).zip(expected) {
        let (parts, join) = Mapping {
            shapes,
            z,
            spark,
            gating,
        }
        .sources_of(spec.kind, l)?;
        check_maps_to(&name, &parts, join, &ne)?;
        used.extend(parts.iter().map(|p| p.entry.clone()));
        out.push(TensorSource {
            name,
            ne,
            parts,
            join,
        });
    }
    Ok((out, used))
}

/// The model's sizes, as the checkpoint's numpy shapes count them.
#[derive(Clone, Copy)]
struct Sizes {
    /// Vocabulary size.
    v: usize,
    /// D.
    d: usize,
    /// N.
    n: usize,
    /// KV.
    kv: usize,
    /// H.
    h: usize,
    /// F.
    f: usize,
    /// r_f.
    rf: usize,
}

impl Sizes {
    fn of(hp: &Hparams) -> Self {
        Sizes {
            v: hp.vocab as usize,
            d: hp.d_model as usize,
            n: hp.n_heads as usize,
            kv: hp.n_kv_heads as usize,
            h: hp.head_dim as usize,
            f: hp.d_ff as usize,
            rf: hp.ffn_r as usize,
        }
    }
}

/// The embedding entry: [>= vocab, D] (a checkpoint may pad the vocabulary).
fn check_embedding(shapes: &dyn Shapes, z: Sizes) -> Result<()> {
    let Sizes { v, d, .. } = z;
    let emb = shapes.shape(EMBEDDING_ENTRY).ok_or_else(|| {
        Error::entry(
            EMBEDDING_ENTRY,
            format!("is missing (expected shape [>= {v}, {d}])"),
        )
    })?;
    if emb.len() != 2 || emb[1] != d || emb[0] < v {
        return Err(Error::entry(
            EMBEDDING_ENTRY,
            format!(
                "has shape {emb:?} but the config calls for [>= {v} (vocab_size), {d} (d_model)]"
            ),
        ));
    }
    Ok(())
}

/// What maps a checkpoint's entries to tensors: its shapes, the model's sizes, whether it is a
/// Spark model, and a dense model's gating layout.
#[derive(Clone, Copy)]
struct Mapping<'a> {
    shapes: &'a dyn Shapes,
    z: Sizes,
    spark: bool,
    gating: GatingLayout,
}

impl Mapping<'_> {
    /// Where tensor `kind` of layer `l` (0 for global tensors) comes from: its parts and how
    /// they join (Spark's stacked `attn_qkv` has three, the rows of Q, K and V; paired `ffn_k2v`
    /// two, K2's and V's rows side by side, [`TensorKind::row_parts`]).
    fn sources_of(self, kind: TensorKind, l: u64) -> Result<(Vec<SourcePart>, Join)> {
        let one = |kind| source_of(self, kind, l).map(SourcePart::new);
        let parts =
            |kinds: &[TensorKind]| kinds.iter().map(|&k| one(k)).collect::<Result<Vec<_>>>();
        match kind {
            TensorKind::AttnQkv => Ok((
                parts(&[TensorKind::AttnQ, TensorKind::AttnK, TensorKind::AttnV])?,
                Join::Rows,
            )),
            kind if !kind.row_parts().is_empty() => Ok((parts(kind.row_parts())?, Join::Columns)),
            kind => Ok((vec![one(kind)?], Join::Rows)),
        }
    }
}

/// Where the one-part tensor `kind` of layer `l` (0 for global tensors) comes from: its entry,
/// shape checked, and the view that turns the entry into the tensor's rows.
fn source_of(m: Mapping<'_>, kind: TensorKind, l: u64) -> Result<(String, View)> {
    let Mapping {
        shapes,
        z,
        spark,
        gating,
    } = m;
    let Sizes {
        v, d, n, kv, h, f, ..
    } = z;
    let e = |what: &str| layer_entry(l, what);
    Ok(match kind {
        TensorKind::TokenEmbd => (EMBEDDING_ENTRY.to_string(), View::contiguous(0, v, d)),
        TensorKind::OutputNorm => {
            need(shapes, FINAL_NORM_ENTRY, &[d])?;
            (FINAL_NORM_ENTRY.to_string(), norm_view(d))
        }
        TensorKind::AttnNorm => norm(shapes, e(entry::PRE_ATTENTION_NORM), d)?,
        TensorKind::PostAttentionNorm => norm(shapes, e(entry::POST_ATTENTION_NORM), d)?,
        TensorKind::FfnNorm => norm(shapes, e(entry::PRE_FFW_NORM), d)?,
        TensorKind::PostFfwNorm => norm(shapes, e(entry::POST_FFW_NORM), d)?,
        // out[n*H + h, d] = q[n, d, h]
        TensorKind::AttnQ => {
            let (rows, cols) = (vec![(n, d * h), (h, 1)], vec![(d, h)]);
            einsum(shapes, e(entry::Q_EINSUM), &[n, d, h], 0, rows, cols)?
        }
        // out[g*H + h, d] = kv[i, g, d, h], i = 0 for K and 1 for V
        TensorKind::AttnK | TensorKind::AttnV => {
            let base = if kind == TensorKind::AttnK {
                0
            } else {
                kv * d * h
            };
            let (rows, cols) = (vec![(kv, d * h), (h, 1)], vec![(d, h)]);
            let en = e(entry::KV_EINSUM);
            einsum(shapes, en, &[2, kv, d, h], base, rows, cols)?
        }
        // out[d, n*H + h] = o[n, h, d]
        TensorKind::AttnOutput => {
            let (rows, cols) = (vec![(d, 1)], vec![(n, h * d), (h, d)]);
            einsum(shapes, e(entry::ATTN_VEC_EINSUM), &[n, h, d], 0, rows, cols)?
        }
        TensorKind::FfnGate | TensorKind::FfnUp if spark => {
            spark_ffn_in(shapes, l, z, kind == TensorKind::FfnGate)?
        }
        TensorKind::FfnGate | TensorKind::FfnUp => dense_ffn_in(
            shapes,
            e(entry::GATING_EINSUM),
            z,
            gating,
            kind == TensorKind::FfnUp,
        )?,
        TensorKind::FfnDownT => {
            let en = e(entry::LINEAR);
            need(shapes, &en, &[f, d])?;
            (en, View::contiguous(0, f, d))
        }
        TensorKind::FfnDown => {
            let en = e(entry::LINEAR);
            need(shapes, &en, &[f, d])?;
            (en, View::transposed(0, f, d))
        }
        TensorKind::AttnQkv | TensorKind::FfnK2v => {
            return Err(Error::Internal(format!(
                "internal: {} has parts (sources_of)",
                kind.short_name()
            )))
        }
    })
}

/// Entry `en` (an einsum weight), checked to have `shape`, read from element `base` with row
/// digits `row_dims` and column digits `col_dims`.
fn einsum(
    shapes: &dyn Shapes,
    en: String,
    shape: &[usize],
    base: usize,
    row_dims: Vec<(usize, usize)>,
    col_dims: Vec<(usize, usize)>,
) -> Result<(String, View)> {
    need(shapes, &en, shape)?;
    let view = View {
        base,
        row_dims,
        col_dims,
        add_one: false,
    };
    Ok((en, view))
}

/// Spark's K1 (`gate`) or K2 of layer `l`: from the fused `spark_in` [D, F] or from
/// `spark_k1` [r_f, F] and `spark_k2` [D - r_f, F], never both forms.
fn spark_ffn_in(shapes: &dyn Shapes, l: u64, z: Sizes, gate: bool) -> Result<(String, View)> {
    let Sizes { d, f, rf, .. } = z;
    let e = |what: &str| layer_entry(l, what);
    let (fused, k1, k2) = (e(entry::SPARK_IN), e(entry::SPARK_K1), e(entry::SPARK_K2));
    let has_split = shapes.shape(&k1).is_some() || shapes.shape(&k2).is_some();
    Ok(match (shapes.shape(&fused).is_some(), has_split) {
        (true, true) => {
            return Err(Error::entry(
                &fused,
                format!("and '{k1}'/'{k2}' are both present; give one form only"),
            ))
        }
        (true, false) => {
            need(shapes, &fused, &[d, f])?;
            // K = [K1; K2] split at r_f; out row j = column j of the part.
            if gate {
                (fused, View::transposed(0, rf, f))
            } else {
                (fused, View::transposed(rf * f, d - rf, f))
            }
        }
        (false, _) if gate => {
            if shapes.shape(&k1).is_none() && shapes.shape(&k2).is_none() {
                return Err(Error::entry(
                    &fused,
                    format!("is missing (expected shape [{d}, {f}], or '{k1}' and '{k2}')"),
                ));
            }
            need(shapes, &k1, &[rf, f])?;
            (k1, View::transposed(0, rf, f))
        }
        (false, _) => {
            need(shapes, &k2, &[d - rf, f])?;
            (k2, View::transposed(0, d - rf, f))
        }
    })
}

/// The dense gate (`up` false) or up projection (true) from `gating_einsum`, in `gating`'s
/// layout.
fn dense_ffn_in(
    shapes: &dyn Shapes,
    en: String,
    z: Sizes,
    gating: GatingLayout,
    up: bool,
) -> Result<(String, View)> {
    let Sizes { d, f, .. } = z;
    let which = usize::from(up);
    Ok(match gating {
        GatingLayout::DF => {
            need(shapes, &en, &[2, d, f])?;
            (en, View::transposed(which * d * f, d, f))
        }
        GatingLayout::FD => {
            need(shapes, &en, &[2, f, d])?;
            (en, View::contiguous(which * f * d, f, d))
        }
    })
}

/// The view's shape is the schema's `ne` for tensor `name` (an internal consistency check).
fn check_maps_to(name: &str, parts: &[SourcePart], join: Join, ne: &[u64]) -> Result<()> {
    let first = |f: fn(&View) -> usize| parts.first().map_or(0, |p| f(&p.view));
    let (width, rows, same) = match join {
        // the parts' rows are as wide as the tensor's and add up to its rows
        Join::Rows => (
            first(View::cols),
            parts.iter().map(|p| p.view.rows()).sum(),
            parts.iter().all(|p| p.view.cols() == first(View::cols)),
        ),
        // the parts have the tensor's rows, and their widths add up to its width
        Join::Columns => (
            parts.iter().map(|p| p.view.cols()).sum(),
            first(View::rows),
            parts.iter().all(|p| p.view.rows() == first(View::rows)),
        ),
    };
    let got = if ne.len() == 1 {
        vec![width as u64]
    } else {
        vec![width as u64, rows as u64]
    };
    if got != ne || !same {
        return Err(Error::Internal(format!(
            "internal: tensor '{name}' maps to {got:?}, the schema says {ne:?}"
        )));
    }
    Ok(())
}

fn norm(shapes: &dyn Shapes, entry: String, d: usize) -> Result<(String, View)> {
    need(shapes, &entry, &[d])?;
    Ok((entry, norm_view(d)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use spark_gguf::schema::{Arch, FfnRowLayout, QkvLayout, SPARK_ARCH};

    const STACKED_QKV: Layout = Layout::new(QkvLayout::Stacked, FfnRowLayout::Separate);
    use std::collections::HashMap;

    struct Map(HashMap<String, Vec<usize>>);
    impl Shapes for Map {
        fn shape(&self, entry: &str) -> Option<Vec<usize>> {
            self.0.get(entry).cloned()
        }
    }

    fn hp(arch: Arch) -> Hparams {
        Hparams {
            arch,
            vocab: 10,
            d_model: 8,
            n_layers: 2,
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: 4,
            d_ff: 12,
            ffn_k: 3,
            ffn_r: 3,
            attn_k: 2,
            attn_r: 2,
        }
    }

    fn spark_shapes(split: bool) -> Map {
        let mut m = HashMap::new();
        m.insert(EMBEDDING_ENTRY.to_string(), vec![16, 8]);
        m.insert(FINAL_NORM_ENTRY.to_string(), vec![8]);
        for l in 0..2 {
            for n in [
                entry::PRE_ATTENTION_NORM,
                entry::POST_ATTENTION_NORM,
                entry::PRE_FFW_NORM,
                entry::POST_FFW_NORM,
            ] {
                m.insert(layer_entry(l, n), vec![8]);
            }
            m.insert(layer_entry(l, entry::Q_EINSUM), vec![2, 8, 4]);
            m.insert(layer_entry(l, entry::KV_EINSUM), vec![2, 1, 8, 4]);
            m.insert(layer_entry(l, entry::ATTN_VEC_EINSUM), vec![2, 4, 8]);
            if split {
                m.insert(layer_entry(l, entry::SPARK_K1), vec![3, 12]);
                m.insert(layer_entry(l, entry::SPARK_K2), vec![5, 12]);
            } else {
                m.insert(layer_entry(l, entry::SPARK_IN), vec![8, 12]);
            }
            m.insert(layer_entry(l, entry::LINEAR), vec![12, 8]);
        }
        Map(m)
    }

    #[test]
    fn maps_every_spark_tensor_and_uses_every_entry() {
        for split in [false, true] {
            let shapes = spark_shapes(split);
            let (src, used) = plan_sources(
                &shapes,
                &hp(SPARK_ARCH),
                GatingLayout::DF,
                Layout::default(),
            )
            .unwrap();
            assert_eq!(src.len(), 2 + 11 * 2);
            assert_eq!(used.len(), shapes.0.len());
            let gate = src
                .iter()
                .find(|s| s.name == "blk.1.ffn_gate.weight")
                .unwrap();
            assert_eq!(gate.ne, vec![3, 12]);
            let up = src
                .iter()
                .find(|s| s.name == "blk.1.ffn_up.weight")
                .unwrap();
            assert_eq!(up.ne, vec![5, 12]);
            if !split {
                assert_eq!(up.parts[0].view, View::transposed(36, 5, 12));
            }
            let emb = &src[0];
            assert_eq!(
                (emb.parts[0].view.rows(), emb.parts[0].view.cols()),
                (10, 8)
            );
            let v = src
                .iter()
                .find(|s| s.name == "blk.1.attn_v.weight")
                .unwrap();
            assert_eq!(v.parts.len(), 1);
        }
    }

    #[test]
    fn stacks_wq_wk_wv_from_two_entries() {
        let shapes = spark_shapes(false);
        let h = hp(SPARK_ARCH);
        let (src, used) = plan_sources(&shapes, &h, GatingLayout::DF, STACKED_QKV).unwrap();
        assert_eq!(src.len(), 2 + 9 * 2);
        assert_eq!(used.len(), shapes.0.len());
        assert!(src.iter().all(|s| !s.name.contains("attn_q.")));
        // Q's rows, then K's and V's from the two halves of kv_einsum
        let qkv = src
            .iter()
            .find(|s| s.name == "blk.1.attn_qkv.weight")
            .unwrap();
        let rows = (h.n_heads + 2 * h.n_kv_heads) * h.head_dim;
        assert_eq!(qkv.ne, vec![h.d_model, rows]);
        let entries: Vec<&str> = qkv.parts.iter().map(|p| p.entry.as_str()).collect();
        let kv = "transformer/layer_1/attn/kv_einsum/w";
        assert_eq!(entries, ["transformer/layer_1/attn/q_einsum/w", kv, kv]);
        let kv_elems = (h.n_kv_heads * h.d_model * h.head_dim) as usize;
        assert_eq!(
            (qkv.parts[1].view.base, qkv.parts[2].view.base),
            (0, kv_elems)
        );
    }

    #[test]
    fn pairs_k2_and_v_side_by_side_in_both_qkv_layouts() {
        let h = hp(SPARK_ARCH);
        for (split, qkv) in [(false, QkvLayout::Split), (true, QkvLayout::Stacked)] {
            let shapes = spark_shapes(split);
            let layout = Layout::new(qkv, FfnRowLayout::Paired);
            let (src, used) = plan_sources(&shapes, &h, GatingLayout::DF, layout).unwrap();
            let per_layer = if qkv == QkvLayout::Stacked { 8 } else { 10 };
            assert_eq!(src.len(), 2 + per_layer * 2);
            assert_eq!(used.len(), shapes.0.len());
            assert!(src
                .iter()
                .all(|s| !s.name.contains("ffn_up") && !s.name.contains("ffn_down")));
            let k2v = src
                .iter()
                .find(|s| s.name == "blk.1.ffn_k2v.weight")
                .unwrap();
            // (D - r_f) + D = 5 + 8 values per row, one row per neuron
            assert_eq!(k2v.ne, vec![5 + 8, 12]);
            assert_eq!(k2v.join, Join::Columns);
            assert_eq!(k2v.row_part_widths(), vec![5, 8]);
            let entries: Vec<&str> = k2v.parts.iter().map(|p| p.entry.as_str()).collect();
            let k2 = if split {
                "transformer/layer_1/mlp/spark_k2"
            } else {
                "transformer/layer_1/mlp/spark_in"
            };
            assert_eq!(entries, [k2, "transformer/layer_1/mlp/linear"]);
            // the same views as the separate tensors' (K2 = K's rows r_f.., transposed)
            let k2_view = if split {
                View::transposed(0, 5, 12)
            } else {
                View::transposed(36, 5, 12)
            };
            assert_eq!(k2v.parts[0].view, k2_view);
            assert_eq!(k2v.parts[1].view, View::contiguous(0, 12, 8));
            let order: Vec<&str> = src.iter().map(|s| s.name.as_str()).collect();
            let i = order
                .iter()
                .position(|n| *n == "blk.0.ffn_k2v.weight")
                .unwrap();
            assert_eq!(
                [order[i - 1], order[i + 1]],
                ["blk.0.ffn_gate.weight", "blk.0.post_ffw_norm.weight"]
            );
            let up = plan_sources(
                &shapes,
                &h,
                GatingLayout::DF,
                Layout::new(qkv, FfnRowLayout::Separate),
            )
            .unwrap()
            .0
            .into_iter()
            .find(|s| s.name == "blk.1.ffn_up.weight")
            .unwrap();
            assert_eq!((up.join, up.row_part_widths()), (Join::Rows, vec![5]));
        }
    }

    #[test]
    fn names_missing_and_misshapen_entries() {
        let mut s = spark_shapes(false);
        s.0.remove(&layer_entry(1, entry::Q_EINSUM));
        let e = plan_sources(&s, &hp(SPARK_ARCH), GatingLayout::DF, Layout::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("transformer/layer_1/attn/q_einsum/w") && e.contains("missing"),
            "{e}"
        );
        let mut s = spark_shapes(false);
        s.0.insert(layer_entry(0, entry::LINEAR), vec![8, 12]);
        let e = plan_sources(&s, &hp(SPARK_ARCH), GatingLayout::DF, Layout::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("layer_0/mlp/linear") && e.contains("[8, 12]"),
            "{e}"
        );
        let mut s = spark_shapes(false);
        s.0.insert(layer_entry(0, entry::SPARK_K1), vec![3, 12]);
        assert!(
            plan_sources(&s, &hp(SPARK_ARCH), GatingLayout::DF, Layout::default())
                .unwrap_err()
                .to_string()
                .contains("both")
        );
        let mut s = spark_shapes(false);
        s.0.insert(EMBEDDING_ENTRY.into(), vec![9, 8]);
        assert!(
            plan_sources(&s, &hp(SPARK_ARCH), GatingLayout::DF, Layout::default())
                .unwrap_err()
                .to_string()
                .contains("input_embedding")
        );
    }

    #[test]
    fn dense_gating_in_both_layouts() {
        let mut s = spark_shapes(false);
        for l in 0..2 {
            s.0.remove(&layer_entry(l, entry::SPARK_IN));
            s.0.insert(layer_entry(l, entry::GATING_EINSUM), vec![2, 8, 12]);
        }
        let h = hp(Arch::Gemma2);
        let (src, _) = plan_sources(&s, &h, GatingLayout::DF, Layout::default()).unwrap();
        let up = src
            .iter()
            .find(|t| t.name == "blk.0.ffn_up.weight")
            .unwrap();
        assert_eq!(
            (up.ne.clone(), up.parts[0].view.clone()),
            (vec![8, 12], View::transposed(96, 8, 12))
        );
        let down = src
            .iter()
            .find(|t| t.name == "blk.0.ffn_down.weight")
            .unwrap();
        assert_eq!(
            (down.ne.clone(), down.parts[0].view.clone()),
            (vec![12, 8], View::transposed(0, 12, 8))
        );
        assert!(plan_sources(&s, &h, GatingLayout::FD, Layout::default()).is_err());
    }
}
