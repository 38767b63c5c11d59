//! A crate that links the CUDA libraries through cudarc (`dynamic-linking`) and uses fuse beside
//! it: `.ci/run` builds it, so a crate graph with candle-core's `cuda` feature keeps building.
//! It is built, not linked into a program: linking needs the CUDA libraries, which CI lacks.

use fuse_runtime::{fuse, Buffer, Device, Error};

fuse! {
    /// The sum of squares of each row.
    pub fn row_norm2(x: [f32; rows, cols]) -> [f32; rows] {
        sum(x * x, cols)
    }
}

/// Runs [`row_norm2`] on memory cudarc allocated on its own stream, without a copy.
pub fn norms_of(
    stream: std::sync::Arc<cudarc::driver::CudaStream>,
    rows: usize,
    cols: usize,
) -> Result<Vec<f32>, Error> {
    let dev = Device::from_cuda_stream(stream.clone())?;
    let x = stream
        .alloc_zeros::<f32>(rows * cols)
        .map_err(|e| Error::Internal {
            detail: e.to_string(),
        })?;
    let x: Buffer<f32> = Buffer::from_cuda_slice(&dev, x, &[rows, cols])?;
    row_norm2(&dev, &x)?.to_vec()
}
