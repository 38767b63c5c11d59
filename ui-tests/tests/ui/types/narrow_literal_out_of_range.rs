use fuse_runtime::fuse;

fuse! {
    fn f(x: [i8; n]) -> [i8; n] {
        x + 200
    }
}

fn main() {}
