//! Checkpoint to GGUF: read and check everything that can be checked, then stream the tensors.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use spark_gguf::schema::{keys, Arch, FfnRowLayout, Layout, QkvLayout, GEMMA2_ARCH, SPARK_ARCH};
use spark_gguf::{GgmlType, GgufFile, GgufWriter, TensorPlan, Value};

use crate::chat_template;
use crate::checkpoint::{
    self, entry, layer_entry, GatingLayout, Join, Shapes, SourcePart, TensorSource,
    CHAT_TEMPLATE_ENTRY, CONFIG_ENTRY, TOKENIZER_ENTRY,
};
use crate::config::{config_text, entry_text, ModelConfig};
use crate::emit::{block_rows, write_pipelined, ChunkSink};
use crate::error::{Error, Result};
use crate::layout::SourceDtype;
use crate::model::{self, OutType};
use crate::npy::NpyDtype;
use crate::npz::{ArrayBytes, Member, Npz};
use crate::progress::Progress;
use crate::tokenizer::parse_sentencepiece;

/// Overrides of the config's Spark parameters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SparkOverrides {
    /// k_f.
    pub ffn_k: Option<u32>,
    /// r_f.
    pub ffn_r: Option<u32>,
    /// k_a.
    pub attn_k: Option<u32>,
    /// r_a.
    pub attn_r: Option<u32>,
}

impl SparkOverrides {
    /// Whether any override is set.
    pub fn any(&self) -> bool {
        self.ffn_k.is_some()
            || self.ffn_r.is_some()
            || self.attn_k.is_some()
            || self.attn_r.is_some()
    }

    /// Applies the overrides to `cfg`.
    pub fn apply(&self, cfg: &mut ModelConfig) {
        cfg.ffn_k = self.ffn_k.or(cfg.ffn_k);
        cfg.ffn_r = self.ffn_r.or(cfg.ffn_r);
        cfg.attn_k = self.attn_k.or(cfg.attn_k);
        cfg.attn_r = self.attn_r.or(cfg.attn_r);
    }
}

/// The float type the checkpoint declares (config `"dtype"` or `--input-dtype`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputDtype {
    /// float32
    F32,
    /// float16
    F16,
    /// bfloat16 (`|V2` arrays)
    BF16,
}

impl InputDtype {
    /// Parses `float32|float16|bfloat16`.
    pub fn parse(s: &str) -> Option<InputDtype> {
        match s {
            "float32" => Some(InputDtype::F32),
            "float16" => Some(InputDtype::F16),
            "bfloat16" => Some(InputDtype::BF16),
            _ => None,
        }
    }

    /// The numpy name.
    pub fn name(self) -> &'static str {
        match self {
            InputDtype::F32 => "float32",
            InputDtype::F16 => "float16",
            InputDtype::BF16 => "bfloat16",
        }
    }

    fn source(self) -> SourceDtype {
        match self {
            InputDtype::F32 => SourceDtype::F32,
            InputDtype::F16 => SourceDtype::F16,
            InputDtype::BF16 => SourceDtype::BF16,
        }
    }
}

/// Everything `spark-convert IN.npz OUT.gguf` needs.
#[derive(Clone, Debug)]
pub struct ConvertOptions {
    /// The `.npz` checkpoint.
    pub input: PathBuf,
    /// The GGUF to write.
    pub output: PathBuf,
    /// Tensor storage choice.
    pub outtype: OutType,
    /// Declared checkpoint dtype (overrides the config's `"dtype"`).
    pub input_dtype: Option<InputDtype>,
    /// A SentencePiece `.model` file.
    pub tokenizer: Option<PathBuf>,
    /// A GGUF whose `tokenizer.*` keys are copied.
    pub vocab_from: Option<PathBuf>,
    /// `tokenizer.chat_template` text (already resolved, see [`chat_template::from_arg`]). It
    /// wins over the checkpoint's `chat_template` entry, which wins over a template copied by
    /// `--vocab-from`.
    pub chat_template: Option<String>,
    /// Spark parameter overrides.
    pub overrides: SparkOverrides,
    /// How Wq, Wk and Wv are written (`--stack-qkv`: one `attn_qkv`; Spark checkpoints only).
    pub qkv: QkvLayout,
    /// How K2 and V are written (`--pair-k2v`: one `ffn_k2v`; Spark checkpoints only).
    pub ffn_rows: FfnRowLayout,
    /// `general.name` (default: the input file's stem).
    pub name: Option<String>,
    /// Also write a llama-gguf-hash manifest of the tensor data here (see
    /// [`spark_gguf::manifest`]), committed with the output.
    pub manifest: Option<PathBuf>,
    /// Replace an existing output (and manifest).
    pub force: bool,
    /// No progress bar, log lines or summary.
    pub quiet: bool,
}

