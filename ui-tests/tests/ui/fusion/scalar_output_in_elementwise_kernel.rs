use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n], a: f32) -> ([f32; n], f32) {
        (x * 2.0, a)
    }
}

fn main() {}
