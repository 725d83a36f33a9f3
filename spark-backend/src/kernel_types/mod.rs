//! The types every CPU kernel takes: the bottom layer of the crate's kernels, below the tables of
//! [`crate::arch`] (one per instruction set) and the features that call them ([`crate::rows`],
//! [`crate::topk`], [`crate::attention`], [`crate::ffn`]). Imports go one way:
//!
//! ```text
//! kernel_types  <-  arch (table, generic / x86 / arm)  <-  rows, topk, attention, ffn
//! ```
//!
//! so a kernel is written against these types alone, and a feature reaches a kernel only
//! through its table (as tract-linalg's `frame` holds the kernel interfaces its generic and
//! per-ISA modules implement).
//!
//! - [`row_type`]: the storage types of weight rows ([`RowType`]) and where a folded axpy starts
//!   ([`Start`]).
//! - [`cache_rows`]: attention's cache rows ([`Rows`], [`ElemType`], [`CacheType`], [`BlockRows`]), queries ([`Queries`]),
//!   scores ([`Scores`]) and the shared reduction tree ([`reduce8`], [`load1`]).

pub(crate) mod cache_rows;
pub mod row_type;

pub(crate) use cache_rows::{
    load1, reduce8, BlockRows, CacheType, ElemType, Queries, Rows, Scores,
};
pub use row_type::{RowType, Start};
