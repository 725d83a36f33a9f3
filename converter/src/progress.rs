//! Progress reporting: a tensors-and-bytes bar on a terminal (hidden when stderr is not a TTY or
//! with `--quiet`), log lines, and the closing summary.

use std::io::IsTerminal;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Progress and log output of one conversion.
pub struct Progress {
    bar: ProgressBar,
    quiet: bool,
    start: Instant,
    tensors: usize,
    done: AtomicUsize,
}

impl Progress {
    /// A reporter for `tensors` tensors totalling `bytes` bytes of data.
    pub fn new(tensors: usize, bytes: u64, quiet: bool) -> Progress {
        let visible = !quiet && std::io::stderr().is_terminal();
        let bar = if visible {
            ProgressBar::with_draw_target(Some(bytes), ProgressDrawTarget::stderr())
        } else {
            ProgressBar::hidden()
        };
        if let Ok(style) = ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {bytes}/{total_bytes} ({bytes_per_sec}) {msg}",
        ) {
            bar.set_style(style);
        }
        Progress {
            bar,
            quiet,
            start: Instant::now(),
            tensors,
            done: AtomicUsize::new(0),
        }
    }

    /// Notes that tensor `name` starts (and so that the previous one is done).
    pub fn start_tensor(&self, name: &str) {
        let done = self.done.fetch_add(1, Ordering::Relaxed);
        self.bar
            .set_message(format!("[{}/{}] {name}", done + 1, self.tensors));
    }

    /// Notes `n` more bytes written.
    pub fn add_bytes(&self, n: u64) {
        self.bar.inc(n);
    }

    /// Prints a log line to stderr (unless quiet), above the bar.
    pub fn log(&self, line: &str) {
        if !self.quiet {
            self.bar.suspend(|| eprintln!("{line}"));
        }
    }

    /// Clears the bar and prints "wrote OUT: N tensors, X MiB in S s", and "wrote MANIFEST"
    /// when there is one (unless quiet).
    pub fn finish(self, out: &Path, manifest: Option<&Path>, file_bytes: u64) {
        self.bar.finish_and_clear();
        if !self.quiet {
            println!(
                "{}",
                summary(
                    out,
                    self.tensors,
                    file_bytes,
                    self.start.elapsed().as_secs_f64()
                )
            );
            if let Some(m) = manifest {
                println!("wrote {} (llama-gguf-hash --check)", m.display());
            }
        }
    }
}

/// The closing summary line.
pub fn summary(out: &Path, tensors: usize, bytes: u64, secs: f64) -> String {
    format!(
        "wrote {}: {tensors} tensors, {:.1} MiB in {secs:.1} s",
        out.display(),
        bytes as f64 / (1024.0 * 1024.0)
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn summary_line_format() {
        let s = super::summary(
            std::path::Path::new("m.gguf"),
            26,
            3 * 1024 * 1024 + 512 * 1024,
            2.04,
        );
        assert_eq!(s, "wrote m.gguf: 26 tensors, 3.5 MiB in 2.0 s");
    }
}
