use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n], seed: u64) -> [f32; n] {
        dropout(x, seed)
    }
}

fn main() {}
