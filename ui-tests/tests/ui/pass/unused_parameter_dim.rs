//! Issue 22: a tensor parameter that nothing uses, over a dim that appears nowhere else, once
//! failed inside the expansion ("cannot find value `c2`"). It compiles, and its buffer binds the
//! dim.
use fuse_runtime::{fuse, Device};

fuse! {
    fn f(x: [f32; t, e], k_dim: [u8; k]) -> [f32; t, e] { x }
}

fn main() -> Result<(), fuse_runtime::Error> {
    let dev = Device::cpu();
    let x = dev.upload(&[1.5f32, -2.0, 3.25, 0.5, 7.0, -1.0])?.reshape(&[2, 3])?;
    let k_dim = dev.upload(&[1u8, 2, 3, 4, 5])?;
    assert_eq!(f(&dev, &x, &k_dim)?.to_vec()?, x.to_vec()?);
    Ok(())
}
