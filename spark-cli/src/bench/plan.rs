//! What a `spark bench` run measures: the tests (llama-bench's order and names) and the
//! (model, mode) entries, each measured once per repetition.

use super::args::{ubatch_sizes, BenchArgs, SparkMode};
use crate::error::{CliError, Result};
use crate::gguf_info;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// One llama-bench test: `n_prompt` tokens processed (pp) or `n_gen` generated (tg) on top of a
/// context already holding `n_depth` tokens, with physical batch `n_ubatch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TestSpec {
    /// Prompt tokens processed.
    pub n_prompt: u32,
    /// Tokens generated.
    pub n_gen: u32,
    /// Tokens already in the context.
    pub n_depth: u32,
    /// llama.cpp's n_ubatch.
    pub n_ubatch: u32,
}

impl TestSpec {
    /// llama-bench's name: `pp512`, `tg128`, `pp512+tg128`, with ` @ d4096` at a depth.
    pub fn name(&self) -> String {
        let mut s = match (self.n_prompt, self.n_gen) {
            (p, 0) => format!("pp{p}"),
            (0, n) => format!("tg{n}"),
            (p, n) => format!("pp{p}+tg{n}"),
        };
        if self.n_depth > 0 {
            s.push_str(&format!(" @ d{}", self.n_depth));
        }
        s
    }

    /// Tokens timed.
    pub fn n_tokens(&self) -> u64 {
        u64::from(self.n_prompt) + u64::from(self.n_gen)
    }

    /// llama-bench's context size: n_prompt + n_gen + n_depth (checked by [`test_plan`]).
    pub fn n_ctx(&self) -> u32 {
        self.n_prompt + self.n_gen + self.n_depth
    }
}

/// The tests, in llama-bench's order (ubatch, then depth, then the pp tests, then the tg tests),
/// after checking the options.
pub fn test_plan(args: &BenchArgs) -> Result<Vec<TestSpec>> {
    if args.n_prompt.iter().all(|&p| p == 0) && args.n_gen.iter().all(|&n| n == 0) {
        return Err(CliError::new("-p 0 and -n 0: nothing to measure"));
    }
    let ubatches = ubatch_sizes(args)?;
    if let Some(&ub) = ubatches.iter().find(|&&ub| ub > args.batch) {
        return Err(CliError::new(format!(
            "-ub {ub} is larger than -b {}: n_ubatch cannot exceed n_batch",
            args.batch
        )));
    }
    let mut tests = Vec::new();
    for &n_ubatch in &ubatches {
        for &n_depth in &args.n_depth {
            let pp = args.n_prompt.iter().filter(|&&p| p > 0).map(|&p| (p, 0));
            let tg = args.n_gen.iter().filter(|&&n| n > 0).map(|&n| (0, n));
            for (n_prompt, n_gen) in pp.chain(tg) {
                let total = u64::from(n_prompt) + u64::from(n_gen) + u64::from(n_depth);
                if total > i32::MAX as u64 {
                    return Err(CliError::new(format!(
                        "-p {n_prompt} -n {n_gen} -d {n_depth}: the context ({total} tokens) is too large"
                    )));
                }
                tests.push(TestSpec {
                    n_prompt,
                    n_gen,
                    n_depth,
                    n_ubatch,
                });
            }
        }
    }
    Ok(tests)
}

/// One (model, mode) entry of a run: one measuring process per repetition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The model file as given.
    pub model: PathBuf,
    /// What its rows are.
    pub mode: SparkMode,
}

