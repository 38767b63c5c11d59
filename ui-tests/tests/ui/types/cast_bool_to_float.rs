use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n]) -> [f32; n] {
        (x > 0.0) as f32
    }
}

fn main() {}
