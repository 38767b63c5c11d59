use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; rows, cols], g: [f32; cols]) -> ([f32; rows], [f32; cols]) {
        (sum(x, cols), g * 2.0)
    }
}

fn main() {}
