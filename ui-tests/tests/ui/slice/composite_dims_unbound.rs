use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; t, h + p]) -> [f32; t, h] {
        x[.., ..h]
    }
}

fn main() {}
