use fuse_runtime::fuse;

fuse! {
    fn f(i: [i32; n]) -> [i32; n] {
        i + 1.5
    }
}

fn main() {}
