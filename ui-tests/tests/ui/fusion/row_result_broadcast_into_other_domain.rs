use fuse_runtime::fuse;

fuse! {
    // The sums are over rows of `[a, c]`; the output is over `[a, b]`, another domain.
    fn shift(x: [f32; a, b], y: [f32; a, c]) -> [f32; a, b] {
        x - sum(y, c)
    }
}

fn main() {}
