use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n], y: [f32; m]) -> [f32; n] {
        x + sum(y)
    }
}

fn main() {}
