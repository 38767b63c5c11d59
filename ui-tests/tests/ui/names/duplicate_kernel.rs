use fuse_runtime::fuse;

fuse! {
    fn scale(x: [f32; n]) -> [f32; n] {
        x * 2.0
    }
    fn scale(x: [f32; n]) -> [f32; n] {
        x * 3.0
    }
}

fn main() {}
