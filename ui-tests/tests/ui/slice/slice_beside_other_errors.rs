use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; t, 2 * d]) -> [f32; t, d] {
        x[.., ..k] + exq(x[.., d..])
    }

    fn g(y: [f32; n]) -> [f32; n] {
        y + 1.5i32
    }
}

fn main() {}
