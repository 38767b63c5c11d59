use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n]) -> bool {
        sum(x > 0.0)
    }
}

fn main() {}
