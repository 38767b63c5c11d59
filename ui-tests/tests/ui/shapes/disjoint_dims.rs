use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; a, b], y: [f32; b, a], z: [f32; c]) -> f32 {
        sum(y * z)
    }
}

fn main() {}
