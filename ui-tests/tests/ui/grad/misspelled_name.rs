use fuse_runtime::fuse;

fuse! {
    #[vjp(x, wieght)]
    fn rmsnorm(x: [f32; rows, cols], weight: [f32; cols]) -> [f32; rows, cols] {
        x * rsqrt(mean(x * x, cols) + 1e-6) * weight
    }
}

fn main() {}
