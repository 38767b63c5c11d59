use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n, 3]) -> f32 {
        x[0][1]
    }
}

fn main() {}
