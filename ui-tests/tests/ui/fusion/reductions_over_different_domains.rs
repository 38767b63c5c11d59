use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; r, c], y: [f32; k, c]) -> ([f32; r], [f32; k]) {
        (sum(x, c), sum(y, c))
    }
}

fn main() {}
