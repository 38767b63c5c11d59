use fuse_runtime::fuse;

fuse! {
    #[fast_math(on)]
    fn f(x: [f32; n]) -> [f32; n] {
        x.exp()
    }
}

fn main() {}
