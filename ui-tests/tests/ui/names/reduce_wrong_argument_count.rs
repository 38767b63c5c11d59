use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; r, c]) -> f32 {
        sum()
    }
}

fn main() {}