/// Where `--manifest` without a file name puts the manifest: beside the output, named
/// `OUTPUT.manifest`.
pub fn default_manifest_path(output: &Path) -> PathBuf {
    let mut name = output.as_os_str().to_owned();
    name.push(".manifest");
    PathBuf::from(name)
}

/// Refuses an existing output or manifest unless `force` (checked before any work, and again
/// by the writer).
pub fn check_output(output: &Path, manifest: Option<&Path>, force: bool) -> Result<()> {
    for path in std::iter::once(output).chain(manifest) {
        if !force && path.exists() {
            return Err(Error::Usage(format!(
                "{}: output file exists (pass --force to replace it)",
                path.display()
            )));
        }
    }
    if manifest == Some(output) {
        return Err(Error::Usage(format!(
            "{}: the manifest cannot be the output itself",
            output.display()
        )));
    }
    Ok(())
}

/// Starts writing `output` with `metadata` and `plans`, and its manifest when one is asked for.
pub fn create_writer(
    output: &Path,
    manifest: Option<&Path>,
    force: bool,
    metadata: &[(String, Value)],
    plans: &[TensorPlan],
) -> Result<GgufWriter> {
    let mut w = GgufWriter::create(output, force, metadata, plans, 32)?;
    if let Some(m) = manifest {
        w.write_manifest(m)?;
    }
    Ok(w)
}

impl Shapes for Npz {
    fn shape(&self, entry: &str) -> Option<Vec<usize>> {
        self.member(entry).map(|m| m.header.shape.clone())
    }
}

/// A text entry: 0-d unicode or 1-d uint8 (UTF-8); `what` describes it in the shape error.
fn text_entry(npz: &Npz, name: &str, what: &str) -> Result<Option<String>> {
    let Some(m) = npz.member(name) else {
        return Ok(None);
    };
    let unicode = text_kind(name, m, &format!(" ({what})"))?;
    entry_text(name, &npz.data(m)?, unicode).map(Some)
}

/// Whether a text entry is 0-d unicode (true) or 1-d uint8 (false); anything else is an error
/// naming the entry (`detail` is put after "array" in the message).
fn text_kind(name: &str, m: &Member, detail: &str) -> Result<bool> {
    match (m.header.dtype, m.header.shape.len()) {
        (NpyDtype::Unicode(_), 0) => Ok(true),
        (NpyDtype::U8, 1) => Ok(false),
        (dt, _) => Err(Error::entry(
            name,
            format!(
                "must be a 0-d unicode or 1-d uint8 array{detail}, not {} with shape {:?}",
                dt.describe(),
                m.header.shape
            ),
        )),
    }
}

/// The chat template to write and where it comes from: `--chat-template`, else the checkpoint's
/// `chat_template` entry (the entry is not read when the flag is given).
fn chat_template_source(o: &ConvertOptions, npz: &Npz) -> Result<Option<(String, String)>> {
    if let Some(t) = &o.chat_template {
        let t = chat_template::check(t.clone(), "--chat-template")?;
        return Ok(Some((t, "--chat-template".into())));
    }
    match text_entry(npz, CHAT_TEMPLATE_ENTRY, "the chat template's UTF-8 text")? {
        None => Ok(None),
        Some(t) => {
            if t.trim().is_empty() {
                return Err(Error::entry(
                    CHAT_TEMPLATE_ENTRY,
                    "is empty; it must hold the chat template's Jinja text (or leave the entry out)",
                ));
            }
            Ok(Some((
                t,
                format!("the checkpoint's '{CHAT_TEMPLATE_ENTRY}' entry"),
            )))
        }
    }
}

fn read_config(npz: &Npz) -> Result<ModelConfig> {
    let m = npz.member(CONFIG_ENTRY).ok_or_else(|| {
        Error::entry(
            CONFIG_ENTRY,
            "is missing (a 0-d unicode or 1-d uint8 array holding the config JSON)",
        )
    })?;
    let unicode = text_kind(CONFIG_ENTRY, m, "")?;
    let bytes = npz.data(m)?;
    ModelConfig::parse(&config_text(&bytes, unicode)?)
}

