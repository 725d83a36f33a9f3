//! Writing tensor rows: encode blocks of f32 rows in parallel and stream them to the writer.

use rayon::prelude::*;
use spark_gguf::{quant, GgmlType, GgufError, GgufWriter};

use crate::error::{Error, Result};
use crate::progress::Progress;

/// Elements per block of rows handled at once (bounds the converter's working memory).
pub const BLOCK_ELEMS: usize = 1 << 22;

impl From<GgufError> for Error {
    fn from(e: GgufError) -> Error {
        Error::Gguf(e.to_string())
    }
}

/// Rows per block for rows of `cols` elements.
pub fn block_rows(cols: usize) -> usize {
    (BLOCK_ELEMS / cols.max(1)).max(1)
}

/// Encodes whole rows (`data.len()` a multiple of `cols`) as `ty`, in parallel over groups of
/// rows, and streams the bytes to `w` in order.
pub fn write_rows(
    w: &mut GgufWriter,
    ty: GgmlType,
    data: &[f32],
    cols: usize,
    progress: &Progress,
) -> Result<()> {
    let rows = data.len() / cols.max(1);
    let parts = (rayon::current_num_threads() * 2).max(1);
    let rows_per_part = rows.div_ceil(parts).max(1);
    let encoded: Vec<std::result::Result<Vec<u8>, GgufError>> = data
        .par_chunks(rows_per_part * cols.max(1))
        .map(|chunk| {
            let mut v = Vec::new();
            quant::encode_f32(ty, chunk, &mut v).map(|()| v)
        })
        .collect();
    for e in encoded {
        let bytes = e?;
        w.write_tensor_chunk(&bytes)?;
        progress.add_bytes(bytes.len() as u64);
    }
    Ok(())
}
