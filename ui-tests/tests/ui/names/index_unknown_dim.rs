use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; rows, cols]) -> [u32; rows, cols] {
        index(colz) + (x > 0.0) as u32
    }
}

fn main() {}
