use fuse_runtime::fuse;

fuse! {
    fn f(input: [f32; n]) -> [f32; n] {
        inptu * 2.0
    }
}

fn main() {}
