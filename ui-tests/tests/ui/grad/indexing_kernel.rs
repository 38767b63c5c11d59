use fuse_runtime::fuse;

fuse! {
    #[vjp(x)]
    fn f(x: [f32; n], w: [f32; 3]) -> [f32; n] {
        x * w[1]
    }
}

fn main() {}