/// The architecture a checkpoint's FFN entries say it is.
fn detect_arch(npz: &Npz) -> Result<Arch> {
    let dense = npz
        .members()
        .iter()
        .find(|m| m.name.ends_with(entry::GATING_EINSUM));
    let spark = npz.members().iter().find(|m| {
        [entry::SPARK_IN, entry::SPARK_K1, entry::SPARK_K2]
            .iter()
            .any(|s| m.name.ends_with(s))
    });
    match (dense, spark) {
        (Some(d), Some(s)) => Err(Error::entry(
            &d.name,
            format!("is a dense FFN entry but '{}' is a Spark one; a checkpoint must be one or the other", s.name),
        )),
        (Some(_), None) => Ok(GEMMA2_ARCH),
        _ => Ok(SPARK_ARCH),
    }
}

fn gating_layout(npz: &Npz, cfg: &ModelConfig) -> GatingLayout {
    let (d, f) = (cfg.d_model as usize, cfg.d_ff as usize);
    match npz.shape(&layer_entry(0, entry::GATING_EINSUM)) {
        Some(s) if s == [2, f, d] && d != f => GatingLayout::FD,
        _ => GatingLayout::DF,
    }
}

fn entry_dtype(name: &str, dt: NpyDtype, declared: Option<InputDtype>) -> Result<SourceDtype> {
    let found = match dt {
        NpyDtype::F32 => InputDtype::F32,
        NpyDtype::F16 => InputDtype::F16,
        NpyDtype::Raw2 => match declared {
            Some(InputDtype::BF16) => InputDtype::BF16,
            Some(d) => {
                return Err(Error::entry(
                    name,
                    format!("holds raw 2-byte values (|V2, bfloat16) but the checkpoint is declared {}", d.name()),
                ))
            }
            None => {
                return Err(Error::entry(
                    name,
                    "holds raw 2-byte values (|V2); if they are bfloat16, say so with \"dtype\": \"bfloat16\" in the config or --input-dtype bfloat16",
                ))
            }
        },
        other => {
            return Err(Error::entry(name, format!("has dtype {}; weights must be float32, float16 or bfloat16", other.describe())))
        }
    };
    if let Some(d) = declared.filter(|&d| d != found) {
        return Err(Error::entry(
            name,
            format!(
                "is {} but the checkpoint is declared {:?}",
                dt.describe(),
                d
            ),
        ));
    }
    Ok(found.source())
}

fn ggml_of(s: SourceDtype) -> GgmlType {
    match s {
        SourceDtype::F32 => GgmlType::F32,
        SourceDtype::F16 => GgmlType::F16,
        SourceDtype::BF16 => GgmlType::BF16,
    }
}

/// The `tokenizer.*` metadata from `--vocab-from`, `--tokenizer`, or the npz entry.
fn tokenizer_metadata(
    o: &ConvertOptions,
    npz: &Npz,
    cfg: &ModelConfig,
) -> Result<Vec<(String, Value)>> {
    if let Some(path) = &o.vocab_from {
        let g = GgufFile::open(path).map_err(|e| Error::Tokenizer(format!("--vocab-from: {e}")))?;
        let md: Vec<(String, Value)> = g
            .metadata()
            .iter()
            .filter(|(k, _)| k.starts_with("tokenizer."))
            .cloned()
            .collect();
        let n = match g.get(keys::TOKENIZER_TOKENS) {
            Some(Value::Array(spark_gguf::Array::String(t))) => t.len(),
            _ => {
                return Err(Error::Tokenizer(format!(
                    "--vocab-from {}: has no {} string array",
                    path.display(),
                    keys::TOKENIZER_TOKENS
                )))
            }
        };
        model::check_vocab_size(n, cfg)
            .map_err(|e| Error::Tokenizer(format!("--vocab-from {}: {e}", path.display())))?;
        return Ok(md);
    }
    let (bytes, from): (Vec<u8>, String) = if let Some(path) = &o.tokenizer {
        (
            std::fs::read(path).map_err(|e| Error::io(path, e))?,
            path.display().to_string(),
        )
    } else if let Some(m) = npz.member(TOKENIZER_ENTRY) {
        if m.header.dtype != NpyDtype::U8 || m.header.shape.len() != 1 {
            return Err(Error::entry(
                TOKENIZER_ENTRY,
                "must be a 1-d uint8 array (a SentencePiece model file's bytes)",
            ));
        }
        (
            npz.data(m)?.to_vec(),
            format!("checkpoint entry '{TOKENIZER_ENTRY}'"),
        )
    } else {
        return Err(Error::Tokenizer(
            "none given: pass --tokenizer FILE.model (SentencePiece), add a 'tokenizer' entry (1-d uint8) to the checkpoint, or pass --vocab-from MODEL.gguf".into(),
        ));
    };
    // Tokenizer errors name where the model came from (once: "tokenizer: FROM: reason").
    let with_source = |e: Error| match e {
        Error::Tokenizer(m) => Error::Tokenizer(format!("{from}: {m}")),
        other => other,
    };
    let vocab = parse_sentencepiece(&bytes).map_err(&with_source)?;
    model::vocab_metadata(&vocab, cfg).map_err(&with_source)
}

