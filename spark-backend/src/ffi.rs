//! Helpers for the C entry points: nothing may unwind across an `extern "C"` boundary.
//!
//! Every function that ggml or llama.cpp calls runs its body through [`guard`], which catches a
//! panic, reports it on one stderr line naming the entry point, and returns a fallback value the
//! caller can recognise (a null pointer, an error code, a NaN-filled output).

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `body`; if it panics, prints `spark-backend: <entry>: internal error: <message>` to
/// stderr and returns `fallback` instead of unwinding.
///
/// `AssertUnwindSafe` is sound here: after a panic the only state the caller observes is the
/// fallback value (plus whatever the entry point documents, e.g. a NaN-filled output).
pub(crate) fn guard<R>(entry: &str, fallback: R, body: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(payload) => {
            report(entry, &panic_message(payload.as_ref()));
            fallback
        }
    }
}

/// Prints `spark-backend: <entry>: internal error: <message>` on one stderr line. Printing
/// cannot panic the caller: a failed write to stderr is ignored.
pub(crate) fn report(entry: &str, message: &str) {
    crate::log::say!("spark-backend: {entry}: internal error: {message}");
}

/// The text of a panic payload (`&str` or `String`); other payload types get a fixed message.
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-text payload".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_returns_the_value_when_nothing_panics() {
        assert_eq!(guard("test", 0, || 7), 7);
    }

    #[test]
    fn guard_returns_the_fallback_on_panic() {
        let got = guard("test", -1, || -> i32 { panic!("boom") });
        assert_eq!(got, -1);
    }

    #[test]
    fn panic_message_reads_str_and_string_payloads() {
        let p = catch_unwind(|| panic!("static text")).unwrap_err();
        assert_eq!(panic_message(p.as_ref()), "static text");
        let n = 3;
        let p = catch_unwind(move || panic!("formatted {n}")).unwrap_err();
        assert_eq!(panic_message(p.as_ref()), "formatted 3");
        let p = catch_unwind(|| std::panic::panic_any(5u8)).unwrap_err();
        assert_eq!(panic_message(p.as_ref()), "panic with a non-text payload");
    }
}
