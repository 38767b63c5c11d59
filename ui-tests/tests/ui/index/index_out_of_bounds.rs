use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n], w: [f32; 3]) -> [f32; n] {
        x * w[0] + w[3]
    }
}

fn main() {}
