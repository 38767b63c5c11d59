use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n], y: [f32; m]) -> f32 {
        sum(x) + sum(y)
    }
}

fn main() {}
