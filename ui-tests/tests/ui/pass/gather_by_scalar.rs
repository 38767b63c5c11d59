//! Issue 22: `w[i]` by a scalar, and `x[0]` along a named dim, once errors ("an index is an
//! integer literal", "indexed along `n`"): gathers, which read zero past the end.
use fuse_runtime::{fuse, Device};

fuse! {
    fn f(x: [f32; n], w: [f32; 3], i: u32) -> [f32; n] {
        x * w[i] + x[0]
    }
}

fn main() -> Result<(), fuse_runtime::Error> {
    let dev = Device::cpu();
    let x = dev.upload(&[1.5f32, 2.0])?;
    let w = dev.upload(&[3.0f32, 4.0, 5.0])?;
    assert_eq!(f(&dev, &x, &w, 2)?.to_vec()?, [9.0, 11.5]);
    assert_eq!(f(&dev, &x, &w, 3)?.to_vec()?, [1.5, 1.5]);
    Ok(())
}
