//! Issue 22: a KV-cache write (rows scattered to slots, negative slots skipped) and a
//! concatenation, through `&mut` parameters, with no returned output.
use fuse_runtime::{fuse, Device};

fuse! {
    fn cache_rows(key: [f32; t, d], slot: [i64; t], cache: &mut [f32; slots, d]) {
        cache[slot, ..] = key;
    }
    fn concat(a: [f32; t, d], b: [f32; t, d], out: &mut [f32; t, 2 * d]) {
        out[.., ..d] = a;
        out[.., d..] = b
    }
}

fn main() -> Result<(), fuse_runtime::Error> {
    let dev = Device::cpu();
    let key = dev.upload(&[1.0f32, 2.0, 3.0, 4.0])?.reshape(&[2, 2])?;
    let slot = dev.upload(&[2i64, -1])?;
    let mut cache = dev.upload(&[0.5f32; 6])?.reshape(&[3, 2])?;
    let () = cache_rows(&dev, &key, &slot, &mut cache)?;
    assert_eq!(cache.to_vec()?, [0.5, 0.5, 0.5, 0.5, 1.0, 2.0]);
    let mut out = dev.upload(&[0.0f32; 8])?.reshape(&[2, 4])?;
    concat(&dev, &key, &key, &mut out)?;
    assert_eq!(out.to_vec()?, [1.0, 2.0, 1.0, 2.0, 3.0, 4.0, 3.0, 4.0]);
    Ok(())
}
