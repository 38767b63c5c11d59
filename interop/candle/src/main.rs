//! fuse inside candle: a `CustomOp1` whose `cuda_fwd` runs a `fuse!` RMSNorm kernel on candle's
//! own storage, on candle's own stream (no copy, no synchronization), and whose `cpu_fwd` runs
//! fuse's CPU backend. It is compared with the same RMSNorm written in candle's ops, alone and
//! in a chain candle op -> fuse op -> candle op run many times with no host synchronization.
//!
//! Built outside the workspace (candle-core's CUDA feature needs `nvcc` when building):
//! `interop/candle/build.sh`. Run: `candle` (the GPU if there is one, else the CPU).

use candle_core::backend::BackendStorage;
use candle_core::{
    CpuStorage, CudaStorage, CustomOp1, Device as CandleDevice, Layout, Shape, Tensor, D,
};
use fuse_runtime::{fuse, BufferView, BufferViewMut, Device};

fuse! {
    /// RMSNorm of each row, without a weight.
    pub fn rmsnorm(x: [f32; rows, cols]) -> [f32; rows, cols] {
        x * rsqrt(mean(x * x, cols) + 1e-6)
    }
}

/// RMSNorm over the last dim as a candle op, run by fuse.
struct FuseRmsNorm;

/// A candle error from a fuse error.
fn fused(e: fuse_runtime::Error) -> candle_core::Error {
    candle_core::Error::Msg(format!("fuse: {e}"))
}

/// The rows and columns of a contiguous tensor's layout, and its element range in the storage.
fn rows_cols(layout: &Layout) -> candle_core::Result<(usize, usize, usize, usize)> {
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle_core::bail!("FuseRmsNorm needs a contiguous tensor: call .contiguous() first")
    };
    let dims = layout.dims();
    let cols = *dims.last().unwrap_or(&1);
    Ok(((end - start) / cols.max(1), cols, start, end))
}

impl CustomOp1 for FuseRmsNorm {
    fn name(&self) -> &'static str {
        "fuse-rmsnorm"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (rows, cols, start, end) = rows_cols(layout)?;
        let CpuStorage::F32(data) = storage else {
            candle_core::bail!("FuseRmsNorm takes f32")
        };
        let cpu = Device::cpu();
        let x = cpu
            .upload(&data[start..end])
            .and_then(|x| x.reshape(&[rows, cols]))
            .map_err(fused)?;
        let y = rmsnorm(&cpu, &x).and_then(|y| y.to_vec()).map_err(fused)?;
        Ok((CpuStorage::F32(y), layout.shape().clone()))
    }

    fn cuda_fwd(
        &self,
        storage: &CudaStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let (rows, cols, start, end) = rows_cols(layout)?;
        let candle = storage.device().clone();
        // candle's stream: the kernel queues after candle's work on the input, and candle's next
        // op queues after it.
        let dev = Device::from_cuda_stream(candle.cuda_stream()).map_err(fused)?;
        let input = storage.as_cuda_slice::<f32>()?;
        let input = input.slice(start..end);
        let mut out = candle.alloc_zeros::<f32>(end - start)?;
        {
            let x = BufferView::<f32>::new(&dev, &input, &[rows, cols]).map_err(fused)?;
            let mut y = BufferViewMut::<f32>::new(&dev, &mut out, &[rows, cols]).map_err(fused)?;
            rmsnorm::into(&dev, &x, &mut y).map_err(fused)?;
        }
        Ok((
            CudaStorage::wrap_cuda_slice(out, candle),
            layout.shape().clone(),
        ))
    }
}

/// RMSNorm in candle's own ops.
fn candle_rmsnorm(x: &Tensor) -> candle_core::Result<Tensor> {
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    x.broadcast_div(&(ms + 1e-6)?.sqrt()?)
}

fn max_diff(a: &Tensor, b: &Tensor) -> candle_core::Result<f32> {
    (a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()
}

fn main() -> candle_core::Result<()> {
    let device = CandleDevice::cuda_if_available(0)?;
    println!("candle device: {device:?}");
    let x = Tensor::randn(0f32, 2.0, (97, 1031), &device)?;
    // An offset into the storage: the op sees a narrowed, contiguous view.
    let x = x.narrow(0, 3, 90)?.contiguous()?;
    let ours = x.apply_op1(FuseRmsNorm)?;
    let theirs = candle_rmsnorm(&x)?;
    let one = max_diff(&ours, &theirs)?;
    println!("fuse RMSNorm as a candle op against candle's ops: largest difference {one:.2e}");

    // candle op -> fuse op -> candle op, 200 times, nothing read back until the end.
    let (mut a, mut b) = (x.clone(), x.clone());
    for _ in 0..200 {
        a = (a.apply_op1(FuseRmsNorm)? * 1.5)?.tanh()?;
        b = (candle_rmsnorm(&b)? * 1.5)?.tanh()?;
    }
    let chain = max_diff(&a, &b)?;
    println!("200 chained candle -> fuse -> candle steps: largest difference {chain:.2e}");
    if one > 1e-5 || chain > 1e-4 {
        candle_core::bail!("the results disagree")
    }
    println!("ok");
    Ok(())
}
