use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; rows, cols]) -> ([f32; rows], [f32; cols]) {
        (sum(x, cols), sum(x, rows))
    }
}

fn main() {}
