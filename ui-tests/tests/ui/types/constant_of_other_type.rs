use fuse_runtime::fuse;

fuse! {
    fn f(x: [f64; n]) -> [f64; n] {
        x.min(f32::MAX)
    }
}

fn main() {}
