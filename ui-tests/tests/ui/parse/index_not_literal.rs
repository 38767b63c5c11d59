use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n], w: [f32; 3], i: u32) -> [f32; n] {
        x * w[i]
    }
}

fn main() {}
