use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; rows, cols]) -> [f32; rows, cols] {
        x * cols
    }
}

fn main() {}
