use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; rows, cols]) -> f32 {
        max(sum(x, cols), rows)
    }
}

fn main() {}