/// The entries of a run, in order: every `--modes` mode of each Spark model, the stock graph of
/// each other model. Reads each model's metadata, so a missing or unreadable file fails here,
/// before anything is measured.
pub fn entries(args: &BenchArgs) -> Result<Vec<Entry>> {
    let mut plan = Vec::new();
    for model in &args.models {
        let info = gguf_info::read(model)?;
        if info.is_spark() {
            for &mode in &args.modes {
                plan.push(Entry {
                    model: model.clone(),
                    mode: mode.into(),
                });
            }
        } else {
            plan.push(Entry {
                model: model.clone(),
                mode: SparkMode::Stock,
            });
        }
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::super::args::tests::parse;
    use super::super::args::Output;
    use super::*;

    fn plan_of(argv: &[&str]) -> Result<Vec<TestSpec>> {
        test_plan(&parse(argv).expect("parses"))
    }

    fn names(tests: &[TestSpec]) -> Vec<String> {
        tests
            .iter()
            .map(|t| format!("{} ub{}", t.name(), t.n_ubatch))
            .collect()
    }

    #[test]
    fn test_names_follow_llama_bench() {
        let t = |n_prompt, n_gen, n_depth| TestSpec {
            n_prompt,
            n_gen,
            n_depth,
            n_ubatch: 512,
        };
        assert_eq!(t(512, 0, 0).name(), "pp512");
        assert_eq!(t(0, 128, 0).name(), "tg128");
        assert_eq!(t(512, 0, 4096).name(), "pp512 @ d4096");
        assert_eq!(t(0, 128, 4096).name(), "tg128 @ d4096");
        assert_eq!(t(16, 4, 0).name(), "pp16+tg4");
        assert_eq!(t(0, 128, 4096).n_ctx(), 4224);
    }

    #[test]
    fn defaults_are_llama_bench_defaults() {
        let a = parse(&["-m", "x.gguf"]).unwrap();
        assert_eq!((a.batch, a.reps, a.output), (2048, 3, Output::Md));
        assert_eq!(
            names(&test_plan(&a).unwrap()),
            ["pp512 ub512", "tg128 ub512"]
        );
    }

    #[test]
    fn comma_lists_expand_in_llama_bench_order() {
        let tests = plan_of(&[
            "-m", "x.gguf", "-p", "8,16", "-n", "4", "-d", "0,32", "-ub", "4,8",
        ])
        .unwrap();
        assert_eq!(
            names(&tests),
            [
                "pp8 ub4",
                "pp16 ub4",
                "tg4 ub4",
                "pp8 @ d32 ub4",
                "pp16 @ d32 ub4",
                "tg4 @ d32 ub4",
                "pp8 ub8",
                "pp16 ub8",
                "tg4 ub8",
                "pp8 @ d32 ub8",
                "pp16 @ d32 ub8",
                "tg4 @ d32 ub8",
            ]
        );
        // n_ctx = n_prompt + n_gen + n_depth
        assert_eq!(tests[4].n_ctx(), 48);
        // repeated flags append, as in llama-bench; -p 0 skips pp tests
        let tests = plan_of(&["-m", "x", "-p", "0", "-n", "4", "-d", "1", "-d", "2"]).unwrap();
        assert_eq!(names(&tests), ["tg4 @ d1 ub512", "tg4 @ d2 ub512"]);
    }

    #[test]
    fn bad_values_name_the_flag() {
        let clap_err = |argv: &[&str]| parse(argv).unwrap_err().to_string();
        let e = clap_err(&["-m", "x", "-d", "-5"]);
        assert!(e.contains("'-5'") && e.contains("--n-depth"), "{e}");
        let e = clap_err(&["-m", "x", "-d", "0,abc"]);
        assert!(e.contains("'abc'") && e.contains("--n-depth"), "{e}");
        let e = clap_err(&["-m", "x", "-p", "-1"]);
        assert!(e.contains("'-1'") && e.contains("--n-prompt"), "{e}");
        let e = clap_err(&["-m", "x", "--ubatch-size", "0"]);
        assert!(e.contains("'0'") && e.contains("--ubatch-size"), "{e}");
        let e = clap_err(&["-m", "x", "-b", "0"]);
        assert!(e.contains("'0'") && e.contains("--batch-size"), "{e}");
        let e = clap_err(&["-m", "x", "-o", "xml"]);
        assert!(e.contains("'xml'") && e.contains("--output"), "{e}");
        let e = clap_err(&["-m", "x", "-r", "0"]);
        assert!(e.contains("'0'") && e.contains("--repetitions"), "{e}");

        let plan_err = |argv: &[&str]| plan_of(argv).unwrap_err().to_string();
        assert_eq!(
            plan_err(&["-m", "x", "-ub", "0"]),
            "invalid value '0' for '-ub': expected a whole number >= 1"
        );
        assert_eq!(
            plan_err(&["-m", "x", "-ub", "-5"]),
            "invalid value '-5' for '-ub': expected a whole number >= 1"
        );
        assert_eq!(
            plan_err(&["-m", "x", "-ub", "8,x"]),
            "invalid value 'x' for '-ub': expected a whole number >= 1"
        );
        assert!(plan_err(&["-m", "x", "-ub", "4096"]).contains("-ub 4096 is larger than -b 2048"));
        assert!(plan_err(&["-m", "x", "-u", "8"]).contains("unknown option '-u8'"));
        assert!(plan_err(&["-m", "x", "stray"]).contains("unexpected argument 'stray'"));
        assert!(plan_err(&["-m", "x", "-p", "0", "-n", "0"]).contains("nothing to measure"));
        assert!(
            plan_err(&["-m", "x", "-p", "4294967295", "-d", "4294967295"]).contains("too large")
        );
    }
}
