use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; rows, cols]) -> [f32; rows] {
        x * 2.0
    }
}

fn main() {}
