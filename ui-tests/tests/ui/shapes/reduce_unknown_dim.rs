use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; rows, cols]) -> [f32; rows] {
        sum(x, colz)
    }
}

fn main() {}
