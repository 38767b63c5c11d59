use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; t, 2 * d], at: [f32; t]) -> [f32; t] {
        x[.., at]
    }
}

fn main() {}
