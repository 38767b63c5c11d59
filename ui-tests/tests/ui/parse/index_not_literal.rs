use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n], w: [f32; 3, 4], i: u32) -> [f32; n] {
        x * w[i][0]
    }
}

fn main() {}
