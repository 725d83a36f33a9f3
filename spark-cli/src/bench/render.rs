//! The `-o` formats, as llama-bench writes them: a markdown table, and records (llama-bench's
//! fields in its order, then Spark's `spark_mode`, `spark_ratio_vs_dense`,
//! `spark_ratio_vs_stock`) as CSV, a JSON array or JSON lines. Records go through serde.

use super::args::{Output, SparkMode, DEFAULT_BATCH};
use super::stats::Row;
use super::text::{file_name, params_text, size_text};
use crate::session::CacheType;
use serde::Serialize;
use serde_json::ser::Formatter;
use serde_json::Value;
use std::io;
use std::path::Path;

/// The output of `-o format` for `rows`.
pub fn render(format: Output, rows: &[Row]) -> String {
    match format {
        Output::Md => render_md(rows),
        Output::Csv => render_csv(rows),
        Output::Json => render_json(rows),
        Output::Jsonl => render_jsonl(rows),
    }
}

/// One row's record: llama-bench's fields that apply, in its order, then Spark's. The ratios
/// are left out where there is no row to compare with (null in CSV).
#[derive(Debug, Serialize)]
struct Record<'a> {
    build_commit: &'static str,
    backends: &'a str,
    model_filename: &'a str,
    model_type: &'a str,
    model_size: u64,
    model_n_params: u64,
    n_batch: u32,
    n_ubatch: u32,
    n_threads: i32,
    type_k: &'static str,
    type_v: &'static str,
    n_prompt: u32,
    n_gen: u32,
    n_depth: u32,
    test_time: &'a str,
    avg_ns: u64,
    stddev_ns: u64,
    avg_ts: f64,
    stddev_ts: f64,
    samples_ns: &'a [u64],
    samples_ts: Vec<f64>,
    spark_mode: SparkMode,
    #[serde(skip_serializing_if = "no_number")]
    spark_ratio_vs_dense: Option<f64>,
    #[serde(skip_serializing_if = "no_number")]
    spark_ratio_vs_stock: Option<f64>,
}

/// The CSV columns: [`Record`]'s fields in order (checked by a test).
const FIELDS: [&str; 24] = [
    "build_commit",
    "backends",
    "model_filename",
    "model_type",
    "model_size",
    "model_n_params",
    "n_batch",
    "n_ubatch",
    "n_threads",
    "type_k",
    "type_v",
    "n_prompt",
    "n_gen",
    "n_depth",
    "test_time",
    "avg_ns",
    "stddev_ns",
    "avg_ts",
    "stddev_ts",
    "samples_ns",
    "samples_ts",
    "spark_mode",
    "spark_ratio_vs_dense",
    "spark_ratio_vs_stock",
];

/// A ratio JSON has no number for (none, or not finite).
fn no_number(x: &Option<f64>) -> bool {
    !x.is_some_and(f64::is_finite)
}

impl Row {
    fn record(&self) -> Record<'_> {
        let (avg_ns, stddev_ns) = self.ns();
        let (avg_ts, stddev_ts) = self.ts();
        Record {
            build_commit: "unknown",
            backends: &self.backends,
            model_filename: &self.model_filename,
            model_type: &self.model_type,
            model_size: self.model_size,
            model_n_params: self.model_n_params,
            n_batch: self.n_batch,
            n_ubatch: self.test.n_ubatch,
            n_threads: self.n_threads,
            type_k: self.cache_type.name(),
            type_v: self.cache_type.name(),
            n_prompt: self.test.n_prompt,
            n_gen: self.test.n_gen,
            n_depth: self.test.n_depth,
            test_time: &self.test_time,
            avg_ns,
            stddev_ns,
            avg_ts,
            stddev_ts,
            samples_ns: &self.samples_ns,
            samples_ts: self.samples_ts(),
            spark_mode: self.mode,
            spark_ratio_vs_dense: self.ratio_vs_dense,
            spark_ratio_vs_stock: self.ratio_vs_stock,
        }
    }
}

/// serde_json's output in llama-bench's layouts: containers nested less than `pretty_levels`
/// deep get one entry per line, indented two spaces a level; deeper ones stay on one line,
/// objects as `{"k": v, "k": v}` and arrays as `[a,b]`.
struct BenchFormatter {
    pretty_levels: usize,
    /// Containers open.
    depth: usize,
    /// Whether the innermost open container has an entry yet (a pretty one then ends on a line
    /// of its own).
    has_value: bool,
}

impl BenchFormatter {
    fn new(pretty_levels: usize) -> Self {
        Self {
            pretty_levels,
            depth: 0,
            has_value: false,
        }
    }

