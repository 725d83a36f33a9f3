//! Writing `spark eval --logits-out` arrays: a float32 2-D `.npy` file (format version 1.0).
//!
//! The writer is the converter's (`spark_convert::npy`, next to its reader and tested against
//! it), so the workspace has a single NPY header writer.

pub use spark_convert::npy::write_f32_2d;
