use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n]) -> [f32; n] {
        for i in 0..3 {}
        x
    }
}

fn main() {}