    fn pretty(&self) -> bool {
        self.depth <= self.pretty_levels
    }

    fn open<W: ?Sized + io::Write>(&mut self, w: &mut W, bracket: &[u8]) -> io::Result<()> {
        self.depth += 1;
        self.has_value = false;
        w.write_all(bracket)
    }

    fn close<W: ?Sized + io::Write>(&mut self, w: &mut W, bracket: &[u8]) -> io::Result<()> {
        if self.pretty() && self.has_value {
            self.newline(w, self.depth - 1)?;
        }
        self.depth -= 1;
        // The container just closed is an entry of the one around it.
        self.has_value = true;
        w.write_all(bracket)
    }

    fn newline<W: ?Sized + io::Write>(&self, w: &mut W, level: usize) -> io::Result<()> {
        w.write_all(b"\n")?;
        w.write_all(&b"  ".repeat(level))
    }

    /// Before an entry: a new line in a pretty container, else `separator` after the first.
    fn entry<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
        separator: &[u8],
    ) -> io::Result<()> {
        self.has_value = true;
        if self.pretty() {
            if !first {
                w.write_all(b",")?;
            }
            self.newline(w, self.depth)
        } else if first {
            Ok(())
        } else {
            w.write_all(separator)
        }
    }
}

/// The [`Formatter`] methods of one kind of container: its brackets and the separator between
/// its entries on one line (arrays and objects differ in nothing else).
macro_rules! container {
    ($begin:ident, $end:ident, $entry:ident, $open:literal, $close:literal, $separator:literal) => {
        fn $begin<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
            self.open(w, $open)
        }

        fn $end<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
            self.close(w, $close)
        }

        fn $entry<W: ?Sized + io::Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
            self.entry(w, first, $separator)
        }
    };
}

impl Formatter for BenchFormatter {
    container!(begin_array, end_array, begin_array_value, b"[", b"]", b",");
    container!(
        begin_object,
        end_object,
        begin_object_key,
        b"{",
        b"}",
        b", "
    );

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(b": ")
    }
}

/// `value` as JSON in [`BenchFormatter`]'s layout with `pretty_levels`.
fn to_json<T: Serialize + ?Sized>(value: &T, pretty_levels: usize) -> String {
    let mut out = Vec::new();
    let mut ser =
        serde_json::Serializer::with_formatter(&mut out, BenchFormatter::new(pretty_levels));
    // Records are plain structs of strings, numbers and arrays: serialising them into memory
    // cannot fail, and serde_json writes valid UTF-8.
    value
        .serialize(&mut ser)
        .expect("a record serialises to JSON");
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

/// One array, one object per record (fields one per line).
fn render_json(rows: &[Row]) -> String {
    let records: Vec<Record<'_>> = rows.iter().map(Row::record).collect();
    to_json(&records, 2) + "\n"
}

/// One object per line.
fn render_jsonl(rows: &[Row]) -> String {
    rows.iter()
        .map(|r| to_json(&r.record(), 0) + "\n")
        .collect()
}

/// llama-bench's CSV: a header line, then every value in double quotes (quotes doubled); arrays
/// joined with ';', null empty.
fn render_csv(rows: &[Row]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let mut out = FIELDS.join(",") + "\n";
    for r in rows {
        let record = serde_json::to_value(r.record()).expect("a record serialises to JSON");
        let cells: Vec<String> = FIELDS
            .iter()
            .map(|k| csv_quote(&record.get(k).map_or(String::new(), csv_text)))
            .collect();
        out.push_str(&cells.join(","));
        out.push('\n');
    }
    out
}

fn csv_text(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Array(items) => items.iter().map(csv_text).collect::<Vec<_>>().join(";"),
        other => other.to_string(),
    }
}

