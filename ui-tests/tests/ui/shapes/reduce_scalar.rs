use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n], a: f32) -> f32 {
        sum(a)
    }
}

fn main() {}
