use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n], w: [f32; 2, 3]) -> [f32; n] {
        x * w[1]
    }
}

fn main() {}
