//! Issue 22: the constants of the element types, `round_ties_even` and constant indexing read
//! like Rust and compute as Rust does.
use fuse_runtime::{fuse, Device};

fuse! {
    fn f(x: [f32; n], w: [f32; 3]) -> ([f32; n], [f32; n], [u32; n]) {
        (
            x.clamp(f32::MIN, f32::MAX) * w[0] + w[2],
            round_ties_even(x),
            if x.is_nan() { u32::MAX } else { 0 },
        )
    }
}

fn main() -> Result<(), fuse_runtime::Error> {
    let dev = Device::cpu();
    let x = dev.upload(&[2.5f32, -0.5, f32::INFINITY, f32::NAN])?;
    let w = dev.upload(&[2.0f32, 100.0, 1.0])?;
    let (y, r, nan) = f(&dev, &x, &w)?;
    let y = y.to_vec()?;
    assert_eq!(y[..2], [6.0, 0.0]);
    assert_eq!(y[2], f32::INFINITY, "f32::MAX * 2 overflows");
    assert!(y[3].is_nan());
    assert_eq!(r.to_vec()?[..3], [2.0, -0.0, f32::INFINITY]);
    assert_eq!(nan.to_vec()?, [0, 0, 0, u32::MAX]);
    Ok(())
}
