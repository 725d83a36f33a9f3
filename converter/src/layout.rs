//! Strided views that turn a checkpoint array into a GGUF tensor's rows.
//!
//! A GGUF tensor with ggml dims `[ne0, ne1]` is stored as `ne1` rows of `ne0` elements, i.e. a
//! numpy array of shape `[ne1, ne0]`. Every mapping the converter needs (slices, transposes,
//! head reshapes) is an affine index map from that output `[rows, cols]` into the source array:
//! the row index and the column index are each split into C-order digits, and each digit has a
//! source stride. [`View::read_rows`] gathers a block of rows, decoding the source dtype to f32.

use rayon::prelude::*;

/// Element type of the source bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceDtype {
    /// Little-endian f32.
    F32,
    /// Little-endian IEEE f16.
    F16,
    /// Little-endian bfloat16.
    BF16,
}

impl SourceDtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            SourceDtype::F32 => 4,
            SourceDtype::F16 | SourceDtype::BF16 => 2,
        }
    }

    /// The element at index `i` of `src`, as f32.
    #[inline(always)]
    pub fn get(self, src: &[u8], i: usize) -> f32 {
        match self {
            SourceDtype::F32 => {
                let b = &src[4 * i..4 * i + 4];
                f32::from_le_bytes([b[0], b[1], b[2], b[3]])
            }
            SourceDtype::F16 => {
                half::f16::from_bits(u16::from_le_bytes([src[2 * i], src[2 * i + 1]])).to_f32()
            }
            SourceDtype::BF16 => {
                f32::from_bits(u32::from(u16::from_le_bytes([src[2 * i], src[2 * i + 1]])) << 16)
            }
        }
    }

    /// Decodes `out.len()` consecutive elements starting at element `start`.
    pub fn decode_run(self, src: &[u8], start: usize, out: &mut [f32]) {
        let s = self.size();
        let bytes = &src[start * s..(start + out.len()) * s];
        match self {
            SourceDtype::F32 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                    *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            SourceDtype::F16 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
                }
            }
            SourceDtype::BF16 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16);
                }
            }
        }
    }
}

/// An affine map from output `[rows, cols]` into a source array's flat element index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    /// Source element index of output (0, 0).
    pub base: usize,
    /// Row digits, outermost first: (extent, source stride).
    pub row_dims: Vec<(usize, usize)>,
    /// Column digits, outermost first: (extent, source stride).
    pub col_dims: Vec<(usize, usize)>,
    /// Add 1 to every value (Gemma norms store `scale`, GGUF stores `1 + scale`).
    pub add_one: bool,
}

fn offsets(dims: &[(usize, usize)], start: usize, end: usize) -> Vec<usize> {
    (start..end)
        .map(|mut i| {
            let mut off = 0;
            for &(extent, stride) in dims.iter().rev() {
                off += (i % extent) * stride;
                i /= extent;
            }
            off
        })
        .collect()
}

impl View {
    /// A contiguous `[rows, cols]` block starting at element `base`.
    pub fn contiguous(base: usize, rows: usize, cols: usize) -> View {
        View {
            base,
            row_dims: vec![(rows, cols)],
            col_dims: vec![(cols, 1)],
            add_one: false,
        }
    }

    /// The transpose of a contiguous `[src_rows, src_cols]` block at `base`: output row j is
    /// source column j (output shape `[src_cols, src_rows]`).
    pub fn transposed(base: usize, src_rows: usize, src_cols: usize) -> View {
        View {
            base,
            row_dims: vec![(src_cols, 1)],
            col_dims: vec![(src_rows, src_cols)],
            add_one: false,
        }
    }

    /// Output rows.
    pub fn rows(&self) -> usize {
        self.row_dims.iter().map(|d| d.0).product()
    }

    /// Output columns (ggml ne0).
    pub fn cols(&self) -> usize {
        self.col_dims.iter().map(|d| d.0).product()
    }

    /// One past the largest source index the view touches (0 if it is empty).
    pub fn source_extent(&self) -> usize {
        if self.rows() == 0 || self.cols() == 0 {
            return 0;
        }
        let max: usize = self
            .row_dims
            .iter()
            .chain(&self.col_dims)
            .map(|&(e, s)| (e - 1) * s)
            .sum();
        self.base + max + 1
    }

    /// Whether consecutive columns are consecutive source elements.
    fn cols_contiguous(&self) -> bool {
        self.col_dims.last().is_some_and(|&(_, s)| s == 1)
    }

