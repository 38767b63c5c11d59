use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n]) -> [f64; n] {
        x * 2.0
    }
}

fn main() {}
