use fuse_runtime::fuse;

fuse! {
    fn f(a: [f32; m], b: [f32; n]) -> [f32; m] {
        a * b
    }
}

fn main() {}
