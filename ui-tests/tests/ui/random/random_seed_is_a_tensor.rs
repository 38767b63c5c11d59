use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n], seed: [u64; n]) -> [f32; n] {
        x + randn(seed)
    }
}

fn main() {}
