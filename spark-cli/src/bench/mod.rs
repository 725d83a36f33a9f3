//! `spark bench`: prompt-processing and generation speed with llama-bench's tests, flags and
//! output formats (`pp512`, `tg128`, `pp512 @ d4096`; `-p -n -d -b -ub -r -t -o`), with the Spark
//! kernels and with the dense stock-op graph **side by side in one run**.
//!
//! The kernels are registered per process (a registered "Spark" entry cannot be removed), so each
//! measurement runs in a child process (`spark bench --child MODE ...`, [`child`]) that loads the
//! model and runs every test once, as llama-bench runs one repetition ([`measure`]). The parent
//! alternates the modes and models over the repetitions, so slow phases of a shared machine hit
//! all of them alike, and prints mean +- standard deviation (of the per-repetition tokens per
//! second, llama-bench's `avg_ts`/`stddev_ts`), the sparse/dense ratio and, when the run has one
//! stock (non-Spark) model such as Gemma-2, each Spark row's ratio to it (ratios of the means;
//! [`stats`]).
//!
//! Progress goes to stderr; stdout carries only the table (`-o md`) or the records
//! (`-o csv|json|jsonl`, llama-bench's field names plus `spark_mode`, `spark_ratio_vs_dense` and
//! `spark_ratio_vs_stock`; [`render`]).
//!
//! The modules, by job: [`args`] (the command line), [`plan`] (tests and entries), [`child`]
//! (the measuring process and its protocol), [`measure`] (one test as llama-bench runs it),
//! [`stats`] (rows and ratios), [`render`] (the output formats), [`text`] (the size and params
//! columns, file names) and [`time`] (test_time). They import in layers, each only from those
//! before it: `text`, `time`, `args` -> `plan` -> `measure` -> `child` -> `stats` -> `render`.

mod args;
mod child;
mod measure;
mod plan;
mod render;
mod stats;
mod text;
mod time;

pub use args::BenchArgs;

use crate::error::{CliError, Result};
use child::ChildReport;

/// Runs `spark bench`: the parent (measures every entry in alternation and prints the output),
/// or with `--child`, one measuring process.
pub fn run(args: &BenchArgs) -> Result<()> {
    let tests = plan::test_plan(args)?;
    if let Some(mode) = args.child {
        let model = args
            .models
            .first()
            .ok_or_else(|| CliError::new("--child needs a model (-m)"))?;
        return child::child(args, model, mode, &tests);
    }
    // Each entry is measured `reps` times, in alternation.
    let entries = plan::entries(args)?;
    let total = entries.len() * args.reps as usize;
    let mut reports: Vec<Vec<ChildReport>> = vec![Vec::new(); entries.len()];
    let exe = std::env::current_exe()
        .map_err(|e| CliError::new(format!("cannot find the spark executable: {e}")))?;
    for rep in 0..args.reps as usize {
        for (i, entry) in entries.iter().enumerate() {
            if !args.quiet {
                eprintln!(
                    "spark bench: [{}/{total}] {} {} (repetition {})",
                    rep * entries.len() + i + 1,
                    text::file_name(&entry.model),
                    entry.mode.name(),
                    rep + 1
                );
            }
            let report = child::run_child(&exe, args, &entry.model, entry.mode.graph(), &tests)?;
            reports[i].push(report);
        }
    }
    let rows = stats::build_rows(args, &entries, &tests, &reports)?;
    print!("{}", render::render(args.output, &rows));
    Ok(())
}
