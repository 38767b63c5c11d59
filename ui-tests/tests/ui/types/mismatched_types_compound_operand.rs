use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n], y: [f64; n]) -> [f32; n] {
        x + y * 2.0
    }
}

fn main() {}
