use fuse_runtime::fuse;

fuse! {
    fn f(x: [f32; n]) -> [f32; n] {
        exq(x)
    }
    fn g(y: [f64; n]) -> [f64; n] {
        yy * 2.0
    }
    fn h(a: [f32; n], b: [f64; n]) -> [f32; n] {
        a + b
    }
}

fn main() {}
