use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; t, 2 * h + p], c: [f32; h]) -> [f32; t, h] {
        x[.., h..]
    }
}

fn main() {}
