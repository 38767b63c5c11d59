use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n]) -> u32 {
        argmax(x)
    }
}

fn main() {}
