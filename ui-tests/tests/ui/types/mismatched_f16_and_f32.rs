use fuse_runtime::fuse;

fuse! {
    fn f(x: [f16; n], y: [f32; n]) -> [f16; n] {
        x + y
    }
}

fn main() {}
