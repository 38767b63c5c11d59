//! fuse inside candle: a `CustomOp1` whose `cuda_fwd` runs a `fuse!` RMSNorm kernel on candle's
//! own storage, on candle's own stream (no copy, no synchronization), and whose `cpu_fwd` runs
//! fuse's CPU backend. It is compared with the same RMSNorm written in candle's ops, alone and
//! in a chain candle op -> fuse op -> candle op run many times with no host synchronization.
//! Its backward is the kernel's `#[vjp(x)]`, a second op that hands candle the gradient fuse
//! allocated (`into_cuda_slice`, no copy); candle's autograd through it is compared with
//! candle's autograd through its own ops.
//!
//! Built outside the workspace (candle-core's CUDA feature needs `nvcc` when building):
//! `interop/candle/build.sh`. Run: `candle` (the GPU if there is one, else the CPU).

use candle_core::backend::BackendStorage;
use candle_core::{
    CpuStorage, CudaStorage, CustomOp1, CustomOp2, Device as CandleDevice, Layout, Shape, Tensor,
    Var, D,
};
use fuse_runtime::{fuse, BufferView, BufferViewMut, Device};

fuse! {
    /// RMSNorm of each row, without a weight; `rmsnorm::vjp` is its gradient.
    #[vjp(x)]
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

    fn bwd(
        &self,
        arg: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(FuseRmsNorm::gradient(arg, grad_res)?))
    }
}

impl FuseRmsNorm {
    /// The gradient of the op at `x` given the gradient of its result: `rmsnorm::vjp`, as a
    /// candle op of its own.
    fn gradient(x: &Tensor, dy: &Tensor) -> candle_core::Result<Tensor> {
        x.contiguous()?
            .apply_op2_no_bwd(&dy.contiguous()?, &FuseRmsNormGrad)
    }
}

/// `rmsnorm::vjp`: the gradient of `FuseRmsNorm` at its first argument, given the gradient of
/// its result as the second.
struct FuseRmsNormGrad;

impl CustomOp2 for FuseRmsNormGrad {
    fn name(&self) -> &'static str {
        "fuse-rmsnorm-grad"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        lx: &Layout,
        dy: &CpuStorage,
        ldy: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (rows, cols, start, end) = rows_cols(lx)?;
        let (_, _, dy_start, dy_end) = rows_cols(ldy)?;
        let (CpuStorage::F32(x), CpuStorage::F32(dy)) = (x, dy) else {
            candle_core::bail!("FuseRmsNormGrad takes f32")
        };
        let cpu = Device::cpu();
        let up = |v: &[f32]| cpu.upload(v).and_then(|b| b.reshape(&[rows, cols]));
        let dx = up(&x[start..end])
            .and_then(|x| rmsnorm::vjp(&cpu, &x, &up(&dy[dy_start..dy_end])?))
            .and_then(|g| g.x.to_vec())
            .map_err(fused)?;
        Ok((CpuStorage::F32(dx), lx.shape().clone()))
    }

    fn cuda_fwd(
        &self,
        x: &CudaStorage,
        lx: &Layout,
        dy: &CudaStorage,
        ldy: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let (rows, cols, start, end) = rows_cols(lx)?;
        let (_, _, dy_start, dy_end) = rows_cols(ldy)?;
        let candle = x.device().clone();
        let dev = Device::from_cuda_stream(candle.cuda_stream()).map_err(fused)?;
        let xs = x.as_cuda_slice::<f32>()?.slice(start..end);
        let dys = dy.as_cuda_slice::<f32>()?.slice(dy_start..dy_end);
        let xv = BufferView::<f32>::new(&dev, &xs, &[rows, cols]).map_err(fused)?;
        let dyv = BufferView::<f32>::new(&dev, &dys, &[rows, cols]).map_err(fused)?;
        let grads = rmsnorm::vjp(&dev, &xv, &dyv).map_err(fused)?;
        // fuse allocated the gradient on candle's stream: candle takes the allocation over.
        let dx = grads
            .x
            .into_cuda_slice::<f32>()
            .map_err(|rejected| fused(rejected.error))?;
        Ok((
            CudaStorage::wrap_cuda_slice(dx, candle),
            lx.shape().clone(),
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

    // Gradients: candle's autograd through the fuse op (its `bwd` is `rmsnorm::vjp`) and
    // through candle's own ops, of the same loss.
    let xv = Var::from_tensor(&x)?;
    let dy = Tensor::randn(0f32, 1.0, x.shape(), &device)?;
    let ours = (xv.apply_op1(FuseRmsNorm)? * &dy)?.sum_all()?.backward()?;
    let theirs = (candle_rmsnorm(&xv)? * &dy)?.sum_all()?.backward()?;
    let (Some(g1), Some(g2)) = (ours.get(&xv), theirs.get(&xv)) else {
        candle_core::bail!("autograd gave no gradient of x")
    };
    let grad = max_diff(g1, g2)?;
    println!("gradient through fuse's vjp against candle's autograd: largest difference {grad:.2e}");
    if one > 1e-5 || chain > 1e-4 || grad > 1e-4 {
        candle_core::bail!("the results disagree")
    }
    println!("ok");
    Ok(())
}
