use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; t, 2 * d]) -> [f32; t, d] {
        x[..d, ..d]
    }
}

fn main() {}
