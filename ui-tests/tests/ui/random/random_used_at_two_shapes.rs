use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; rows, cols], b: [f32; rows], seed: u64) -> ([f32; rows, cols], [f32; rows]) {
        let u = rand(seed);
        (x * u, b + u)
    }
}

fn main() {}
