use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n, c], cache: &mut [f32; m, c], i: [u32; n]) {
        cache[i, ..] = x / sum(x, c);
    }
}

fn main() {}
