use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n], w: [f32; 3]) -> [f32; n] {
        x * (w * 2.0)[1]
    }
}

fn main() {}
