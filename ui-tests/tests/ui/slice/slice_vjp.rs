use fuse_runtime::fuse;

fuse! {
    #[vjp(x)]
    fn f(x: [f32; t, 2 * d]) -> [f32; t, d] {
        x[.., ..d] * x[.., d..]
    }
}

fn main() {}
