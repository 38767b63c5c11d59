use fuse_runtime::fuse;

fuse! {
    fn f(x: [u32; n]) -> [u32; n] {
        -x
    }
}

fn main() {}
