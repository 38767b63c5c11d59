use fuse_runtime::fuse;

fuse! {
    fn f(i: [i32; n]) -> [i32; n] {
        i + i32::EPSILON
    }
}

fn main() {}
