use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; m, c], cache: &mut [f32; m, c]) {
        cache[.., ..] = cache * 2.0 + x;
    }
}

fn main() {}
