use fuse_runtime::fuse;

fuse! {
    fn double(x: [f32; n]) -> [f32; n] {
        x * 2.0
    }
    fn quadruple(x: [f32; n]) -> [f32; n] {
        double(double(x))
    }
}

fn main() {}
