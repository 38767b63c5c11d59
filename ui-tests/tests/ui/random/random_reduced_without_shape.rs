use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n], seed: u64) -> f32 {
        sum(rand(seed))
    }
}

fn main() {}
