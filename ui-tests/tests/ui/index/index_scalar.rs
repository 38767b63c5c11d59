use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n], s: f32) -> [f32; n] {
        x * s[0]
    }
}

fn main() {}
