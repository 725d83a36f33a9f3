//! Writing tensor data: blocks of f32 rows are encoded in parallel, and a writer thread streams
//! the encoded chunks to the GGUF file while the next blocks are read or generated.

use std::sync::mpsc::{sync_channel, SyncSender};

use rayon::prelude::*;
use spark_gguf::{quant, GgmlType, GgufError, GgufWriter};

use crate::error::{Error, Result};
use crate::progress::Progress;

/// Elements per block of rows handled at once (bounds the converter's working memory).
pub const BLOCK_ELEMS: usize = 1 << 22;

/// Encoded chunks that may wait for the writer thread.
const QUEUE_CHUNKS: usize = 8;

/// Rows per block for rows of `cols` elements.
pub fn block_rows(cols: usize) -> usize {
    (BLOCK_ELEMS / cols.max(1)).max(1)
}

/// Where producers put encoded tensor data, in file order.
pub struct ChunkSink<'a> {
    tx: SyncSender<Vec<u8>>,
    progress: &'a Progress,
}

/// The error a producer sees when the writer thread has stopped (its own error is reported).
fn writer_stopped() -> Error {
    Error::Internal("the GGUF writer stopped".into())
}

impl ChunkSink<'_> {
    /// Queues `bytes` (the next bytes of the current tensor) for the writer.
    pub fn send(&self, bytes: Vec<u8>) -> Result<()> {
        self.progress.add_bytes(bytes.len() as u64);
        self.tx.send(bytes).map_err(|_| writer_stopped())
    }

    /// Encodes whole rows (`data.len()` a multiple of `cols`) as `ty`, in parallel over groups
    /// of rows, and queues the bytes in order.
    pub fn send_rows(&self, ty: GgmlType, data: &[f32], cols: usize) -> Result<()> {
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
            self.send(e?)?;
        }
        Ok(())
    }
}

/// Runs `produce` (which queues every tensor's data in plan order) while a second thread writes
/// the queue to `w`; then finishes the file. Any error leaves nothing at the output path.
pub fn write_pipelined(
    mut w: GgufWriter,
    progress: &Progress,
    produce: impl FnOnce(&ChunkSink<'_>) -> Result<()>,
) -> Result<u64> {
    let (tx, rx) = sync_channel::<Vec<u8>>(QUEUE_CHUNKS);
    let (produced, written) = std::thread::scope(|s| {
        let writer = s.spawn(move || -> Result<GgufWriter> {
            for bytes in rx {
                w.write_tensor_chunk(&bytes)?;
            }
            Ok(w)
        });
        let sink = ChunkSink { tx, progress };
        let produced = produce(&sink);
        drop(sink);
        let written = writer
            .join()
            .unwrap_or_else(|_| Err(Error::Internal("the GGUF writer thread panicked".into())));
        (produced, written)
    });
    // The writer's own error explains a producer's "writer stopped".
    let w = written?;
    produced?;
    let bytes = w.bytes_written();
    w.finish()?;
    Ok(bytes)
}
