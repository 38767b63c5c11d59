use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; rows, cols], g: [f32; cols]) -> f32 {
        sum(g, rows)
    }
}

fn main() {}
