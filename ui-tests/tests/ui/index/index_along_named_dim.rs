use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n]) -> f32 {
        x[0]
    }
}

fn main() {}
