use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; rows, cols], y: [f32; cols, rows]) -> [f32; rows, cols] {
        x + y
    }
}

fn main() {}