/// One tensor ready to write: where from (each part's entry read as its dtype), as what.
struct Job {
    source: TensorSource,
    dtypes: Vec<SourceDtype>,
    ty: GgmlType,
}

/// Converts a checkpoint. On any error nothing is left at the output path.
pub fn convert(o: &ConvertOptions) -> Result<()> {
    check_output(&o.output, o.manifest.as_deref(), o.force)?;
    if o.tokenizer.is_some() && o.vocab_from.is_some() {
        return Err(Error::Usage(
            "give --tokenizer or --vocab-from, not both".into(),
        ));
    }
    let npz = Npz::open(&o.input)?;
    let mut cfg = read_config(&npz)?;
    let arch = detect_arch(&npz)?;
    if arch == GEMMA2_ARCH && o.overrides.any() {
        return Err(Error::Usage(
            "--ffn-k/--ffn-r/--attn-k/--attn-r apply to Spark checkpoints; this one is dense (mlp/gating_einsum)".into(),
        ));
    }
    if arch == GEMMA2_ARCH && o.qkv != QkvLayout::Split {
        return Err(Error::Usage(
            "--stack-qkv applies to Spark checkpoints; this one is dense (mlp/gating_einsum)"
                .into(),
        ));
    }
    if arch == GEMMA2_ARCH && o.ffn_rows != FfnRowLayout::Separate {
        return Err(Error::Usage(
            "--pair-k2v applies to Spark checkpoints; this one is dense (mlp/gating_einsum)".into(),
        ));
    }
    let layout = Layout::new(o.qkv, o.ffn_rows);
    o.overrides.apply(&mut cfg);
    let declared = match (o.input_dtype, &cfg.dtype) {
        (Some(d), _) => Some(d),
        (None, Some(s)) => Some(InputDtype::parse(s).ok_or_else(|| {
            Error::Config(format!(
                "'dtype' is '{s}'; it must be float32, float16 or bfloat16"
            ))
        })?),
        (None, None) => None,
    };
    let hp = model::hparams(arch, &cfg)?;
    let (sources, used) = checkpoint::plan_sources(&npz, &hp, gating_layout(&npz, &cfg), layout)?;
    check_extra_entries(&npz, &used, arch)?;

    let mut jobs = Vec::with_capacity(sources.len());
    let mut notes = Vec::new();
    for source in sources {
        let dtypes = source
            .parts
            .iter()
            .map(|p| {
                let member = npz.member(&p.entry).expect("planned entries exist");
                entry_dtype(&p.entry, member.header.dtype, declared)
            })
            .collect::<Result<Vec<_>>>()?;
        // parts of different dtypes (a stacked or paired tensor) are stored as the lossless
        // f32 under --outtype auto
        let dtype = match dtypes.as_slice() {
            [first, rest @ ..] if rest.iter().all(|d| d == first) => *first,
            _ => SourceDtype::F32,
        };
        let widths = source.row_part_widths();
        let (ty, fallback) =
            model::tensor_type_parts(o.outtype, ggml_of(dtype), &source.ne, &widths);
        if fallback {
            notes.push(model::fallback_note(&source.name, &widths));
        }
        jobs.push(Job { source, dtypes, ty });
    }
    let mut tok_md = tokenizer_metadata(o, &npz, &cfg)?;
    if npz.member(TOKENIZER_ENTRY).is_some() && (o.tokenizer.is_some() || o.vocab_from.is_some()) {
        notes.push(format!(
            "note: the checkpoint's '{TOKENIZER_ENTRY}' entry is ignored; the vocabulary comes from {}",
            if o.tokenizer.is_some() { "--tokenizer" } else { "--vocab-from" }
        ));
    }
    // Precedence: --chat-template > the checkpoint's entry > a template copied by --vocab-from.
    if let Some((template, from)) = chat_template_source(o, &npz)? {
        if o.chat_template.is_some() && npz.member(CHAT_TEMPLATE_ENTRY).is_some() {
            notes.push(format!(
                "note: the checkpoint's '{CHAT_TEMPLATE_ENTRY}' entry is ignored; the chat template comes from --chat-template"
            ));
        }
        if chat_template::set(&mut tok_md, template) {
            notes.push(format!(
                "note: the {} of --vocab-from is replaced by {from}",
                keys::TOKENIZER_CHAT_TEMPLATE
            ));
        }
    }
    let name = o.name.clone().unwrap_or_else(|| {
        o.input
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    });
    let types: Vec<GgmlType> = jobs.iter().map(|j| j.ty).collect();
    let mut md = model::model_metadata(arch, &name, &cfg, &hp, &types)?;
    md.extend(tok_md);
    let plans: Vec<TensorPlan> = jobs
        .iter()
        .map(|j| TensorPlan {
            name: j.source.name.clone(),
            ty: j.ty,
            ne: j.source.ne.clone(),
        })
        .collect();
    let total: u64 = plans
        .iter()
        .map(|p| p.ty.tensor_bytes(&p.ne).unwrap_or(0))
        .sum();

    let progress = Progress::new(plans.len(), total, o.quiet);
    for k in &cfg.ignored_keys {
        progress.log(&format!("note: config key '{k}' is not used"));
    }
    for n in &notes {
        progress.log(n);
    }
    let w = create_writer(&o.output, o.manifest.as_deref(), o.force, &md, &plans)?;
    let file_bytes = write_pipelined(w, &progress, |sink| {
        // the decoded entries the current tensor reads (two for a paired ffn_k2v)
        let mut cache: Vec<(String, ArrayBytes<'_>)> = Vec::new();
        for job in &jobs {
            progress.start_tensor(&job.source.name);
            let reads = |e: &str| job.source.parts.iter().any(|p| p.entry == e);
            // Release the entries this tensor does not read before decoding the ones it does.
            cache.retain(|(done, _)| {
                if !reads(done) {
                    npz.release(npz.member(done).expect("planned entries exist"));
                }
                reads(done)
            });
            for part in &job.source.parts {
                if !cache.iter().any(|(n, _)| *n == part.entry) {
                    let member = npz.member(&part.entry).expect("planned entries exist");
                    cache.push((part.entry.clone(), npz.data(member)?));
                }
            }
            let bytes_of =
                |e: &str| -> &[u8] { &cache.iter().find(|(n, _)| n == e).expect("just filled").1 };
            match job.source.join {
                Join::Rows => {
                    let mut first_row = 0;
                    for (part, &dtype) in job.source.parts.iter().zip(&job.dtypes) {
                        let rows = PartRows {
                            part,
                            dtype,
                            first_row,
                        };
                        write_part(sink, job, &rows, bytes_of(&part.entry))?;
                        first_row += part.view.rows();
                    }
                }
                Join::Columns => {
                    let parts: Vec<(PartRows<'_>, &[u8])> = job
                        .source
                        .parts
                        .iter()
                        .zip(&job.dtypes)
                        .map(|(part, &dtype)| {
                            let rows = PartRows {
                                part,
                                dtype,
                                first_row: 0,
                            };
                            (rows, bytes_of(&part.entry))
                        })
                        .collect();
                    write_side_by_side(sink, job, &parts)?;
                }
            }
        }
        Ok(())
    })?;
    progress.finish(&o.output, o.manifest.as_deref(), file_bytes);
    Ok(())
}

fn check_extra_entries(npz: &Npz, used: &BTreeSet<String>, arch: Arch) -> Result<()> {
    for m in npz.members() {
        let non_tensor = [CONFIG_ENTRY, TOKENIZER_ENTRY, CHAT_TEMPLATE_ENTRY];
        if !non_tensor.contains(&m.name.as_str()) && !used.contains(&m.name) {
            return Err(Error::entry(
                &m.name,
                format!("is not part of a {arch} checkpoint with this config (unexpected entry)"),
            ));
        }
    }
    Ok(())
}

/// One part of a tensor being written: its entry's rows, read as `dtype`, which are the
/// tensor's rows from `first_row` on.
struct PartRows<'a> {
    part: &'a SourcePart,
    dtype: SourceDtype,
    first_row: usize,
}

/// Reads rows `r0..r1` of one part of `job`'s tensor from `src`, the part's entry, into `out`,
/// refusing a non-finite value (named by the entry and the tensor row it would go to).
fn read_part_rows(
    job: &Job,
    rows: &PartRows<'_>,
    src: &[u8],
    (r0, r1): (usize, usize),
    out: &mut [f32],
) -> Result<()> {
    let PartRows {
        part,
        dtype,
        first_row,
    } = *rows;
    let cols = part.view.cols();
    part.view.read_rows(src, dtype, r0, r1, out);
    if let Some(i) = out.iter().position(|x| !x.is_finite()) {
        return Err(Error::entry(
            &part.entry,
            format!(
                "holds a non-finite value ({}) that would go to row {} of tensor '{}'",
                out[i],
                first_row + r0 + i / cols,
                job.source.name
            ),
        ));
    }
    Ok(())
}

/// Checks that `src`, a part's entry, holds every element the part's view reads.
fn check_extent(rows: &PartRows<'_>, src: &[u8]) -> Result<()> {
    let need = rows.part.view.source_extent() * rows.dtype.size();
    if src.len() < need {
        return Err(Error::entry(
            &rows.part.entry,
            format!("holds {} bytes, {need} are needed", src.len()),
        ));
    }
    Ok(())
}

/// Writes the rows of one part of `job`'s tensor from `src`, the part's entry.
fn write_part(sink: &ChunkSink<'_>, job: &Job, rows: &PartRows<'_>, src: &[u8]) -> Result<()> {
    check_extent(rows, src)?;
    let view = &rows.part.view;
    let (n_rows, cols) = (view.rows(), view.cols());
    let step = block_rows(cols);
    let mut buf = vec![0f32; step.min(n_rows) * cols];
    let mut r0 = 0;
    while r0 < n_rows {
        let r1 = (r0 + step).min(n_rows);
        let block = &mut buf[..(r1 - r0) * cols];
        read_part_rows(job, rows, src, (r0, r1), block)?;
        sink.send_rows(job.ty, block, cols)?;
        r0 = r1;
    }
    Ok(())
}

/// Writes `job`'s tensor whose row j is row j of every part side by side ([`Join::Columns`]),
/// each part read from its entry's bytes; the whole row is encoded as one, which for a type
/// that makes each part whole blocks (the type rule of `model::tensor_type_parts`) is each
/// part's own encoding, concatenated.
fn write_side_by_side(
    sink: &ChunkSink<'_>,
    job: &Job,
    parts: &[(PartRows<'_>, &[u8])],
) -> Result<()> {
    for (rows, src) in parts {
        check_extent(rows, src)?;
    }
    let widths: Vec<usize> = parts.iter().map(|(p, _)| p.part.view.cols()).collect();
    let cols: usize = widths.iter().sum();
    let n_rows = parts.first().map_or(0, |(p, _)| p.part.view.rows());
    let step = block_rows(cols);
    let mut buf = vec![0f32; step.min(n_rows) * cols];
    let mut part_bufs: Vec<Vec<f32>> = widths
        .iter()
        .map(|w| vec![0f32; step.min(n_rows) * w])
        .collect();
    let mut r0 = 0;
    while r0 < n_rows {
        let r1 = (r0 + step).min(n_rows);
        let n = r1 - r0;
        let mut offset = 0;
        for (((rows, src), pbuf), &w) in parts.iter().zip(&mut part_bufs).zip(&widths) {
            let pbuf = &mut pbuf[..n * w];
            read_part_rows(job, rows, src, (r0, r1), pbuf)?;
            for (row, prow) in buf[..n * cols]
                .chunks_exact_mut(cols)
                .zip(pbuf.chunks_exact(w))
            {
                row[offset..offset + w].copy_from_slice(prow);
            }
            offset += w;
        }
        sink.send_rows(job.ty, &buf[..n * cols], cols)?;
        r0 = r1;
    }
    Ok(())
}
