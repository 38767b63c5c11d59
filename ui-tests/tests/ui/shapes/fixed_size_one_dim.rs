use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; b, s, h], bias: [f32; 1, s, h]) -> [f32; b, s, h] {
        x + bias
    }
}

fn main() {}
