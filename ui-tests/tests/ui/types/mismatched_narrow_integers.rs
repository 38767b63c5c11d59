use fuse_runtime::fuse;

fuse! {
    fn f(a: [u8; n], b: [i16; n]) -> [i16; n] {
        a + b
    }
}

fn main() {}
