use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n], cache: &[f32; n]) {
        cache[..] = x;
    }
}

fn main() {}
