use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n, n]) -> f32 {
        sum(x)
    }
}

fn main() {}