fn csv_quote(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// A markdown column: header, llama-bench's width (negative = left-aligned), a row's value.
type Column = (&'static str, i32, fn(&Row) -> String);

fn column(name: &'static str, width: i32, value: fn(&Row) -> String) -> Column {
    (name, width, value)
}

/// llama-bench's markdown table (model, size, params, backend, threads, n_batch when not 2048,
/// n_ubatch, type_k/type_v when not f16, test, t/s) with Spark's mode column before the test and
/// the sparse/dense ratio after t/s, then the ratio to the stock model when there is one.
fn render_md(rows: &[Row]) -> String {
    let mut columns: Vec<Column> = vec![
        column("model", -30, |r| r.model_type.clone()),
        column("size", 10, |r| size_text(r.model_size)),
        column("params", 10, |r| params_text(r.model_n_params)),
        column("backend", -10, |r| r.backends.clone()),
        column("threads", 7, |r| r.n_threads.to_string()),
    ];
    if rows.iter().any(|r| r.n_batch != DEFAULT_BATCH) {
        columns.push(column("n_batch", 7, |r| r.n_batch.to_string()));
    }
    columns.push(column("n_ubatch", 8, |r| r.test.n_ubatch.to_string()));
    if rows.iter().any(|r| r.cache_type != CacheType::F16) {
        columns.push(column("type_k", 6, |r| r.cache_type.name().to_string()));
        columns.push(column("type_v", 6, |r| r.cache_type.name().to_string()));
    }
    columns.push(column("mode", -6, |r| r.mode.name().to_string()));
    columns.push(column("test", 15, |r| r.test.name()));
    columns.push(column("t/s", 20, |r| {
        let (m, s) = r.ts();
        format!("{m:.2} ± {s:.2}")
    }));
    columns.push(column("sparse / dense", 14, |r| {
        r.ratio_vs_dense
            .map_or(String::new(), |x| format!("{x:.2}x"))
    }));
    if rows.iter().any(|r| r.ratio_vs_stock.is_some()) {
        columns.push(column("vs stock", 8, |r| {
            r.ratio_vs_stock
                .map_or(String::new(), |x| format!("{x:.2}x"))
        }));
    }
    // Two models of the same type: tell them apart by file name.
    let ambiguous = |r: &Row| {
        rows.iter()
            .any(|o| o.model_type == r.model_type && o.model_filename != r.model_filename)
    };
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            columns
                .iter()
                .enumerate()
                .map(|(c, (_, _, value))| {
                    let v = value(r);
                    if c == 0 && ambiguous(r) {
                        format!("{v} ({})", file_name(Path::new(&r.model_filename)))
                    } else {
                        v
                    }
                })
                .collect()
        })
        .collect();
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(c, (name, w, _))| {
            cells
                .iter()
                .map(|row| row[c].chars().count())
                .chain([name.len(), w.unsigned_abs() as usize])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |values: Vec<String>| {
        let mut s = String::from("|");
        for ((v, width), (_, w, _)) in values.iter().zip(&widths).zip(&columns) {
            let pad = " ".repeat(width - v.chars().count());
            if *w < 0 {
                s.push_str(&format!(" {v}{pad} |"));
            } else {
                s.push_str(&format!(" {pad}{v} |"));
            }
        }
        s + "\n"
    };
    let mut out = line(columns.iter().map(|(n, _, _)| n.to_string()).collect());
    out += &line(
        columns
            .iter()
            .zip(&widths)
            .map(|((_, w, _), width)| {
                let dashes = "-".repeat(width - 1);
                if *w < 0 {
                    format!("{dashes}-")
                } else {
                    format!("{dashes}:")
                }
            })
            .collect(),
    );
    for row in cells {
        out += &line(row);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::stats::set_ratios;
    use super::super::stats::tests::fixed_rows;
    use super::*;
    use serde_json::json;

    /// The golden sets: [`fixed_rows`]; the same with a stock row of the sparse rows' test
    /// (ratios to stock), a second Spark model of the same type (file names in the model column),
    /// several samples, `-b 256` and an f32 cache; no rows at all.
    fn golden_sets() -> Vec<(&'static str, Vec<Row>)> {
        let mut variant = fixed_rows();
        variant[2].test = variant[0].test;
        variant[2].samples_ns = vec![64_000_000_000, 63_000_000_001, 65_500_000_123];
        let mut other = variant[0].clone();
        other.model_filename = "other/\u{df} model,1.gguf".into();
        other.samples_ns = vec![3_333_333_333, 7, 1_000_000_000_000];
        variant.push(other);
        for r in &mut variant {
            r.n_batch = 256;
            r.cache_type = CacheType::F32;
        }
        set_ratios(&mut variant);
        vec![
            ("fixed", fixed_rows()),
            ("variant", variant),
            ("empty", Vec::new()),
        ]
    }

    /// Every renderer's exact bytes on fixed samples (spark-cli/testdata/bench/SET.FORMAT,
    /// written by the renderers before the bench module was split by job).
    #[test]
    fn renderers_match_golden_outputs() {
        for (set, rows) in golden_sets() {
            for (format, ext) in [
                (Output::Md, "md"),
                (Output::Csv, "csv"),
                (Output::Json, "json"),
                (Output::Jsonl, "jsonl"),
            ] {
                let path = format!("{}/testdata/bench/{set}.{ext}", env!("CARGO_MANIFEST_DIR"));
                let want = std::fs::read_to_string(&path).expect("golden file");
                assert_eq!(render(format, &rows), want, "{path}");
            }
        }
    }

    #[test]
    fn csv_columns_are_the_record_fields_in_order() {
        let mut rows = fixed_rows();
        rows[0].ratio_vs_stock = Some(2.0);
        let record = serde_json::to_value(rows[0].record()).unwrap();
        let mut keys: Vec<&str> = record
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .collect();
        let mut fields = FIELDS.to_vec();
        keys.sort_unstable();
        fields.sort_unstable();
        assert_eq!(keys, fields);
        let text = to_json(&rows[0].record(), 0);
        let pos: Vec<usize> = FIELDS
            .iter()
            .map(|k| text.find(&format!("\"{k}\": ")).unwrap())
            .collect();
        assert!(pos.windows(2).all(|w| w[0] < w[1]), "{text}");
        // a ratio that is not a number is left out, as a missing one is
        rows[0].ratio_vs_dense = Some(f64::INFINITY);
        assert!(!to_json(&rows[0].record(), 0).contains("spark_ratio_vs_dense"));
    }

    #[test]
    fn json_has_llama_bench_fields() {
        let rows = fixed_rows();
        let v: Value = serde_json::from_str(&render(Output::Json, &rows)).unwrap();
        let a = v.as_array().unwrap();
        assert_eq!(a.len(), 3);
        let s = &a[0];
        assert_eq!(s["build_commit"], "unknown");
        assert_eq!(s["model_filename"], "models/a \"b\".gguf");
        assert_eq!(s["model_type"], "spark-gemma2 2B F16");
        assert_eq!(s["model_size"], 5u64 << 30);
        assert_eq!(s["model_n_params"], 2_600_000_000u64);
        assert_eq!(s["backends"], "Spark");
        assert_eq!(s["n_batch"], 2048);
        assert_eq!(s["n_ubatch"], 512);
        assert_eq!(s["n_threads"], 2);
        assert_eq!(s["type_k"], "f16");
        assert_eq!(s["type_v"], "f16");
        assert_eq!(s["n_prompt"], 0);
        assert_eq!(s["n_gen"], 128);
        assert_eq!(s["n_depth"], 4096);
        assert_eq!(s["test_time"], "2025-04-24T11:57:09Z");
        assert_eq!(s["avg_ns"], 1_500_000_000u64);
        assert_eq!(s["stddev_ns"], 707_106_781u64);
        assert_eq!(s["avg_ts"], 96.0);
        assert!((s["stddev_ts"].as_f64().unwrap() - 45.254_833_995).abs() < 1e-6);
        assert_eq!(s["samples_ns"], json!([1_000_000_000u64, 2_000_000_000u64]));
        assert_eq!(s["samples_ts"], json!([128.0, 64.0]));
        assert_eq!(s["spark_mode"], "sparse");
        assert_eq!(s["spark_ratio_vs_dense"], 3.0);
        assert_eq!(a[1]["spark_mode"], "dense");
        assert!(a[1].get("spark_ratio_vs_dense").is_none());
        assert_eq!(a[2]["spark_mode"], "stock");
        assert_eq!(a[2]["avg_ts"], 1024.0);
        // fields keep llama-bench's order
        let text = render(Output::Json, &rows);
        let pos = |k: &str| text.find(&format!("\"{k}\"")).unwrap();
        assert!(pos("build_commit") < pos("model_filename") && pos("n_depth") < pos("avg_ns"));
    }

    #[test]
    fn jsonl_is_one_object_per_line() {
        let rows = fixed_rows();
        let text = render(Output::Jsonl, &rows);
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0]["spark_ratio_vs_dense"], 3.0);
        assert_eq!(lines[2]["n_prompt"], 512);
        assert_eq!(render(Output::Json, &[]), "[]\n");
        assert_eq!(render(Output::Jsonl, &[]), "");
    }

    #[test]
    fn csv_has_a_header_and_quoted_records() {
        let text = render(Output::Csv, &fixed_rows());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4);
        let header: Vec<&str> = lines[0].split(',').collect();
        assert_eq!(header[0], "build_commit");
        for k in [
            "model_filename",
            "n_ubatch",
            "n_depth",
            "avg_ts",
            "samples_ns",
            "spark_mode",
            "spark_ratio_vs_dense",
        ] {
            assert!(header.contains(&k), "{k}");
        }
        let col = |k: &str| header.iter().position(|h| *h == k).unwrap();
        // the quote in the file name is doubled, so the naive split still lines up here only
        // because the name has no comma
        let cells: Vec<&str> = lines[1].split(',').collect();
        assert_eq!(cells.len(), header.len());
        assert_eq!(cells[col("model_filename")], "\"models/a \"\"b\"\".gguf\"");
        assert_eq!(cells[col("n_depth")], "\"4096\"");
        assert_eq!(cells[col("samples_ns")], "\"1000000000;2000000000\"");
        assert_eq!(cells[col("spark_mode")], "\"sparse\"");
        assert_eq!(cells[col("spark_ratio_vs_dense")], "\"3.0\"");
        let dense: Vec<&str> = lines[2].split(',').collect();
        assert_eq!(dense[col("spark_ratio_vs_dense")], "\"\"");
    }

    #[test]
    fn md_table_has_llama_bench_columns() {
        let text = render(Output::Md, &fixed_rows());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5);
        let cells = |l: &str| -> Vec<String> {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect()
        };
        assert_eq!(
            cells(lines[0]),
            [
                "model",
                "size",
                "params",
                "backend",
                "threads",
                "n_ubatch",
                "mode",
                "test",
                "t/s",
                "sparse / dense"
            ]
        );
        assert!(lines[1].starts_with("| ---") && lines[1].contains("-: |"));
        assert_eq!(
            cells(lines[2]),
            [
                "spark-gemma2 2B F16",
                "5.00 GiB",
                "2.60 B",
                "Spark",
                "2",
                "512",
                "sparse",
                "tg128 @ d4096",
                "96.00 ± 45.25",
                "3.00x"
            ]
        );
        assert_eq!(cells(lines[3])[9], "");
        assert_eq!(cells(lines[4])[1..3], ["3.00 MiB", "5.40 M"]);
        assert_eq!(cells(lines[4])[7], "pp512");
        // all lines equally wide (aligned columns)
        let w = lines[0].chars().count();
        assert!(lines.iter().all(|l| l.chars().count() == w), "{text}");
    }

    #[test]
    fn md_table_shows_non_default_batch_and_cache_type() {
        let rows: Vec<Row> = fixed_rows()
            .into_iter()
            .map(|r| Row {
                n_batch: 256,
                cache_type: CacheType::F32,
                ..r
            })
            .collect();
        let text = render(Output::Md, &rows);
        let header = text.lines().next().unwrap();
        assert!(header.contains("| n_batch |") && header.contains("| type_k | type_v |"));
    }

    #[test]
    fn ratios_compare_spark_rows_with_the_one_stock_model_of_the_same_test() {
        let mut rows = fixed_rows();
        // the stock row measured the sparse rows' test: 2 t/s (128 tokens in 64 s)
        rows[2].test = rows[0].test;
        rows[2].samples_ns = vec![64_000_000_000];
        set_ratios(&mut rows);
        assert!((rows[0].ratio_vs_stock.unwrap() - 48.0).abs() < 1e-9);
        assert!((rows[1].ratio_vs_stock.unwrap() - 16.0).abs() < 1e-9);
        assert_eq!(rows[2].ratio_vs_stock, None);
        assert!((rows[0].ratio_vs_dense.unwrap() - 3.0).abs() < 1e-9);
        let v: Value = serde_json::from_str(&render(Output::Json, &rows)).unwrap();
        assert_eq!(v[0]["spark_ratio_vs_stock"], 48.0);
        assert!(v[2].get("spark_ratio_vs_stock").is_none());
        let md = render(Output::Md, &rows);
        let header = md.lines().next().unwrap();
        assert!(header.trim_end().ends_with("| vs stock |"), "{md}");
        let last_cell = |l: &str| {
            l.trim_matches('|')
                .rsplit('|')
                .next()
                .unwrap()
                .trim()
                .to_string()
        };
        assert_eq!(last_cell(md.lines().nth(2).unwrap()), "48.00x", "{md}");
        assert_eq!(last_cell(md.lines().nth(4).unwrap()), "", "{md}");

        // a second stock model: which one a ratio would refer to is ambiguous, so none is given
        let mut other = rows[2].clone();
        other.model_filename = "h.gguf".into();
        rows.push(other);
        set_ratios(&mut rows);
        assert!(rows.iter().all(|r| r.ratio_vs_stock.is_none()));
        assert!(!render(Output::Md, &rows).contains("vs stock"));
        // the same stock model's rows of other tests do not count as a second model
        let mut rows = fixed_rows();
        let mut again = rows[2].clone();
        again.test = rows[0].test;
        again.samples_ns = vec![64_000_000_000];
        rows.insert(3, again);
        set_ratios(&mut rows);
        assert!((rows[0].ratio_vs_stock.unwrap() - 48.0).abs() < 1e-9);
    }
}
