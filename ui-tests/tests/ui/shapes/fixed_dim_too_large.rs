use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; 99999999999999999999]) -> f32 {
        sum(x)
    }
}

fn main() {}
