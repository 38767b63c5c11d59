use fuse_runtime::fuse;

fuse! {
    #[vjp(x)]
    #[vjp(y)]
    fn product(x: [f32; n], y: [f32; n]) -> [f32; n] {
        x * y
    }
}

fn main() {}
