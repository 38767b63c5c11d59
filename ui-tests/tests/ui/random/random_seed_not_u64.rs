use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n], seed: i64) -> [f32; n] {
        x + rand(seed)
    }
}

fn main() {}