    /// Gathers output rows `r0..r1` into `out` (length `(r1 - r0) * cols`), in parallel over
    /// groups of rows. `src` must hold at least [`View::source_extent`] elements.
    pub fn read_rows(&self, src: &[u8], dtype: SourceDtype, r0: usize, r1: usize, out: &mut [f32]) {
        let cols = self.cols();
        debug_assert_eq!(out.len(), (r1 - r0) * cols);
        let col_off = offsets(&self.col_dims, 0, cols);
        let single_run = self.col_dims.len() == 1 && self.cols_contiguous();
        let group = if self.cols_contiguous() { 16 } else { 256 };
        out.par_chunks_mut(group * cols.max(1))
            .enumerate()
            .for_each(|(g, chunk)| {
                let a = r0 + g * group;
                let b = a + chunk.len() / cols.max(1);
                let row_off = offsets(&self.row_dims, a, b);
                if self.cols_contiguous() {
                    for (row, &ro) in chunk.chunks_exact_mut(cols).zip(&row_off) {
                        if single_run {
                            dtype.decode_run(src, self.base + ro, row);
                        } else {
                            for (o, &co) in row.iter_mut().zip(&col_off) {
                                *o = dtype.get(src, self.base + ro + co);
                            }
                        }
                    }
                } else {
                    for (c, &co) in col_off.iter().enumerate() {
                        for (i, &ro) in row_off.iter().enumerate() {
                            chunk[i * cols + c] = dtype.get(src, self.base + ro + co);
                        }
                    }
                }
                if self.add_one {
                    for x in chunk.iter_mut() {
                        *x += 1.0;
                    }
                }
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn read_all(view: &View, src: &[u8], dt: SourceDtype) -> Vec<f32> {
        let mut out = vec![0f32; view.rows() * view.cols()];
        view.read_rows(src, dt, 0, view.rows(), &mut out);
        out
    }

    #[test]
    fn transposes_and_slices() {
        // src [3, 4] = 0..12
        let src: Vec<f32> = (0..12).map(|x| x as f32).collect();
        let b = f32_bytes(&src);
        let t = View::transposed(0, 3, 4);
        assert_eq!((t.rows(), t.cols()), (4, 3));
        assert_eq!(
            read_all(&t, &b, SourceDtype::F32),
            vec![0., 4., 8., 1., 5., 9., 2., 6., 10., 3., 7., 11.]
        );
        // rows 1..3 of the source, transposed: [4, 2]
        let t2 = View::transposed(4, 2, 4);
        assert_eq!(
            read_all(&t2, &b, SourceDtype::F32),
            vec![4., 8., 5., 9., 6., 10., 7., 11.]
        );
        assert_eq!(t2.source_extent(), 12);
        let c = View::contiguous(4, 2, 4);
        let mut part = vec![0f32; 4];
        c.read_rows(&b, SourceDtype::F32, 1, 2, &mut part);
        assert_eq!(part, vec![8., 9., 10., 11.]);
    }

    #[test]
    fn head_reshape_matches_numpy() {
        // q_einsum [N=2, D=3, H=2] -> out [N*H, D] with out[n*H + h, d] = q[n, d, h].
        let (n, d, h) = (2usize, 3usize, 2usize);
        let src: Vec<f32> = (0..n * d * h).map(|x| x as f32).collect();
        let v = View {
            base: 0,
            row_dims: vec![(n, d * h), (h, 1)],
            col_dims: vec![(d, h)],
            add_one: false,
        };
        let out = read_all(&v, &f32_bytes(&src), SourceDtype::F32);
        for ni in 0..n {
            for hi in 0..h {
                for di in 0..d {
                    assert_eq!(out[(ni * h + hi) * d + di], src[ni * d * h + di * h + hi]);
                }
            }
        }
    }

    #[test]
    fn decodes_half_types_and_adds_one() {
        let vals = [0.5f32, -2.0, 1.25, 3.0];
        let f16: Vec<u8> = vals
            .iter()
            .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
            .collect();
        let bf16: Vec<u8> = vals
            .iter()
            .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
            .collect();
        let mut v = View::contiguous(0, 1, 4);
        assert_eq!(read_all(&v, &f16, SourceDtype::F16), vals);
        assert_eq!(read_all(&v, &bf16, SourceDtype::BF16), vals);
        v.add_one = true;
        assert_eq!(
            read_all(&v, &bf16, SourceDtype::BF16),
            vec![1.5, -1.0, 2.25, 4.0]
        );
        assert_eq!(SourceDtype::BF16.get(&bf16, 2), 1.25);
    }

    #[test]
    fn large_blocks_split_across_groups_agree_with_a_direct_gather() {
        let (r, c) = (37usize, 300usize);
        let src: Vec<f32> = (0..r * c).map(|x| (x as f32).sin()).collect();
        let b = f32_bytes(&src);
        let t = View::transposed(0, r, c);
        let mut out = vec![0f32; 100 * r];
        t.read_rows(&b, SourceDtype::F32, 150, 250, &mut out);
        for j in 0..100 {
            for i in 0..r {
                assert_eq!(out[j * r + i], src[i * c + 150 + j]);
            }
        }
    }
}
