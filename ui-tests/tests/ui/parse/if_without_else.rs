use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n]) -> [f32; n] {
        if x > 0.0 { x }
    }
}

fn main() {}
