use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; r, c], i: [u32; n], j: [u32; n]) -> [f32; n] {
        x[i, j]
    }
}

fn main() {}
