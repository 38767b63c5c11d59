use fuse_runtime::fuse;

fuse! {
    fn f(x: [i32; n]) -> [i32; n] {
        x + 1usize
    }
}

fn main() {}
